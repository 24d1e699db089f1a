"""`--kubernetes.node-condition` and `--kubernetes.events` end to end: `gpuscope serve` as a
subprocess against the stand-in API server (recording node status patches and Events), on the
fake driver (its XIDs and lost GPUs) and on the simulated attribution node (its pods). Short
recovery and idle periods by flag keep it quick; nothing sleeps for time to pass."""

from __future__ import annotations

import copy
import itertools
import time
from typing import TYPE_CHECKING, Any

import pytest

from tests.attributed_node import FLEET, PODS, UUIDS, attributed_node
from tests.fake_kube.pods import NODE, serve_pods
from tests.fake_kube.server import FakeKube
from tests.fake_kube.writes import ClusterWrites, node_object, serve_writes
from tests.fake_nvml import XID_EVENT, FakeEvent
from tests.fake_nvml.node import fake_env, node_state
from tests.helpers import eventually, running_daemon, value

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.helpers import Daemon


pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

UUID0 = node_state().devices[0].uuid
UUID1 = node_state().devices[1].uuid


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKube, ClusterWrites, Path]]:
    """The stand-in API server with this node (a Ready condition, a label, an annotation, a
    taint kept by others) and no pods."""
    api = serve_pods(FakeKube())
    writes = serve_writes(api, node_object(NODE))
    with api:
        yield api, writes, api.write_kubeconfig(tmp_path / "kubeconfig")


def _condition_flags(kubeconfig: Path, recovery: str) -> list[str]:
    return [
        "--collect.interval=100ms",
        f"--kubeconfig={kubeconfig}",
        f"--kubernetes.node-name={NODE}",
        "--no-collector.attribution",
        "--kubernetes.node-condition",
        f"--kubernetes.node-condition.recovery={recovery}",
    ]


def _gpu_healthy(writes: ClusterWrites) -> dict[str, Any]:
    condition = writes.condition(NODE, "GPUHealthy")
    return condition or {}


def _status(writes: ClusterWrites, status: str, reason: str) -> bool:
    condition = _gpu_healthy(writes)
    return condition.get("status") == status and condition.get("reason") == reason


def _untouched(writes: ClusterWrites) -> None:
    """Everything but GPUHealthy is as the node's other writers left it."""
    node = copy.deepcopy(writes.node(NODE))
    node["status"]["conditions"] = [
        c for c in node["status"]["conditions"] if c["type"] != "GPUHealthy"
    ]
    expected = node_object(NODE)
    for part in ("labels", "annotations"):
        assert node["metadata"][part] == expected["metadata"][part]
    assert node["spec"] == expected["spec"]
    assert node["status"] == expected["status"]


def _no_idle_rewrites(writes: ClusterWrites) -> None:
    """Within a run shorter than 30 s, every patch changed what the condition says."""
    said = [
        tuple(body["status"]["conditions"][0][k] for k in ("status", "reason", "message"))
        for _, body in writes.node_patches
    ]
    assert all(a != b for a, b in itertools.pairwise(said)), said


def test_an_xid_79_turns_gpu_healthy_false_within_10s_and_back_after_recovery(
    fake_lib_dir: Path, tmp_path: Path, cluster: tuple[FakeKube, ClusterWrites, Path]
) -> None:
    api, writes, kubeconfig = cluster
    state = tmp_path / "state"
    healthy = node_state()
    healthy.write(state)
    env = fake_env(fake_lib_dir, state)
    with running_daemon(*_condition_flags(kubeconfig, "2s"), env=env) as daemon:
        eventually(lambda: _status(writes, "True", "AllGPUsHealthy"), 15, "GPUHealthy True")
        first = _gpu_healthy(writes)
        assert writes.node_patches[0][0] == "application/strategic-merge-patch+json"
        with_xid = node_state()
        with_xid.devices[0].events = [FakeEvent(1, XID_EVENT, 79)]
        with_xid.write(state)
        eventually(lambda: _status(writes, "False", "XID79"), 10, "GPUHealthy False by XID79")
        false = _gpu_healthy(writes)
        assert UUID0 in false["message"]
        assert false["lastTransitionTime"] >= first["lastTransitionTime"]
        _untouched(writes)
        # Every GPU answers and no fatal XID follows: True again after the 2 s recovery.
        eventually(lambda: _status(writes, "True", "AllGPUsHealthy"), 10, "GPUHealthy True again")
        # A GPU falling off the bus: GPULost, naming it.
        node_state(lost=True).write(state)
        eventually(lambda: _status(writes, "False", "GPULost"), 10, "GPUHealthy False by GPULost")
        lost = _gpu_healthy(writes)
        assert UUID1 in lost["message"]
        _untouched(writes)
        assert (
            value(daemon.metrics(), "gpuscope_collector_success", collector="node_condition") == 1
        )
        _no_idle_rewrites(writes)
        assert daemon.process.poll() is None
        assert not _lines(daemon, "background task failed")
    # On exit the condition stays as it was.
    assert _status(writes, "False", "GPULost")
    assert {method for method, path in api.calls if "/nodes/" in path} <= {"GET", "PATCH"}

    # A restart keeps the False the previous run left, with its lastTransitionTime, until the
    # recovery period has passed, although every GPU answers again.
    healthy.write(state)
    before = len(writes.node_patches)
    with running_daemon(*_condition_flags(kubeconfig, "3s"), env=env) as daemon:
        eventually(lambda: len(writes.node_patches) > before, 15, "the first write")
        kept = writes.node_patches[before][1]["status"]["conditions"][0]
        assert (kept["status"], kept["reason"]) == ("False", "GPULost")
        assert kept["lastTransitionTime"] == lost["lastTransitionTime"]
        eventually(lambda: _status(writes, "True", "AllGPUsHealthy"), 15, "True after recovery")
        _untouched(writes)


