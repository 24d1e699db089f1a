"""The fourth hardening round's defects in reading the cluster, each as it was found: tenant pods
that grew the daemon past its memory limit, an exec plugin that held its start, a stalled kubelet
that held every sampling cycle, and stopping that waited on each source in turn. The daemon runs
as a user runs it (`gpuscope serve --simulate 1`) against the stand-in API server and kubelets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from exporter.attribution.access import resolve_cluster
from exporter.attribution.attributor import STOP_SECONDS, Attributor
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.credentials import TIMEOUT_SECONDS
from exporter.attribution.live import PodResourcesPoller
from exporter.attribution.podresources import PodResourcesClient
from exporter.attribution.pods import pod_watch
from exporter.attribution.procfs import ProcessContainers
from exporter.attribution.resourceslices import resource_slice_watch
from tests.fake_kube.dra import serve_dra
from tests.fake_kube.pods import NODE, pod, serve_pods, tenant_pod
from tests.fake_kube.server import FakeKube
from tests.fake_kubelet import FakeKubelet, StallingKubelet
from tests.helpers import CYCLES, eventually, running_daemon, value
from tests.proc_fixture import container_id, pod_uid

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

MIB = 2**20
PEAK_LIMIT_MIB = 150
"""The issue's bound on the daemon's peak memory with 35 pods of 1.4 MB of env on its node; the
chart's limit is 192 MiB. Measured: see the README (benchmarks/tenant_pods.py)."""


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def api() -> Iterator[FakeKube]:
    with serve_pods(
        FakeKube(), pod("plain", pod_uid(1), containers={"main": container_id(1)})
    ) as fake:
        yield fake


def daemon_flags(api: FakeKube, tmp_path: Path, *more: str) -> list[str]:
    return [
        "--simulate=1",
        f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
        f"--kubernetes.node-name={NODE}",
        f"--kubelet.pod-resources-socket={tmp_path / 'absent.sock'}",
        *more,
    ]


def test_tenant_pods_as_large_as_etcd_takes_them_cannot_grow_the_daemon(
    api: FakeKube, tmp_path: Path
) -> None:
    """35 pods naming the node, each with 1.4 MB of env entries: listed, then each changed once
    through the watch. The whole list parsed took the daemon to 506 MiB."""
    tenants = [
        tenant_pod(f"tenant-{n}", pod_uid(100 + n), container_id(100 + n)) for n in range(35)
    ]
    for document in tenants:
        api.put("pods", document)
    with running_daemon(*daemon_flags(api, tmp_path)) as daemon:
        daemon.metrics_until(
            lambda text: value(text, "gpuscope_pods_cached") == 36, 120, "the 36 pods listed"
        )
        for document in tenants:
            document["metadata"]["labels"] = {"changed": "yes"}  # type: ignore[index]
            api.put("pods", document)
        api.put("pods", pod("last", pod_uid(2)))
        daemon.metrics_until(
            lambda text: value(text, "gpuscope_pods_cached") == 37, 120, "every event read"
        )
        peak = peak_rss_mib(daemon.process.pid)
    assert peak < PEAK_LIMIT_MIB, f"peak {peak:.0f} MiB"


def test_a_hanging_exec_plugin_costs_pod_attribution_not_the_start(tmp_path: Path) -> None:
    plugin = tmp_path / "bin" / "hang-plugin.sh"
    plugin.parent.mkdir()
    plugin.write_text("#!/bin/sh\nsleep 600\n")
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": "./bin/hang-plugin.sh",
                                "interactiveMode": "Never",
                            }
                        },
                    }
                ],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    started = time.monotonic()
    with running_daemon(
        "--simulate=1",
        f"--kubeconfig={kubeconfig}",
        f"--kubernetes.node-name={NODE}",
        f"--kubelet.pod-resources-socket={tmp_path / 'absent.sock'}",
    ) as daemon:
        daemon.wait_ready()
        text = daemon.metrics()
        assert time.monotonic() - started < 15, "serving within seconds, the plugin still hanging"
        assert "gpu_info{" in text
        assert value(text, "gpuscope_collector_success", collector="kubernetes") == 0
        said = f"the kubeconfig's exec plugin '{plugin}' did not answer within {TIMEOUT_SECONDS:g}s"
        eventually(
            lambda: any(said in line for line in daemon.log_lines),
            TIMEOUT_SECONDS + 30,
            "the plugin named in the log",
            detail=lambda: "\n".join(daemon.log_lines),
        )
        daemon.wait_cycles(2)
        assert daemon.stop() == 0
    lines = [line for line in daemon.log_lines if "hang-plugin.sh" in line]
    assert len(lines) == 1, lines
    assert "level=error" in lines[0]


