"""Dynamic Resource Allocation as a user runs it: `gpuscope serve --simulate FILE` as a subprocess
against the DRA node (tests/attributed_node.py): the stand-in API server serving the node's pods,
ResourceSlices, ResourceClaims and NVIDIA's DeviceClasses, a real gRPC kubelet reporting the
claims' devices beside a device plugin's, and a procfs putting the processes in their pods."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.attributed_node import (
    DRA_UUIDS,
    MIG_SLICE,
    MIG_UUIDS,
    WHOLE_SLICE,
    Node,
    dra_node,
    dra_slices,
)
from tests.helpers import assert_promtool_accepts, running_daemon, series, value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
GPU = "nvidia.com/gpu"
TRAINER = {"pod": "trainer-0", "container": "main"}
INFER_A = {"pod": "infer-7d9c8b6f5-aaaaa", "container": "server"}
INFER_B = {"pod": "infer-7d9c8b6f5-bbbbb", "container": "server"}
TINY = {"pod": "tiny-0", "container": "server"}
BIG = {"pod": "big-0", "container": "main"}
NOTEBOOK = {"pod": "notebook", "container": "jupyter"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with dra_node(tmp_path) as node:
        yield node


def info(text: str, **labels: str) -> dict[str, str]:
    (found,) = series(text, "gpu_allocation_info", **labels)
    return dict(found)


def all_held(text: str) -> bool:
    return len(series(text, "gpu_allocation_info")) == 6


def named(text: str) -> bool:
    """Every allocation held, the claims' under their DeviceClass's resource name: the kubelet
    poller names them at its next round (a second) once the ResourceSlices are listed, which
    under load can come after the slices' devices are first joined."""
    return all_held(text) and bool(series(text, "gpu_allocation_info", resource=GPU, **TRAINER))


def test_every_allocation_through_claims_and_the_device_plugin_is_right(node: Node) -> None:
    with running_daemon(*node.args, "--collect.interval=200ms") as daemon:
        daemon.wait_ready()
        daemon.metrics_until(named, 60, "six allocations, the claims' named")
        text = daemon.wait_cycles(3)

    # GPU 0 through a claim made from a template: the DeviceClass's extended resource name
    trainer = info(text, **TRAINER)
    assert trainer["uuid"] == DRA_UUIDS[0]
    assert (trainer["resource"], trainer["claim"], trainer["claim_namespace"]) == (
        GPU,
        "trainer-0-gpu-x7k2p",
        "train",
    )
    assert (trainer["workload"], trainer["workload_kind"]) == ("trainer", "StatefulSet")
    assert value(text, "gpu_allocation_in_use", **TRAINER) == 1
    assert value(text, "gpu_allocation_shared", **TRAINER) == 0

    # GPU 1: one claim reserved for two pods is a shared GPU, each holder's use its own
    for holder, in_use in ((INFER_A, 1), (INFER_B, 0)):
        labels = info(text, **holder)
        assert (labels["uuid"], labels["claim"], labels["resource"]) == (
            DRA_UUIDS[1],
            "shared-infer",
            GPU,
        )
        assert labels["workload"] == "infer"
        assert value(text, "gpu_allocation_shared", **holder) == 1
        assert value(text, "gpu_allocation_in_use", **holder) == in_use
    assert value(text, "gpu_pod_memory_used_bytes", **INFER_A) == 20 * 2**30
    assert value(text, "gpu_pod_memory_used_bytes", **INFER_B) == 0

    # GPU 2's MIG devices: a static one by the UUID its slice names, a DynamicMIG one (no UUID)
    # by its parent and profile; the MIG class has no extended resource: the driver's name
    tiny = info(text, **TINY)
    assert (tiny["uuid"], tiny["mig_profile"], tiny["resource"], tiny["claim"]) == (
        MIG_UUIDS[2],
        "1g.10gb",
        "gpu.nvidia.com",
        "tiny-mig",
    )
    assert value(text, "gpu_allocation_in_use", **TINY) == 1
    big = info(text, **BIG)
    assert (big["uuid"], big["mig_profile"], big["claim"]) == (MIG_UUIDS[0], "3g.40gb", "big-mig")
    assert value(text, "gpu_allocation_in_use", **BIG) == 1

    # GPU 3 from the device plugin, on the same node: as before, no claim
    notebook = info(text, **NOTEBOOK)
    assert (notebook["uuid"], notebook["resource"]) == (DRA_UUIDS[3], GPU)
    assert "claim" not in notebook
    assert value(text, "gpu_allocation_in_use", **NOTEBOOK) == 0

    # claim labels on gpu_allocation_info only
    for family in ("gpu_allocation_in_use", "gpu_allocation_shared"):
        assert not [labels for labels in series(text, family) if ("claim", "tiny-mig") in labels]
    assert value(text, "gpuscope_kubernetes_watch_up", resource="pods") == 1
    assert value(text, "gpuscope_kubernetes_watch_up", resource="resourceslices") == 1
    assert value(text, "gpuscope_kubernetes_cache_age_seconds", resource="resourceslices") == 0
    assert value(text, "gpuscope_dra_devices") == 3 + 4
    for collector in ("kubernetes", "podresources", "cgroups"):
        assert value(text, "gpuscope_collector_success", collector=collector) == 1, collector
    assert_promtool_accepts(text)


