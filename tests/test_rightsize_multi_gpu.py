"""A replica that never uses some of its GPUs, from gpuscope's own series on a real Prometheus:
a 2-GPU Job whose second GPU idles asks for one, an 8-GPU trainer using all of them keeps them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers import require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_run import rightsize
from tests.synthetic_history import FakeWorkload, Wave, backfill, write_openmetrics

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

END = 1_785_000_000.0
DAY = 86400.0
WORKLOADS = [
    FakeWorkload(
        "training",
        "finetune",
        kind="Job",
        gpus_per_pod=2,
        idle_gpus=1,
        busy=Wave(0.7, jitter=0.05),
        memory_gib=Wave(60),
    ),
    FakeWorkload(
        "training",
        "pretrain",
        kind="Job",
        gpus_per_pod=8,
        busy=Wave(0.95, jitter=0.03),
        memory_gib=Wave(74),
    ),
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("multi-gpu-prometheus")
    openmetrics = root / "history.om"
    with openmetrics.open("w") as out:
        write_openmetrics(out, WORKLOADS, end=END, duration=3 * DAY + 3600, interval=120)
    backfill(require_tool("promtool"), openmetrics, root / "data")
    openmetrics.unlink()
    with running_prometheus(root / "data") as url:
        yield url


def test_an_unused_second_gpu_is_given_back(prometheus: str) -> None:
    result = rightsize("--prometheus", prometheus, f"--end={END}", "--window=3d", "--format=json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    workloads = {w["workload"]: w for w in document["workloads"]}
    finetune, pretrain = workloads["finetune"], workloads["pretrain"]
    assert (finetune["action"], finetune["recommended"]) == ("fewer GPUs", "H100 SXM x1")
    assert (finetune["gpus_per_replica"], finetune["recommended_gpus"]) == (2, 1)
    assert finetune["patch"]["changes"] == ["nvidia.com/gpu: 2 -> 1"]
    assert finetune["savings_usd_per_month"] == pytest.approx(
        finetune["cost_current_usd_per_month"] / 2, abs=0.02
    )
    assert (pretrain["action"], pretrain["recommended_gpus"]) == ("keep", 8)
