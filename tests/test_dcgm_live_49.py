"""`gpuscope serve --compat.dcgm --compat.dcgm-version=4.9` scraped by a real Prometheus, as
tests/test_dcgm_live.py scrapes 4.8's shapes: the demo node (a GPU two inference services
time-share, an MPS card, a MIG-split GPU, a GPU that falls off the bus), scraped by job
`gpuscope` (honor_labels, the chart's relabelings) and job `dcgm-plain` (no honor_labels).

NVIDIA's dashboard's queries, updated to dcgm-exporter 4.9.0's names and units (the clock panel
no longer multiplies MHz by 1e6, utilization is a 0-1 ratio, memory is in bytes), and a Kruize
query grouped by the lower-case `hostname` must return gpuscope's own numbers; none of 4.8's
renamed names is stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pytest

from dashboards.live import Node
from exporter.dcgm_counters import RENAMED_IN_49
from tests.dcgm_scrapes import (
    HONOR,
    INSTANCE,
    PLAIN,
    WINDOW,
    Scraped,
    TwoScrapes,
    assert_panel_shows,
    by,
    chart_relabelings,
    own_series,
    substitute,
)
from tests.demo_node import FLEET, demo_cluster
from tests.fake_kube.pods import NODE
from tests.helpers import eventually, require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DASHBOARD_49: Final = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP_CELSIUS{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP_CELSIUS{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_BOARD_POWER_WATTS{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_BOARD_POWER_WATTS{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK_HERTZ{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL_RATIO{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED_BYTES{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization": (
        'DCGM_FI_PROF_TENSOR_UTIL_RATIO{instance=~"$instance", gpu=~"$gpu"}'
    ),
}
"""NVIDIA's dashboard 12239's panels (tests/test_dcgm_live.py's `DASHBOARD`) in 4.9.0's names;
its panels' units become hertz, percentunit and bytes."""


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    require_tool("prometheus")
    relabelings = tuple(chart_relabelings())
    flags = ("--compat.dcgm", "--compat.dcgm-version=4.9")
    node = Node("sim-a", FLEET, flags, cluster=demo_cluster)
    stack = TwoScrapes(
        [node], tmp_path_factory.mktemp("dcgm-live-49"), rule_files=(), relabelings=relabelings
    )
    with stack:
        stack.wait_for_scrapes(10)
        complete = (
            f'timestamp(count(DCGM_FI_PROF_TENSOR_UTIL_RATIO{{job="{HONOR}"}}) == 7 '
            f'and count(DCGM_FI_PROF_TENSOR_UTIL_RATIO{{job="{PLAIN}"}}) == 7)'
        )
        at = eventually(lambda: stack.prometheus.value(complete), 30, "a scrape with every series")
        yield Scraped(stack.prometheus, at)


def dashboard_gpus(prometheus: Scraped) -> str:
    """The `gpu` variable with All selected: `label_values(DCGM_FI_DEV_GPU_TEMP_CELSIUS, gpu)`."""
    answer = prometheus.series("DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    return "|".join(sorted({series["gpu"] for series in answer["data"]}))


def test_the_dashboards_variables_find_the_node_and_its_gpus(prometheus: Scraped) -> None:
    answer = prometheus.series("DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    assert answer["status"] == "success"
    assert {series["instance"] for series in answer["data"]} == {INSTANCE, "sim-a-plain:9455"}
    assert {series["gpu"] for series in answer["data"]} >= {"0", "1", "2", "3", "4", "6", "7"}


@pytest.mark.parametrize("panel", list(DASHBOARD_49))
def test_every_dashboard_panel_in_49s_names_shows_gpuscopes_numbers(
    prometheus: Scraped, panel: str
) -> None:
    gpus = dashboard_gpus(prometheus)
    expr = substitute(DASHBOARD_49[panel], gpus)
    assert_panel_shows(prometheus, panel, expr, own_series(gpus)[panel])


@pytest.mark.parametrize("job", [PLAIN, HONOR])
def test_kruize_by_hostname_in_49s_names(prometheus: Scraped, job: str) -> None:
    labels = ("hostname", "device", "modelName", "UUID", "exported_container", "exported_namespace")
    expr = (
        f"avg by ({','.join(labels)}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO"
        f'{{exported_namespace="train",exported_container="main",job="{job}"}}[{WINDOW}]))'
    )
    trainer = by(prometheus, expr, *labels)
    assert {key[0] for key in trainer} == {NODE}, "hostname, lower case"
    assert {key[1] for key in trainer} >= {"nvidia0", "nvidia3"}
    (gpu0,) = [key for key in trainer if key[1] == "nvidia0"]
    (own,) = by(
        prometheus,
        f'avg_over_time(gpu_utilization_ratio{{gpu="0",job="{job}",gpu_instance=""}}[{WINDOW}])',
    ).values()
    assert trainer[gpu0] == pytest.approx(own, rel=1e-6)


def test_49s_labels_and_none_of_48s_names_are_stored(prometheus: Scraped) -> None:
    drivers = by(
        prometheus,
        f'count by (DCGM_FI_SYSTEM_DRIVER_VERSION) (DCGM_FI_DEV_GPU_TEMP_CELSIUS{{job="{HONOR}"}})',
        "DCGM_FI_SYSTEM_DRIVER_VERSION",
    )
    assert all(version for (version,) in drivers), drivers
    renamed = "|".join(RENAMED_IN_49)
    for expr in (
        f'count({{__name__=~"{renamed}"}})',
        'count({__name__=~"DCGM_FI_.+",Hostname!=""})',
        'count({__name__=~"DCGM_FI_.+",DCGM_FI_DRIVER_VERSION!=""})',
    ):
        answer = prometheus.query(expr)
        assert answer["status"] == "success"
        assert answer["data"]["result"] == [], expr


def test_fb_capacity_is_gpuscopes_total(prometheus: Scraped) -> None:
    capacity = by(
        prometheus,
        f'DCGM_FI_DEV_FB_CAPACITY_BYTES{{job="{HONOR}",GPU_I_ID=""}}',
        "gpu",
    )
    total = by(prometheus, f'gpu_memory_total_bytes{{job="{HONOR}",gpu_instance=""}}', "gpu")
    assert set(capacity) <= set(total)
    assert capacity
    for gpu, number in capacity.items():
        assert number == total[gpu], gpu
