"""Pod attribution as a user runs it: `gpuscope serve --simulate FILE` as a subprocess, with
--path.procfs at the fixture tree, a kubeconfig pointing at the stand-in API server and a real
gRPC pod-resources socket."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.attributed_node import FLEET, GPU, UUIDS, Node, attributed, attributed_node
from tests.fake_kube.pods import NODE
from tests.helpers import (
    CYCLES,
    assert_promtool_accepts,
    daemon_command,
    running_daemon,
    samples,
    series,
    value,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.slow
GIB = 2**30


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with attributed_node(tmp_path, "--kubernetes.pod-labels=team") as node:
        yield node


def test_shared_and_idle_gpus_are_attributed_per_pod(node: Node) -> None:
    with running_daemon(*node.args, "--collect.interval=200ms") as daemon:
        daemon.wait_ready()
        daemon.metrics_until(attributed, 60, "attribution")
        # five more cycles: utilization windows and the busy counters have something to show
        text = daemon.wait_cycles(5)

    # GPU 0 is time-sliced between two pods: each gets its own memory and utilization
    a = {"gpu": "0", "pod": "infer-a-7d9c8b6f5-x2x9q", "container": "server"}
    b = {"gpu": "0", "pod": "infer-b-0", "container": "server"}
    assert value(text, "gpu_pod_memory_used_bytes", **a) == 12 * GIB
    assert value(text, "gpu_pod_memory_used_bytes", **b) == 20 * GIB
    assert 0.2 < value(text, "gpu_pod_utilization_ratio", **a) < 0.4
    assert 0.4 < value(text, "gpu_pod_utilization_ratio", **b) < 0.6
    assert value(text, "gpu_pod_busy_seconds_total", **a) > 0
    assert value(text, "gpu_allocation_shared", **a) == 1
    assert value(text, "gpu_allocation_in_use", **b) == 1
    ((labels, _),) = series(text, "gpu_allocation_info", **a).items()
    assert dict(labels)["workload"] == "infer-a"
    assert dict(labels)["workload_kind"] == "Deployment"
    assert dict(labels)["uuid"] == UUIDS[0]

    # GPU 1 is held by a notebook that runs nothing: allocated, zero use
    idle = {"gpu": "1", "pod": "notebook", "container": "jupyter"}
    assert value(text, "gpu_allocation_info", resource=GPU, **idle) == 1
    assert value(text, "gpu_allocation_in_use", **idle) == 0
    assert value(text, "gpu_allocation_shared", **idle) == 0
    assert value(text, "gpu_pod_memory_used_bytes", **idle) == 0
    assert value(text, "gpu_pod_utilization_ratio", **idle) == 0

    # GPU 2 (allocated as nvidia2): a CronJob's trainer, a DaemonSet's agent, a stray process
    trainer = {
        "gpu": "2",
        "pod": "train-29471040-q8x7z",
        "workload": "train",
        "workload_kind": "CronJob",
    }
    assert value(text, "gpu_allocation_in_use", **trainer) == 1
    assert value(text, "gpu_pod_memory_used_bytes", **trainer) == 40 * GIB
    agent = {"gpu": "2", "pod": "gpu-monitor-7xk2p", "workload_kind": "DaemonSet"}
    assert value(text, "gpu_pod_memory_used_bytes", **agent) == GIB
    assert value(text, "gpu_unattributed_processes", gpu="2") == 1
    assert value(text, "gpu_unattributed_memory_used_bytes", gpu="2") == 2 * GIB
    assert value(text, "gpu_unattributed_processes", gpu="0") == 0

    assert (
        value(text, "gpu_pod_info", pod="infer-a-7d9c8b6f5-x2x9q", node=NODE, label_team="vision")
        == 1
    )
    assert series(text, "gpu_pod_info", pod="elsewhere") == {}
    assert value(text, "gpuscope_pods_cached") == 5
    assert value(text, "gpuscope_kubernetes_watch_up", resource="pods") == 1
    assert value(text, "gpuscope_kubernetes_cache_age_seconds", resource="pods") == 0
    # this API server serves no resource.k8s.io: DRA is off, said once, and costs nothing else
    assert set(series(text, "gpuscope_kubernetes_watch_up")) == {frozenset({("resource", "pods")})}
    assert len([line for line in daemon.log_lines if "DRA is off" in line]) == 1
    for collector in ("nvml", "kubernetes", "podresources", "cgroups"):
        assert value(text, "gpuscope_collector_success", collector=collector) == 1, collector
    assert any("pod attribution on" in line for line in daemon.log_lines)
    # without --kubernetes.node-condition and --kubernetes.events nothing is written: reads only
    assert {method for method, _ in node.api.calls} == {"GET"}

    assert_promtool_accepts(text)


def watch_up(text: str) -> bool:
    return value(text, "gpuscope_kubernetes_watch_up", resource="pods") == 1


def test_a_deleted_pod_disappears_within_two_sample_intervals(node: Node) -> None:
    with running_daemon(*node.args, "--collect.interval=500ms") as daemon:
        daemon.wait_ready()
        daemon.metrics_until(
            lambda t: bool(series(t, "gpu_pod_info", pod="notebook")), 60, "the notebook pod"
        )
        node.api.send_garbage()  # bad input on the way: logged once, healed by a fresh list
        daemon.metrics_until(watch_up, 60, "the watch after garbage")
        node.api.send_garbage()
        text = daemon.metrics_until(watch_up, 60, "the watch after more garbage")
        before = value(text, CYCLES)
        node.api.delete("pods", "lab", "notebook")
        text = daemon.wait_cycles(2, since=before, timeout=60)
        assert not [name for name, labels in samples(text) if ("pod", "notebook") in labels], (
            "the deleted pod's series are gone two cycles after the deletion"
        )
        assert value(text, "gpu_pod_memory_used_bytes", pod="infer-b-0") == 20 * GIB
    assert len([line for line in daemon.log_lines if "malformed answer" in line]) == 1


def test_without_a_cluster_attribution_is_off_and_said_once() -> None:
    with running_daemon(
        f"--simulate={FLEET}", env={"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
    ) as daemon:
        daemon.wait_ready()
        text = daemon.metrics()
    assert "gpu_pod_" not in text
    assert series(text, "gpuscope_collector_success", collector="kubernetes") == {}
    assert len([line for line in daemon.log_lines if "pod attribution is off" in line]) == 1


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--kubeconfig=/nonexistent/kubeconfig"], "--kubeconfig"),
        (["--kubernetes.pod-labels=(unclosed"], "--kubernetes.pod-labels"),
        (["--kubelet.resource-names=gpu"], "--kubelet.resource-names"),
        (["--kubernetes.node-name=Not_A_Node"], "--kubernetes.node-name"),
    ],
)
def test_bad_attribution_configuration_exits_2(args: list[str], setting: str) -> None:
    result = subprocess.run(
        daemon_command("--simulate=1", *args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gpuscope: error: invalid {setting}: ")


def test_a_kubeconfig_without_node_name_exits_2(node: Node, tmp_path: Path) -> None:
    kubeconfig = node.api.write_kubeconfig(tmp_path / "kc")
    result = subprocess.run(
        daemon_command("--simulate=1", f"--kubeconfig={kubeconfig}"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={
            k: v
            for k, v in os.environ.items()
            if k != "NODE_NAME" and not k.startswith("GPUSCOPE_")
        },
    )
    assert result.returncode == 2
    assert result.stderr.startswith("gpuscope: error: invalid --kubernetes.node-name: ")