def test_slices_deleted_and_a_pool_regenerated_while_running(node: Node) -> None:
    def mig_held(text: str) -> bool:
        return bool(series(text, "gpu_allocation_info", **TINY)) and bool(
            series(text, "gpu_allocation_info", **BIG)
        )

    def mig_gone(text: str) -> bool:
        return not series(text, "gpu_allocation_info", **TINY) and not series(
            text, "gpu_allocation_info", **BIG
        )

    with running_daemon(*node.args, "--collect.interval=200ms") as daemon:
        daemon.wait_ready()
        daemon.metrics_until(all_held, 60, "six allocations")
        # the MIG devices' slice is deleted: their claims' GPUs can no longer be named
        node.api.delete("resourceslices", "", MIG_SLICE)
        text = daemon.metrics_until(mig_gone, 30, "the MIG allocations gone")
        assert series(text, "gpu_allocation_info", **TRAINER), "the other slice's devices stay"
        assert value(text, "gpuscope_dra_devices") == 3
        # the driver regenerates its pool: generation 2 of the whole GPUs' slice comes first, and
        # a slice of generation 1 that comes back is stale: only the newest generation counts
        whole, mig = dra_slices(generation=2)
        node.api.put("resourceslices", whole)
        node.api.put("resourceslices", dra_slices(generation=1)[1])
        text = daemon.wait_cycles(5)
        assert mig_gone(text), "a slice of an older generation is not used"
        assert series(text, "gpu_allocation_info", **TRAINER)
        node.api.put("resourceslices", mig)
        text = daemon.metrics_until(mig_held, 30, "the MIG allocations back")
        assert value(text, "gpuscope_dra_devices") == 3 + 4
        # a whole slice deleted takes its claims' allocations, never the device plugin's
        node.api.delete("resourceslices", "", WHOLE_SLICE)
        text = daemon.metrics_until(
            lambda t: not series(t, "gpu_allocation_info", **TRAINER), 30, "the GPUs' slice gone"
        )
        assert series(text, "gpu_allocation_info", **NOTEBOOK)
        assert mig_held(text)


def test_a_cluster_without_the_resource_api_turns_dra_off_and_nothing_else(tmp_path: Path) -> None:
    with (
        dra_node(tmp_path, older_cluster=True) as node,
        running_daemon(*node.args, "--collect.interval=200ms") as daemon,
    ):
        daemon.wait_ready()
        text = daemon.metrics_until(
            lambda t: (
                bool(series(t, "gpu_allocation_info", **NOTEBOOK))
                and bool(series(t, "gpu_pod_memory_used_bytes", **INFER_A))
            ),
            60,
            "the device plugin's allocation and the pods' use",
        )
        text = daemon.wait_cycles(3)
        asked = [q for q in node.api.requests if "resource.k8s.io" in q]
    assert series(text, "gpu_allocation_info", claim="shared-infer") == {}, "claims unmapped"
    assert value(text, "gpu_allocation_in_use", **NOTEBOOK) == 0
    assert value(text, "gpu_pod_memory_used_bytes", **TRAINER) == 60 * 2**30, "use still shows"
    assert set(series(text, "gpuscope_kubernetes_watch_up")) == {frozenset({("resource", "pods")})}
    assert series(text, "gpuscope_dra_devices") == {}
    assert value(text, "gpuscope_collector_success", collector="kubernetes") == 1
    assert len(asked) == 1, "one list, answered 404, and no claim is ever read"
    off = [line for line in daemon.log_lines if "DRA is off" in line]
    assert len(off) == 1, daemon.log_lines