def test_sampling_cycles_keep_their_interval_while_the_kubelet_stalls(
    api: FakeKube, tmp_path: Path
) -> None:
    """A kubelet that never answers yet never falls silent held the poller for ever, and each
    cycle waited 2 s for its first answer."""
    socket = tmp_path / "kubelet.sock"
    with (
        StallingKubelet(socket) as kubelet,
        running_daemon(
            *daemon_flags(api, tmp_path),
            f"--kubelet.pod-resources-socket={socket}",
            "--collect.interval=100ms",
        ) as daemon,
    ):
        daemon.wait_ready()
        eventually(lambda: kubelet.connections > 0, 20, "the poller to call the kubelet")
        before = daemon.cycles()
        time.sleep(4.0)
        text = daemon.wait_cycles(0)
        cycles = value(text, CYCLES) - before
        # 40 expected; a cycle waiting 2 s for the kubelet makes 2 at most. The margin is for a
        # loaded machine, not for the daemon.
        assert cycles >= 8, f"{cycles:.0f} cycles in 4 s at 100 ms (40 expected)"
        daemon.metrics_until(
            lambda text: (
                value(text, "gpuscope_collector_success", collector="podresources") == 0
                and any("DEADLINE_EXCEEDED" in line for line in daemon.log_lines)
            ),
            20,
            "the stalled call given up at its deadline",
        )


def test_a_cycle_never_waits_for_the_poller(tmp_path: Path) -> None:
    with StallingKubelet(tmp_path / "kubelet.sock") as kubelet:
        poller = PodResourcesPoller(PodResourcesClient(kubelet.socket))
        poller.start()
        try:
            eventually(lambda: kubelet.connections > 0, 10, "the poller to call the kubelet")
            took = []
            for _ in range(10):
                started = time.monotonic()
                assert poller.allocations() == (None, False)
                took.append(time.monotonic() - started)
                time.sleep(0.05)
        finally:
            poller.stop()
    assert max(took) < 1.5, took  # a cycle waiting for the stalled call waited 2 s


def cluster_access(api: FakeKube, tmp_path: Path) -> Any:
    access = resolve_cluster(
        kubeconfig=api.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    return access


def test_stopping_attribution_waits_once_for_all_its_threads(tmp_path: Path) -> None:
    """Both watches blocked waiting for an answer (one no stop can cut), the kubelet answering
    late: every thread is told, then all are waited for until one deadline."""
    with (
        serve_dra(serve_pods(FakeKube())) as api,
        FakeKubelet(tmp_path / "kubelet.sock") as kubelet,
    ):
        kubelet.delay = 0.9
        access = cluster_access(api, tmp_path)
        api.delay = 10.0
        attributor = Attributor(
            NODE,
            pod_watch(KubernetesClient(access.configuration), NODE),
            PodResourcesPoller(PodResourcesClient(kubelet.socket)),
            ProcessContainers(tmp_path),
            resource_slice_watch(KubernetesClient(access.configuration), NODE, ("gpu.nvidia.com",)),
        )
        attributor.start()
        eventually(lambda: len(api.requests) >= 2 and kubelet.calls >= 1, 10, "every source asking")
        started = time.monotonic()
        attributor.stop()
        took = time.monotonic() - started
        api.delay = 0.0
    assert took < STOP_SECONDS + 1.0, f"stopped in {took:.2f}s"
