"""dcgm-exporter's consumers against a real Prometheus scraping `gpuscope serve --compat.dcgm`.

The demo node of the dashboard tests (tests/demo_node.py: pods through the stand-in API server,
kubelet and procfs; a GPU two inference services time-share, an MPS card, a MIG-split GPU, a GPU
that falls off the bus) is scraped twice, as a ServiceMonitor would scrape it — the target
carrying the gpuscope pod's own `namespace`, `pod` and `container`:

- job `gpuscope`, `honor_labels: true` with the metric relabelings the chart renders for
  `compat.dcgmExportedLabels` (the chart's default scrape, plus `exported_*` for Kruize);
- job `dcgm-plain`, `honor_labels: false`: the scrape dcgm-exporter's chart makes by default,
  which renames the series' pod labels `exported_*`.

Then the queries of NVIDIA's dashboard, OpenCost, Kruize and a KEDA trigger run as those tools
write them (a job matcher added where the tool adds its own cluster filter) and must return the
right data: the same numbers as gpuscope's own series, per pod on the shared GPU, never the
gpuscope pod's own labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pytest

from dashboards.live import Node
from tests.dcgm_scrapes import (
    HONOR,
    INSTANCE,
    MIB,
    PLAIN,
    SHARED_GPU,
    SHARING_PODS,
    WINDOW,
    Scraped,
    TwoScrapes,
    assert_panel_shows,
    by,
    chart_relabelings,
    own_series,
    results,
    substitute,
)
from tests.demo_node import FLEET, demo_cluster
from tests.fake_kube.pods import NODE
from tests.helpers import eventually, require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    require_tool("prometheus")
    relabelings = tuple(chart_relabelings())
    node = Node("sim-a", FLEET, ("--compat.dcgm",), cluster=demo_cluster)
    stack = TwoScrapes(
        [node], tmp_path_factory.mktemp("dcgm-live"), rule_files=(), relabelings=relabelings
    )
    with stack:
        stack.wait_for_scrapes(10)
        complete = (
            f'timestamp(count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{job="{HONOR}"}}) == 7 '
            f'and count(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{job="{PLAIN}"}}) == 7)'
        )
        at = eventually(lambda: stack.prometheus.value(complete), 30, "a scrape with every series")
        yield Scraped(stack.prometheus, at)


# -- NVIDIA's dashboard (Grafana 12239) ---------------------------------------------------------

DASHBOARD: Final = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization": (
        'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}'
    ),
}


def dashboard_gpus(prometheus: Scraped) -> str:
    """The `gpu` variable with All selected: `label_values(DCGM_FI_DEV_GPU_TEMP, gpu)`."""
    answer = prometheus.series("DCGM_FI_DEV_GPU_TEMP")
    gpus = sorted({series["gpu"] for series in answer["data"]})
    return "|".join(gpus)


def test_the_dashboards_variables_find_the_node_and_its_gpus(prometheus: Scraped) -> None:
    answer = prometheus.series("DCGM_FI_DEV_GPU_TEMP")
    assert answer["status"] == "success"
    assert {series["instance"] for series in answer["data"]} == {INSTANCE, "sim-a-plain:9455"}
    assert {series["gpu"] for series in answer["data"]} >= {"0", "1", "2", "3", "4", "6", "7"}


@pytest.mark.parametrize("panel", list(DASHBOARD))
def test_every_dashboard_panel_shows_gpuscopes_numbers(prometheus: Scraped, panel: str) -> None:
    gpus = dashboard_gpus(prometheus)
    expected = own_series(gpus)[panel]
    scale = {"GPU Utilization": " * 100", "GPU Framebuffer Mem Used": f" / {MIB}"}
    assert_panel_shows(
        prometheus, panel, substitute(DASHBOARD[panel], gpus), expected + scale.get(panel, "")
    )


# -- OpenCost ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "scale", "own"),
    [
        # the demo node's trainer and shared GPU are H100s: GPM's graphics activity, and
        # nothing in its place while GPM has not two samples yet (the daemon's first cycle)
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0, "gpu_graphics_active_ratio"),
        ("DCGM_FI_DEV_GPU_UTIL", 100.0, "gpu_utilization_ratio"),
    ],
)
def test_opencost_usage_by_container(
    prometheus: Scraped, field: str, scale: float, own: str
) -> None:
    expr = (
        f'avg(avg_over_time({field}{{container!="",job="{HONOR}"}}[{WINDOW}])) '
        "by (container, pod, namespace)"
    )
    usage = by(prometheus, expr, "namespace", "pod", "container")
    assert ("gpuscope", "gpuscope-7xk2p", "gpuscope") not in usage, "never the exporter's own pod"
    assert {
        ("train", "llm-pretrain-0", "main"),
        ("serving", "chat-api-6b9f7c5d4-7xq2m", "server"),
        ("serving", "embedder-5c8d9f7b6-k4t8p", "server"),
        ("lab", "notebook-ana", "jupyter"),
        ("serving", "ranker-0", "server"),
    } <= set(usage)
    device = by(
        prometheus,
        f'avg_over_time({own}{{job="{HONOR}",gpu_instance=""}}[{WINDOW}])',
        "gpu",
    )
    assert usage["train", "llm-pretrain-0", "main"] == pytest.approx(scale * device["0",], rel=1e-6)
    assert usage["lab", "notebook-ana", "jupyter"] == 0, "held idle"
    shared = [usage["serving", pod, "server"] for pod in sorted(SHARING_PODS)]
    assert all(part > 0 for part in shared)
    assert sum(shared) <= scale * device[SHARED_GPU,] * (1 + 1e-6), "the pods share one device"
    rest = by(
        prometheus,
        f'avg_over_time({field}{{gpu="{SHARED_GPU}",pod="",job="{HONOR}"}}[{WINDOW}])',
    )
    (remainder,) = rest.values()
    assert sum(shared) + remainder == pytest.approx(scale * device[SHARED_GPU,], rel=1e-5)


def test_opencost_device_queries(prometheus: Scraped) -> None:
    labels = ("device", "modelName", "UUID", "GPU_I_PROFILE", "GPU_I_ID")
    group = ", ".join(labels)
    power = by(
        prometheus,
        f'avg(avg_over_time(DCGM_FI_DEV_POWER_USAGE{{job="{HONOR}"}}[{WINDOW}])) by ({group})',
        *labels,
    )
    assert all(key[0].startswith("nvidia") and key[2].startswith("GPU-") for key in power)
    memory = by(
        prometheus,
        f'avg(avg_over_time(DCGM_FI_DEV_FB_USED{{job="{HONOR}"}}[{WINDOW}])) by ({group})',
        *labels,
    )
    mig = [key for key in memory if key[3]]
    assert {key[3] for key in mig} >= {"3g.40gb", "1g.10gb"}, "MIG instances apart"


# -- Kruize --------------------------------------------------------------------------------------

KRUIZE_GPU: Final = (
    "avg by (Hostname,device,modelName,UUID,exported_container,exported_namespace) "
    '(avg_over_time({field}{{exported_namespace="{namespace}",exported_container="{container}"'
    ',job="{job}"}}[{window}]))'
)


@pytest.mark.parametrize("job", [PLAIN, HONOR])
def test_kruize_gpu_usage_by_container_with_exported_labels(prometheus: Scraped, job: str) -> None:
    labels = ("Hostname", "device", "modelName", "UUID", "exported_container", "exported_namespace")
    kwargs = {"job": job, "window": WINDOW}
    trainer = by(
        prometheus,
        KRUIZE_GPU.format(
            field="DCGM_FI_DEV_GPU_UTIL", namespace="train", container="main", **kwargs
        ),
        *labels,
    )
    assert {key[0] for key in trainer} == {NODE}, "Hostname, capitalised"
    assert {key[1] for key in trainer} >= {"nvidia0", "nvidia3"}
    copy = by(
        prometheus,
        KRUIZE_GPU.format(
            field="DCGM_FI_DEV_MEM_COPY_UTIL", namespace="train", container="main", **kwargs
        ),
        *labels,
    )
    assert set(copy) == set(trainer)
    (gpu0,) = [key for key in copy if key[1] == "nvidia0"]
    (own,) = by(
        prometheus,
        f'avg_over_time(gpu_memory_utilization_ratio{{gpu="0",job="{job}",gpu_instance=""}}'
        f"[{WINDOW}]) * 100",
    ).values()
    assert copy[gpu0] == pytest.approx(own, rel=1e-6)
    serving = by(
        prometheus,
        KRUIZE_GPU.format(
            field="DCGM_FI_DEV_GPU_UTIL", namespace="serving", container="server", **kwargs
        ),
        "device",
    )
    label = "exported_pod" if job == PLAIN else "pod"
    parts = by(
        prometheus,
        f'avg_over_time(DCGM_FI_DEV_GPU_UTIL{{gpu="{SHARED_GPU}",job="{job}",{label}!=""}}'
        f"[{WINDOW}])",
        label,
    )
    assert set(parts) == {(pod,) for pod in SHARING_PODS}
    assert serving[f"nvidia{SHARED_GPU}",] == pytest.approx(sum(parts.values()) / 2, rel=1e-6), (
        "Kruize averages the two serving pods' own parts of the shared GPU"
    )


@pytest.mark.parametrize("job", [PLAIN, HONOR])
def test_kruize_framebuffer_by_uuid(prometheus: Scraped, job: str) -> None:
    (uuid,) = by(prometheus, f'gpu_info{{gpu="0",job="{HONOR}",gpu_instance=""}}', "uuid")
    expr = (
        "avg by (Hostname,device,GPU_I_PROFILE,modelName,UUID) "
        f'(avg_over_time(DCGM_FI_DEV_FB_USED{{UUID="{uuid[0]}",job="{job}"}}[{WINDOW}]))'
    )
    (used,) = by(prometheus, expr, "Hostname", "device").items()
    (own,) = by(
        prometheus,
        f'avg_over_time(gpu_memory_used_bytes{{uuid="{uuid[0]}",job="{HONOR}"}}[{WINDOW}]) / {MIB}',
    ).values()
    assert used[0] == (NODE, "nvidia0")
    assert used[1] == pytest.approx(own, rel=1e-6)


def test_kruize_openshift_profile(prometheus: Scraped) -> None:
    expr = (
        'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace != "", exported_container != "",'
        f' exported_pod != "", job="{PLAIN}"}}[{WINDOW}])) by (modelName, exported_container,'
        " exported_namespace, exported_pod, Hostname)"
    )
    pods = by(prometheus, expr, "exported_pod")
    assert {(pod,) for pod in SHARING_PODS} <= set(pods)
    assert ("gpuscope-7xk2p",) not in pods


def test_without_honor_labels_the_series_carry_the_exporters_pod_and_exported_ones(
    prometheus: Scraped,
) -> None:
    found = results(prometheus, f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",job="{PLAIN}"}}')
    ((metric, _),) = found
    assert metric["pod"] == "gpuscope-7xk2p"
    assert metric["exported_pod"] == "llm-pretrain-0"
    found = results(prometheus, f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",job="{HONOR}"}}')
    ((metric, _),) = found
    assert (metric["pod"], metric["exported_pod"]) == ("llm-pretrain-0", "llm-pretrain-0")
    (device,) = results(prometheus, f'DCGM_FI_DEV_GPU_TEMP{{gpu="{SHARED_GPU}",job="{HONOR}"}}')
    assert not {"pod", "namespace", "container", "exported_pod"} & set(device[0]), (
        "a device series: no pod, and not the gpuscope pod's either"
    )


# -- KEDA -----------------------------------------------------------------------------------------


def test_keda_trigger_by_pod(prometheus: Scraped) -> None:
    expr = f'avg(DCGM_FI_DEV_GPU_UTIL{{namespace!="",pod!="",job="{HONOR}"}}) by (pod)'
    busy = by(prometheus, expr, "pod")
    assert {(pod,) for pod in SHARING_PODS} | {("llm-pretrain-0",)} <= set(busy)
    assert ("gpuscope-7xk2p",) not in busy
    assert all(0 <= number <= 100 for number in busy.values())
    device = by(prometheus, f'gpu_utilization_ratio{{gpu="{SHARED_GPU}",job="{HONOR}"}} * 100')
    shared = [busy[pod,] for pod in sorted(SHARING_PODS)]
    assert 0 < sum(shared) <= next(iter(device.values())) * (1 + 1e-6), "parts of one device"
