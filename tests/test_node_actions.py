"""The node condition's and the Events' logic on data (no daemon): the health verdict over time,
who gets which Event, the recorder's Events and series against the stand-in API server, and the
flags and config file."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from exporter import config
from exporter.actions.condition import NodeCondition
from exporter.actions.findings import IdleHolders, xid_findings
from exporter.actions.health import GpuHealth, Verdict
from exporter.actions.recorder import EventRecorder, PodEvents, cut_note, micro_time
from exporter.actions.writes import ApiWrites
from exporter.actions.xids import XidCounts
from exporter.attribution.cluster import ApiConfig, ApiError
from exporter.cli import build_parser, main
from exporter.config import ConfigError, ServeConfig
from exporter.model import (
    Allocation,
    Attribution,
    GpuIdentity,
    GpuSample,
    KubernetesStatus,
    PodIdentity,
    PodUsage,
    Snapshot,
)
from exporter.readings import xid_series
from tests.fake_kube.server import FakeKube
from tests.fake_kube.writes import ClusterWrites, node_object, serve_writes

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)

GPU0 = GpuIdentity(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3")
GPU1 = GpuIdentity(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3")
TRAINER = PodIdentity("train", "trainer-0", "uid-trainer", "trainer", "StatefulSet")
NOTEBOOK = PodIdentity("lab", "notebook", "uid-notebook", "notebook", "Pod")


def gpu(
    identity: GpuIdentity,
    *,
    up: bool = True,
    reason: str | None = None,
    xids: dict[int, int] | None = None,
) -> GpuSample:
    values = {xid_series(xid): float(count) for xid, count in (xids or {}).items()}
    return GpuSample(identity, up, reason, values)


def snapshot(*gpus: GpuSample, at: float = 0.0, attribution: Attribution | None = None) -> Snapshot:
    return Snapshot(timestamp=at, gpus=gpus, collectors=(), attribution=attribution)


def update(health: GpuHealth, counts: XidCounts, shot: Snapshot, now: float) -> Verdict | None:
    return health.update(shot, counts.new_hits(shot), now)


# -- the verdict ---------------------------------------------------------------------------------


@pytest.mark.parametrize("xid", [79, 48, 94, 95])
def test_a_fatal_xid_turns_it_false_naming_the_gpu_and_recovery_turns_it_back(xid: int) -> None:
    health, counts = GpuHealth(recovery_seconds=60, inherited=None, now=0), XidCounts()
    assert update(health, counts, snapshot(gpu(GPU0), gpu(GPU1)), 0) == Verdict(
        healthy=True, reason="AllGPUsHealthy", message="all GPUs answer (2), no fatal XID"
    )
    verdict = update(health, counts, snapshot(gpu(GPU0), gpu(GPU1, xids={xid: 1})), 1)
    assert verdict is not None
    assert (verdict.healthy, verdict.reason) == (False, f"XID{xid}")
    assert "GPU-bbbb" in verdict.message
    # the same count again is no new XID; recovery counts from the first clean snapshot
    assert not update(health, counts, snapshot(gpu(GPU0), gpu(GPU1, xids={xid: 1})), 2).healthy  # type: ignore[union-attr]
    assert not update(health, counts, snapshot(gpu(GPU0), gpu(GPU1, xids={xid: 1})), 61).healthy  # type: ignore[union-attr]
    assert update(health, counts, snapshot(gpu(GPU0), gpu(GPU1, xids={xid: 1})), 62).healthy  # type: ignore[union-attr]


def test_other_xids_change_nothing_and_a_hung_gpu_holds_recovery_back() -> None:
    health, counts = GpuHealth(recovery_seconds=10, inherited=None, now=0), XidCounts()
    assert update(health, counts, snapshot(gpu(GPU0, xids={13: 5, 31: 1})), 0).healthy  # type: ignore[union-attr]
    assert update(health, counts, snapshot(gpu(GPU0, xids={13: 9})), 1).healthy  # type: ignore[union-attr]
    # a hung GPU is not a fault, but no recovery runs while it does not answer
    assert update(health, counts, snapshot(gpu(GPU0, up=False, reason="hung")), 2).healthy  # type: ignore[union-attr]
    assert (
        update(health, counts, snapshot(gpu(GPU0, up=False, reason="lost")), 3).reason == "GPULost"
    )  # type: ignore[union-attr]
    assert update(health, counts, snapshot(gpu(GPU0)), 4).reason == "GPULost"  # type: ignore[union-attr]
    assert (
        update(health, counts, snapshot(gpu(GPU0, up=False, reason="hung")), 13).reason == "GPULost"
    )  # type: ignore[union-attr]
    assert update(health, counts, snapshot(gpu(GPU0)), 14).reason == "GPULost"  # type: ignore[union-attr]
    assert update(health, counts, snapshot(gpu(GPU0)), 24).healthy  # type: ignore[union-attr]


def test_a_lost_gpu_keeps_the_xid_that_turned_it_false_and_a_new_xid_names_itself() -> None:
    health, counts = GpuHealth(recovery_seconds=10, inherited=None, now=0), XidCounts()
    update(health, counts, snapshot(gpu(GPU0, xids={79: 1})), 0)
    assert (
        update(health, counts, snapshot(gpu(GPU0, up=False, reason="lost", xids={79: 1})), 1).reason
        == "XID79"
    )  # type: ignore[union-attr]
    assert (
        update(
            health, counts, snapshot(gpu(GPU0, up=False, reason="lost", xids={79: 1, 48: 1})), 2
        ).reason
        == "XID48"
    )  # type: ignore[union-attr]


def test_a_false_left_by_a_previous_run_is_kept_for_the_recovery_period() -> None:
    inherited = Verdict(False, "XID79", "fatal XID 79 on GPU 0 GPU-aaaa")
    health, counts = GpuHealth(recovery_seconds=10, inherited=inherited, now=100), XidCounts()
    assert update(health, counts, snapshot(gpu(GPU0)), 100) == inherited
    assert update(health, counts, snapshot(gpu(GPU0)), 109) == inherited
    assert update(health, counts, snapshot(gpu(GPU0)), 110).healthy  # type: ignore[union-attr]


class _Writes:
    """The node condition's API calls, on a node whose GPUHealthy went True long ago."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []
        self.failing = False

    async def get(self, _path: str, _shape: object) -> object:
        old = {"type": "GPUHealthy", "status": "True", "reason": "AllGPUsHealthy", "message": "m"}
        return {"status": {"conditions": [{**old, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}

    async def send(self, _method: str, _path: str, body: dict[str, Any], **_: str) -> None:
        if self.failing:
            raise ApiError(409, "Conflict")
        self.sent.append(body["status"]["conditions"][0])


async def test_a_status_change_that_failed_to_write_leaves_the_transition_time_alone() -> None:
    clock = [1000.0]
    writes = _Writes()
    current = [snapshot(gpu(GPU0))]
    condition = NodeCondition(
        writes,  # type: ignore[arg-type]
        "node-1",
        lambda: current[0],
        recovery_seconds=1,
        clock=lambda: clock[0],
        wall=lambda: 1_800_000_000.0,
        poll_seconds=0,
    )

    async def step(seconds: float, shot: Snapshot) -> None:
        clock[0] += seconds
        current[0] = shot
        for _ in range(20):
            await asyncio.sleep(0)

    task = asyncio.create_task(condition.run())
    await step(0, snapshot(gpu(GPU0)))
    assert [(c["status"], c["lastTransitionTime"]) for c in writes.sent] == [
        ("True", "2026-01-01T00:00:00Z")
    ]
    writes.failing = True
    await step(0, snapshot(gpu(GPU0, xids={79: 1})))  # False, but the write fails
    writes.failing = False
    await step(0.5, snapshot(gpu(GPU0, xids={79: 1})))  # clean from here; the backoff holds
    await step(31, snapshot(gpu(GPU0, xids={79: 1})))  # recovered before any False was written
    task.cancel()
    assert [(c["status"], c["lastTransitionTime"]) for c in writes.sent] == [
        ("True", "2026-01-01T00:00:00Z"),
        ("True", "2026-01-01T00:00:00Z"),
    ], "the status never changed on the node"


# -- who gets which Event -------------------------------------------------------------------------


def attribution(*, notebook_busy: float | None = 0.0, in_use: bool | None = False) -> Attribution:
    usage = [PodUsage(TRAINER, "main", GPU0, 1 << 30, 0.8, 10.0, 1)]
    if notebook_busy is None or notebook_busy > 0:
        usage.append(PodUsage(NOTEBOOK, "jupyter", GPU1, 1 << 20, notebook_busy, 0.0, 1))
    return Attribution(
        node="node-1",
        pods=(TRAINER, NOTEBOOK),
        usage=tuple(usage),
        allocations=(
            Allocation(TRAINER, "main", "nvidia.com/gpu", GPU0, True, False),
            Allocation(NOTEBOOK, "jupyter", "nvidia.com/gpu", GPU1, in_use, False),
        ),
        unattributed=(),
        kubernetes=KubernetesStatus(watches=(), pods_cached=2),
    )


def test_an_xid_tells_every_pod_holding_or_using_that_gpu() -> None:
    counts = XidCounts()
    shot = snapshot(gpu(GPU0, xids={79: 1, 13: 1}), gpu(GPU1), attribution=attribution())
    found = xid_findings(shot, counts.new_hits(shot))
    assert [(f.pod.name, f.type, f.reason) for f in found] == [
        ("trainer-0", "Warning", "GPUXidError")
    ]
    assert "XID 79" in found[0].note
    assert "GPU-aaaa" in found[0].note
    assert xid_findings(shot, counts.new_hits(shot)) == [], "told once"


def test_an_xid_before_the_pod_watch_has_listed_waits_for_it() -> None:
    from exporter.model import WatchStatus  # noqa: PLC0415

    events = PodEvents(
        EventRecorder(ApiWrites(ApiConfig("http://127.0.0.1:9")), "node-1"),
        lambda: None,
        idle_after=3600,
    )
    listing = replace(
        attribution(),
        kubernetes=KubernetesStatus((WatchStatus("pods", False, None, 0),), pods_cached=0),
    )
    assert events.findings(snapshot(gpu(GPU0, xids={79: 1}), attribution=listing)) == []
    found = events.findings(snapshot(gpu(GPU0, xids={79: 1}), attribution=attribution()))
    assert [(f.pod.name, f.reason) for f in found] == [("trainer-0", "GPUXidError")]


def test_an_idle_holder_is_told_once_per_window_from_when_it_was_first_seen_idle() -> None:
    idle = IdleHolders(idle_after=10)
    told: list[float] = []
    for at in range(100, 135):
        for finding in idle.update(
            snapshot(gpu(GPU0), gpu(GPU1), at=at, attribution=attribution())
        ):
            assert (finding.pod.name, finding.reason, finding.type) == (
                "notebook",
                "GPUIdle",
                "Normal",
            )
            assert "GPU-bbbb" in finding.note
            assert "NVIDIA H100 80GB HBM3" in finding.note
            told.append(at)
    assert told == [110, 120, 130]


def test_time_the_gpu_does_not_answer_is_not_idle_and_busy_time_starts_over() -> None:
    idle = IdleHolders(idle_after=10)

    def tell(at: float, **kwargs: object) -> bool:
        up = kwargs.pop("up", True)
        shot = snapshot(gpu(GPU0), gpu(GPU1, up=bool(up)), at=at, attribution=attribution(**kwargs))  # type: ignore[arg-type]
        return bool(idle.update(shot))

    assert not tell(0)
    assert not tell(5)
    assert not tell(100, up=False)  # 95 s unanswered: not idle
    assert not tell(101)  # after the gap: 5 s idle so far
    assert not tell(105)
    assert tell(106)  # 5 + 5
    assert not tell(107, notebook_busy=0.3)
    assert not tell(110)
    assert not tell(119)  # 9 s idle since it was busy; and told 13 s ago
    assert tell(120)
    assert not tell(121, in_use=None)  # the process list did not answer


def test_the_price_goes_in_the_note_where_known() -> None:
    from exporter.model import Ceilings  # noqa: PLC0415

    idle = IdleHolders(idle_after=1)
    shot = Snapshot(
        0,
        (gpu(GPU1),),
        (),
        ceilings=(Ceilings(GPU1.model, price_usd_per_hour=2.5),),
        attribution=attribution(),
    )
    idle.update(shot)
    found = idle.update(
        Snapshot(1, (gpu(GPU1),), (), ceilings=shot.ceilings, attribution=attribution())
    )
    assert "$60.00 a day" in found[0].note


# -- the recorder against the stand-in API server ------------------------------------------------


def test_micro_time_and_the_note_limit() -> None:
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"
    assert len(cut_note("é" * 1000).encode()) <= 1024


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[FakeKube, ClusterWrites]]:
    server = FakeKube()
    writes = serve_writes(server, node_object("node-1"))
    with server:
        yield server, writes


def test_the_same_event_again_patches_its_series_as_client_go_does(
    api: tuple[FakeKube, ClusterWrites],
) -> None:
    server, writes = api
    from exporter.actions.findings import Finding  # noqa: PLC0415

    async def record() -> None:
        client = ApiWrites(ApiConfig(server.url, authorization=lambda: "Bearer t"))
        recorder = EventRecorder(client, "node-1")
        finding = Finding(
            TRAINER, "Warning", "GPUXidError", "CheckGPUHealth", "XID 79 " + "x" * 2000
        )
        for _ in range(3):
            recorder.add(finding)
        recorder.add(Finding(NOTEBOOK, "Normal", "GPUIdle", "CheckGPUUse", "idle for 1h"))
        await recorder.flush()
        client.close()

    asyncio.run(record())
    created = [body for method, body in writes.event_writes if method == "POST"]
    patched = [body for method, body in writes.event_writes if method == "PATCH"]
    assert [e["reason"] for e in created] == ["GPUXidError", "GPUIdle"]
    assert [p["series"]["count"] for p in patched] == [2, 3]
    stored = writes.events("GPUXidError")
    assert len(stored) == 1
    assert stored[0]["series"]["count"] == 3
    assert stored[0]["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "train",
        "name": "trainer-0",
        "uid": "uid-trainer",
    }
    assert stored[0]["metadata"]["namespace"] == "train"
    assert len(stored[0]["note"].encode()) <= 1024
    assert not writes.refused


# -- flags and the config file -------------------------------------------------------------------


def load(argv: list[str]) -> ServeConfig:
    args = build_parser().parse_args(["serve", *argv])
    return config.load({k: v for k, v in vars(args).items() if k != "command"}, {})


def test_off_by_default_and_on_by_flag_or_by_the_files_enabled_key(tmp_path: Path) -> None:
    defaults = load([])
    assert (defaults.node_condition, defaults.events) == (False, False)
    assert (defaults.node_condition_recovery, defaults.events_idle_after) == (300.0, 3600.0)
    flags = load(
        [
            "--kubernetes.node-condition",
            "--kubernetes.node-condition.recovery=30s",
            "--kubernetes.events",
            "--kubernetes.events.idle-after=2h",
        ]
    )
    assert (flags.node_condition, flags.node_condition_recovery) == (True, 30.0)
    assert (flags.events, flags.events_idle_after) == (True, 7200.0)
    file = tmp_path / "gpuscope.yaml"
    file.write_text(
        "kubernetes:\n"
        "  node-condition: {enabled: true, recovery: 1m}\n"
        "  events: {enabled: true, idle-after: 30m}\n"
    )
    loaded = load([f"--config.file={file}"])
    assert (loaded.node_condition, loaded.node_condition_recovery) == (True, 60.0)
    assert (loaded.events, loaded.events_idle_after) == (True, 1800.0)
    file.write_text("kubernetes: {events: {enabled: true}}\n")
    assert not load([f"--config.file={file}", "--no-kubernetes.events"]).events


@pytest.mark.parametrize(
    ("argv", "content", "problem"),
    [
        (["--kubernetes.node-condition.recovery=5"], "", "--kubernetes.node-condition.recovery"),
        (
            ["--kubernetes.node-condition", "--kubernetes.node-condition.recovery=0s"],
            "",
            "recovery",
        ),
        (
            ["--kubernetes.events.idle-after=10m"],
            "",
            "it tunes --kubernetes.events, and that is off",
        ),
        (["--kubernetes.events", "--no-collector.attribution"], "", "--no-collector.attribution"),
        (["--kubernetes.node-condition", "--no-collector.events"], "", "--no-collector.events"),
        ([], "kubernetes: {node-condition: true}", "spelled kubernetes.node-condition.enabled"),
        ([], "kubernetes: {events: {enabled: maybe}}", "not a boolean"),
    ],
)
def test_bad_values_are_one_line_naming_the_setting(
    tmp_path: Path, argv: list[str], content: str, problem: str
) -> None:
    if content:
        file = tmp_path / "gpuscope.yaml"
        file.write_text(content)
        argv = [*argv, f"--config.file={file}"]
    with pytest.raises(ConfigError) as refused:
        load(argv)
    assert problem in str(refused.value)
    assert "\n" not in str(refused.value)


def test_without_a_cluster_the_flags_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["serve", "--simulate=1", "--kubernetes.events"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        (
            "gpuscope: error: invalid --kubernetes.events: needs a cluster (--kubeconfig, the "
            "service account or $KUBECONFIG)"
        )
    ]
