"""dcgm-exporter's answers in gpuscope's shape, on plain data: who holds a device in either label
form, MIG instances, the resource names, the selection, and what the history says it lacks."""

from __future__ import annotations

import pytest

from exporter.rightsize.dcgm_history import DCGM_SIGNALS, render_dcgm
from exporter.rightsize.dcgm_shape import Cluster, device_id, holder, translate
from exporter.rightsize.prometheus import Sample
from exporter.rightsize.selection import Selection

pytestmark = pytest.mark.timeout(30)

MIG = {
    "UUID": "GPU-parent",
    "GPU_I_ID": "3",
    "GPU_I_PROFILE": "1g.10gb",
    "modelName": "NVIDIA A100-SXM4-80GB",
    "namespace": "ml",
    "pod": "embed-0",
    "container": "main",
}


def cluster(**changes: object) -> Cluster:
    fields: dict[str, object] = {
        "requests": {("ml", "embed-0"): {("main", "nvidia_com_mig_1g_10gb")}},
        "owners": {("ml", "embed-0"): ("StatefulSet", "embed")},
        "cpu": {},
        "known": frozenset({"requests", "owners"}),
    }
    return Cluster(**(fields | changes))  # type: ignore[arg-type]


def test_the_holder_is_the_exported_pod_where_the_scrape_renamed_it() -> None:
    exported = {"namespace": "gpu-operator", "pod": "dcgm-exporter-1", "exported_pod": "a-0"}
    exported |= {"exported_namespace": "ml", "exported_container": "main"}
    assert holder(exported) == ("ml", "a-0", "main")
    assert holder({"namespace": "ml", "pod": "a-0", "container": "main"}) == ("ml", "a-0", "main")
    # A MIG instance's series carry its parent's UUID: the instance id tells them apart.
    assert device_id(MIG) == "GPU-parent/3"
    assert device_id({"UUID": "GPU-1"}) == "GPU-1"


def test_a_mig_instance_keeps_its_profile_and_the_resource_the_pod_asked_for() -> None:
    answers = {"held": [Sample(MIG, 2017.0)], "busy_mean": [Sample(MIG, 0.25)]}
    answers["busy_steps"] = [Sample(MIG, 2000.0)]
    shaped, limits = translate(
        answers, cluster(), selection=Selection(), window=7 * 86400, step=300, cluster_label=None
    )
    (held,) = shaped["held"]
    assert held.labels == {
        "namespace": "ml",
        "workload_kind": "StatefulSet",
        "workload": "embed",
        "pod": "embed-0",
        "uuid": "GPU-parent/3",
        "container": "main",
        "model": "NVIDIA A100-SXM4-80GB",
        "mig_profile": "1g.10gb",
        "resource": "nvidia.com/mig-1g.10gb",
    }
    # The mean over the observed steps, as gpuscope's busy seconds.
    (busy,) = shaped["busy_seconds"]
    assert busy.value == pytest.approx(0.25 * 2000 * 300)
    assert shaped["shared"] == []
    assert not any(text.startswith("GPU requests") for text in limits)


def test_without_gpu_requests_every_pod_on_a_series_holds_its_gpu_and_that_is_said() -> None:
    answers = {"held": [Sample(MIG, 10.0), Sample({"UUID": "GPU-free", "modelName": "x"}, 10.0)]}
    shaped, limits = translate(
        answers,
        cluster(requests={}, known=frozenset()),
        selection=Selection(),
        window=86400,
        step=300,
        cluster_label=None,
    )
    # The GPU with no pod on it is nobody's; the MIG pod counts, under its whole-GPU name.
    (held,) = shaped["held"]
    assert held.labels["pod"] == "embed-0"
    assert held.labels["resource"] == "nvidia.com/gpu"
    assert any(text.startswith("GPU requests (kube-state-metrics'") for text in limits)
    assert any(text.startswith("workload owners") for text in limits)
    # A namespace outside the selection is left out.
    other, _ = translate(
        answers,
        cluster(),
        selection=Selection(namespaces=("serving",)),
        window=86400,
        step=300,
        cluster_label=None,
    )
    assert other["held"] == []


def test_each_signal_reads_both_versions_names_in_one_unit() -> None:
    queries = {
        signal.name: render_dcgm(
            signal, window=7 * 86400, step=300, quantile=0.95, cluster_label="cluster"
        )
        for signal in DCGM_SIGNALS
    }
    busy = queries["busy_quantile"]
    assert "avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m]) * 0.01" in busy
    assert "avg_over_time(DCGM_FI_DEV_GPU_UTIL_RATIO[5m])" in busy
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in busy, "MIG instances have no utilization"
    assert busy.startswith("max by (cluster, UUID, GPU_I_ID, GPU_I_PROFILE, modelName,")
    assert "quantile_over_time(0.95, " in busy
    memory = queries["memory_peak"]
    assert "max_over_time(DCGM_FI_DEV_FB_USED[5m]) * 1.04858e+06" not in memory
    assert "max_over_time(DCGM_FI_DEV_FB_USED[5m]) * 1048576.0 or" in memory
    assert "max_over_time(DCGM_FI_DEV_FB_USED_BYTES[5m])" in memory
    assert "[7d:5m]" in memory
    assert "{" not in "".join(queries.values()).replace("{__name__", "")


def test_profiling_means_become_seconds_active_per_gpu() -> None:
    whole = {k: v for k, v in MIG.items() if not k.startswith("GPU_I")}
    answers = {
        "held": [Sample(whole, 100.0)],
        "sm_quantile": [Sample(whole, 0.4)],
        "tensor_mean": [Sample(whole, 0.3)],
        "dram_mean": [Sample(whole, 0.6)],
    }
    shaped, limits = translate(
        answers,
        cluster(requests={("ml", "embed-0"): {("main", "nvidia_com_gpu")}}),
        selection=Selection(),
        window=86400,
        step=300,
        cluster_label=None,
    )
    assert shaped["sm_quantile"] == [Sample({"uuid": "GPU-parent"}, 0.4)]
    assert shaped["tensor_seconds"] == [Sample({"uuid": "GPU-parent"}, 0.3 * 100 * 300)]
    assert shaped["dram_seconds"] == [Sample({"uuid": "GPU-parent"}, 0.6 * 100 * 300)]
    assert "tensor_mean" not in shaped
    assert not any(text.startswith("SM activity") for text in limits)