def test_failed_writes_are_retried_and_never_kill_the_daemon(
    fake_lib_dir: Path, tmp_path: Path, cluster: tuple[FakeKube, ClusterWrites, Path]
) -> None:
    api, writes, kubeconfig = cluster
    state = tmp_path / "state"
    node_state().write(state)
    writes.fail_writes.extend([403, 409])
    with running_daemon(
        *_condition_flags(kubeconfig, "2s"), env=fake_env(fake_lib_dir, state)
    ) as daemon:
        eventually(
            lambda: _status(writes, "True", "AllGPUsHealthy"), 20, "a write past the failures"
        )
        assert not writes.fail_writes
        with api.away():
            # The API server down: the daemon goes on sampling.
            daemon.wait_cycles(3)
        assert daemon.process.poll() is None
        assert daemon.get("/-/healthy")[0] == 200
    assert len(_lines(daemon, "writing the GPUHealthy condition failed")) == 2, "each cause once"
    assert not _lines(daemon, "background task failed")


# -- Events on the attribution node ---------------------------------------------------------------


def _events_fleet(tmp_path: Path) -> Path:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        FLEET.read_text() + "faults: [{kind: xid, gpu: 0, at: 2s, xid: 79}]\n", encoding="utf-8"
    )
    return fleet


def _regarding(event: dict[str, Any]) -> str:
    return f"{event['regarding']['namespace']}/{event['regarding']['name']}"


def test_xid_and_idle_events_on_the_pods_that_matter(tmp_path: Path) -> None:
    with attributed_node(tmp_path, cluster_writes=True) as node:
        writes = node.writes
        assert writes is not None
        args = [a for a in node.args if not a.startswith("--simulate=")]
        started = time.monotonic()
        with running_daemon(
            *args,
            f"--simulate={_events_fleet(tmp_path)}",
            "--kubernetes.events",
            "--kubernetes.events.idle-after=2s",
        ) as daemon:
            eventually(lambda: len(writes.events("GPUXidError")) >= 2, 15, "GPUXidError Events")
            eventually(lambda: writes.events("GPUIdle"), 15, "a GPUIdle Event")
            text = daemon.wait_cycles(5)
        seconds = time.monotonic() - started
    # the task's health is a collector of its own, beside the XID thread's `events`
    assert value(text, "gpuscope_collector_success", collector="pod_events") == 1
    assert value(text, "gpuscope_collector_success", collector="events") == 1
    assert text.count('gpuscope_collector_success{collector="events"}') == 1
    xid = writes.events("GPUXidError")
    assert sorted(_regarding(e) for e in xid) == ["ml/infer-a-7d9c8b6f5-x2x9q", "ml/infer-b-0"]
    for event in xid:
        assert event["type"] == "Warning"
        assert UUIDS[0] in event["note"]
        assert "XID 79" in event["note"]
        assert event["metadata"]["namespace"] == "ml"
        pod = next(p for p in PODS if p["metadata"]["name"] == event["regarding"]["name"])
        assert event["regarding"]["uid"] == pod["metadata"]["uid"]
        assert event["regarding"]["kind"] == "Pod"
    idle = writes.events("GPUIdle")
    assert {_regarding(e) for e in idle} == {"lab/notebook"}, "only the idle holder"
    assert idle[0]["type"] == "Normal"
    assert UUIDS[1] in idle[0]["note"]
    assert "zero busy time" in idle[0]["note"]
    told = [body for _, body in writes.event_writes if "GPUIdle" in str(body)]
    assert len(told) <= seconds / 2 + 1, "at most one GPUIdle per pod per 2 s window"
    assert not writes.refused, writes.refused


def _lines(daemon: Daemon, fragment: str) -> list[str]:
    return [line for line in daemon.log_lines if fragment in line]
