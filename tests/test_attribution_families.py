"""Attribution -> metric families: names, labels, and every family documented in the README."""

from __future__ import annotations

from dataclasses import replace

from exporter.metrics.exposition import TEXT, Exposition
from exporter.metrics.families import BuildInfo, attribution_families, snapshot_families
from exporter.model import (
    Allocation,
    Attribution,
    CollectorStatus,
    GpuIdentity,
    GpuSample,
    KubernetesStatus,
    PodIdentity,
    PodUsage,
    Snapshot,
    Unattributed,
    WatchStatus,
)
from tests.helpers import ROOT, series, value

GPU0 = GpuIdentity(0, "GPU-0000", "NVIDIA L4")
GPU1 = GpuIdentity(1, "GPU-1111", "NVIDIA L4")
POD = PodIdentity("ml", "infer-0", "uid-1", "infer", "StatefulSet", (("label_team", "vision"),))
IDLE = PodIdentity("lab", "notebook", "uid-2", "notebook", "Pod")
TRAINER = PodIdentity("ml", "train-0", "uid-3", "train", "StatefulSet")
ATTRIBUTION = Attribution(
    node="gpu-node-1",
    pods=(IDLE, POD, TRAINER),
    usage=(
        PodUsage(POD, "server", GPU0, 3 * 2**30, 0.25, 12.5, 2),
        PodUsage(IDLE, "jupyter", GPU0, 0, 0.0, 0.0, 0),
        PodUsage(TRAINER, "main", GPU1, 2**30, 0.5, 1.0, 1),
    ),
    allocations=(
        Allocation(POD, "server", "nvidia.com/gpu", GPU0, in_use=True, shared=True),
        Allocation(IDLE, "jupyter", "nvidia.com/gpu", GPU0, in_use=False, shared=True),
        Allocation(TRAINER, "main", "nvidia.com/gpu", GPU1, True, False, "train-0-gpu-x7k2p", "ml"),
    ),
    unattributed=(Unattributed(GPU0, 1, 2**30),),
    kubernetes=KubernetesStatus(
        (WatchStatus("pods", False, 31.5, 200), WatchStatus("resourceslices", True, 0.0, 2)),
        pods_cached=200,
        dra_devices=9,
    ),
)


def render(attribution: Attribution | None) -> str:
    snapshot = Snapshot(
        timestamp=1.0,
        gpus=(GpuSample(GPU0, up=True),),
        collectors=(
            CollectorStatus("nvml", True, 0.001),
            CollectorStatus("kubernetes", False, 0.0),
        ),
        attribution=attribution,
    )
    return (
        Exposition(lambda: snapshot_families(snapshot, BuildInfo("1.0"))).render(TEXT).body.decode()
    )


def test_pod_series_carry_pod_workload_and_gpu_labels() -> None:
    text = render(ATTRIBUTION)
    labels = {
        "gpu": "0",
        "uuid": "GPU-0000",
        "model": "NVIDIA L4",
        "namespace": "ml",
        "pod": "infer-0",
        "container": "server",
        "workload": "infer",
        "workload_kind": "StatefulSet",
    }
    assert value(text, "gpu_pod_memory_used_bytes", **labels) == 3 * 2**30
    assert value(text, "gpu_pod_utilization_ratio", **labels) == 0.25
    assert value(text, "gpu_pod_busy_seconds_total", **labels) == 12.5
    assert value(text, "gpu_allocation_info", resource="nvidia.com/gpu", **labels) == 1
    assert value(text, "gpu_allocation_in_use", pod="notebook") == 0
    assert value(text, "gpu_allocation_in_use", pod="infer-0") == 1
    assert value(text, "gpu_allocation_shared", pod="notebook") == 1
    (info,) = series(text, "gpu_pod_info", pod="infer-0")
    assert dict(info) == {
        "namespace": "ml",
        "pod": "infer-0",
        "workload": "infer",
        "workload_kind": "StatefulSet",
        "node": "gpu-node-1",
        "revision": "",
        "label_team": "vision",
    }
    assert value(text, "gpu_unattributed_processes", gpu="0") == 1
    assert value(text, "gpu_unattributed_memory_used_bytes", gpu="0") == 2**30
    assert value(text, "gpuscope_kubernetes_watch_up", resource="pods") == 0
    assert value(text, "gpuscope_kubernetes_cache_age_seconds", resource="pods") == 31.5
    assert value(text, "gpuscope_kubernetes_watch_up", resource="resourceslices") == 1
    assert value(text, "gpuscope_kubernetes_cache_age_seconds", resource="resourceslices") == 0
    assert value(text, "gpuscope_pods_cached") == 200
    assert value(text, "gpuscope_dra_devices") == 9


def test_a_claim_names_itself_on_the_info_series_only() -> None:
    text = render(ATTRIBUTION)
    (info,) = series(text, "gpu_allocation_info", pod="train-0")
    assert dict(info)["claim"] == "train-0-gpu-x7k2p"
    assert dict(info)["claim_namespace"] == "ml"
    assert dict(info)["resource"] == "nvidia.com/gpu"
    for family in ("gpu_allocation_in_use", "gpu_allocation_shared"):
        (labels,) = series(text, family, pod="train-0")
        assert {name for name, _ in labels} == {name for name, _ in info} - {
            "claim",
            "claim_namespace",
        }, family
    (plugin,) = series(text, "gpu_allocation_info", pod="notebook")
    assert "claim" not in dict(plugin), "a device plugin's allocation names no claim"


def test_without_dra_there_is_no_resourceslice_watch_nor_device_count() -> None:
    text = render(
        replace(ATTRIBUTION, kubernetes=KubernetesStatus(ATTRIBUTION.kubernetes.watches[:1], 200))
    )
    assert set(series(text, "gpuscope_kubernetes_watch_up")) == {frozenset({("resource", "pods")})}
    assert series(text, "gpuscope_dra_devices") == {}


def test_nothing_when_attribution_is_off() -> None:
    assert list(attribution_families(None)) == []
    assert "gpu_pod" not in render(None)


def test_no_cache_age_before_the_first_list() -> None:
    empty = Attribution(
        "n", (), (), (), (), KubernetesStatus((WatchStatus("pods", False, None, 0),), pods_cached=0)
    )
    assert series(render(empty), "gpuscope_kubernetes_cache_age_seconds") == {}


def test_every_attribution_family_is_documented_in_the_metrics_reference() -> None:
    readme = (ROOT / "docs" / "reference" / "metrics.md").read_text()
    names = {
        line.split()[2] for line in render(ATTRIBUTION).splitlines() if line.startswith("# TYPE")
    }
    assert "gpu_pod_busy_seconds_total" in names
    undocumented = sorted(name for name in names if f"| `{name}` |" not in readme)
    assert not undocumented, f"add these to the metrics reference: {undocumented}"
