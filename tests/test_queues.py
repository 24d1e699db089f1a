"""Showback per queue, the daemon's side: which queue a pod's labels name (pure), the list + watch
of Kueue's LocalQueues against the stand-in API server (v1beta2, the v1beta1 fallback, a
LocalQueue added or changed after its pods, no Kueue at all, RBAC refusing it), and
`gpu_pod_queue_info` out of the attribution join."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import pytest

from exporter.attribution.access import resolve_cluster
from exporter.attribution.cluster import KubernetesClient
from exporter.attribution.join import Join
from exporter.attribution.jsonstream import JsonStream
from exporter.attribution.localqueues import (
    CLUSTER_QUEUE_LABEL,
    KAI_QUEUE_LABEL,
    LOCAL_QUEUE_LABEL,
    LocalQueueIndex,
    local_queue_watch,
    queue_of,
)
from exporter.attribution.pod import PodIndex, pod_from_api, pod_shape
from exporter.attribution.podresources import DeviceAllocation
from exporter.metrics.attribution import attribution_families
from exporter.model import GpuIdentity, GpuSample, KubernetesStatus
from tests.fake_kube.kueue import GROUP, PLURAL, local_queue, serve_kueue
from tests.fake_kube.pods import NODE, pod
from tests.fake_kube.server import FakeKube
from tests.helpers import eventually

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path

    from exporter.attribution.localqueues import LocalQueueWatch

pytestmark = pytest.mark.timeout(60)
FAST_BACKOFF = (0.05, 0.1, 0.2)
LOCAL_QUEUES = LocalQueueIndex({("ml", "team-a"): "research", ("ml", "empty"): ""})


# -- pure: a pod's queue --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({CLUSTER_QUEUE_LABEL: "research"}, ("research", "kueue")),
        ({LOCAL_QUEUE_LABEL: "team-a"}, ("research", "kueue")),
        # Kueue's own record of the admission wins over what the LocalQueue says now
        ({CLUSTER_QUEUE_LABEL: "batch", LOCAL_QUEUE_LABEL: "team-a"}, ("batch", "kueue")),
        ({LOCAL_QUEUE_LABEL: "not-yet"}, None),  # a LocalQueue not seen (yet): unqueued
        ({LOCAL_QUEUE_LABEL: "not-yet", KAI_QUEUE_LABEL: "serving"}, ("serving", "kai")),
        ({KAI_QUEUE_LABEL: "serving"}, ("serving", "kai")),
        ({CLUSTER_QUEUE_LABEL: "", KAI_QUEUE_LABEL: ""}, None),
        ({"team": "vision"}, None),
    ],
)
def test_a_pods_queue_follows_its_labels_in_order(
    labels: Mapping[str, str], expected: tuple[str, str] | None
) -> None:
    assert queue_of("ml", labels, LOCAL_QUEUES) == expected


def test_a_local_queue_resolves_only_in_its_own_namespace() -> None:
    assert queue_of("other", {LOCAL_QUEUE_LABEL: "team-a"}, LOCAL_QUEUES) is None
    assert LocalQueueIndex.of([]).cluster_queues == {}


def test_the_pod_watch_keeps_the_queue_labels_without_being_asked() -> None:
    labels = {CLUSTER_QUEUE_LABEL: "a", LOCAL_QUEUE_LABEL: "b", KAI_QUEUE_LABEL: "c", "x": "y"}
    document = pod("p", "uid-p", labels=labels)
    stream = JsonStream(
        iter([json.dumps(document).encode()]), max_value_bytes=1 << 20, what="a pod"
    )
    kept = stream.value(pod_shape())
    assert isinstance(kept, dict)
    assert pod_from_api(kept).labels == {
        CLUSTER_QUEUE_LABEL: "a",
        LOCAL_QUEUE_LABEL: "b",
        KAI_QUEUE_LABEL: "c",
    }


# -- the join and the family ---------------------------------------------------------------------

UUID = "GPU-5b2f0d3e-0000-1111-2222-333344445555"


def joined(pods: list[dict[str, object]], local_queues: LocalQueueIndex) -> list[dict[str, str]]:
    """gpu_pod_queue_info's label sets for `pods`, each holding a replica of one GPU."""
    index = PodIndex.of(pod_from_api(item) for item in pods)
    gpu = GpuSample(GpuIdentity(index=0, uuid=UUID, model="NVIDIA H100 80GB HBM3"), up=True)
    allocations = tuple(
        DeviceAllocation(p.namespace, p.name, "main", "nvidia.com/gpu", f"{UUID}::{n}")
        for n, p in enumerate(index.by_uid.values())
    )
    attribution = Join(NODE)(
        (gpu,),
        {},
        index,
        allocations,
        KubernetesStatus((), len(pods)),
        local_queues=local_queues,
        now=1.0,
    )
    (family,) = [m for m in attribution_families(attribution) if m.name == "gpu_pod_queue_info"]
    return [dict(sample.labels) for sample in family.samples]


def test_each_holder_in_a_queue_has_one_queue_info_series() -> None:
    pods = [
        pod("trainer-0", "u1", namespace="ml", labels={LOCAL_QUEUE_LABEL: "team-a"}),
        pod("chat-0", "u2", namespace="ml", labels={KAI_QUEUE_LABEL: "serving"}),
        pod("notebook", "u3", namespace="lab"),
    ]
    assert sorted(joined(pods, LOCAL_QUEUES), key=lambda labels: labels["pod"]) == [
        {"namespace": "ml", "pod": "chat-0", "queue": "serving", "queue_kind": "kai"},
        {"namespace": "ml", "pod": "trainer-0", "queue": "research", "queue_kind": "kueue"},
    ]


def test_a_pods_queue_follows_its_local_queue_from_cycle_to_cycle() -> None:
    """The join caches each pod's identity: a LocalQueue changing under the same pod object
    must still change its queue."""
    item = pod("trainer-0", "u1", namespace="ml", labels={LOCAL_QUEUE_LABEL: "team-a"})
    index = PodIndex.of([pod_from_api(item)])
    gpu = GpuSample(GpuIdentity(index=0, uuid=UUID, model="NVIDIA H100 80GB HBM3"), up=True)
    held = (DeviceAllocation("ml", "trainer-0", "main", "nvidia.com/gpu", UUID),)
    join = Join(NODE)
    queues = []
    for local_queues in (
        LocalQueueIndex({}),
        LOCAL_QUEUES,
        LocalQueueIndex({("ml", "team-a"): "b"}),
    ):
        attribution = join(
            (gpu,), {}, index, held, KubernetesStatus((), 1), local_queues=local_queues, now=1.0
        )
        (identity,) = attribution.pods
        queues.append((identity.queue, identity.queue_kind))
        (allocation,) = attribution.allocations
        assert allocation.pod is identity
    assert queues == [("", ""), ("research", "kueue"), ("b", "kueue")]


# -- list + watch against the stand-in -----------------------------------------------------------


def start_watch(server: FakeKube, tmp_path: Path) -> LocalQueueWatch:
    access = resolve_cluster(
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    watch = local_queue_watch(KubernetesClient(access.configuration), backoff=FAST_BACKOFF)
    watch.start()
    return watch


@pytest.fixture
def watched(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[FakeKube, LocalQueueWatch]]:
    version: str = request.param
    with serve_kueue(
        FakeKube(), local_queue("ml", "team-a", "research"), version=version
    ) as server:
        watch = start_watch(server, tmp_path)
        try:
            yield server, watch
        finally:
            watch.stop()


@pytest.mark.parametrize("watched", ["v1beta2", "v1beta1"], indirect=True)
def test_local_queues_are_listed_and_followed_in_every_namespace(
    watched: tuple[FakeKube, LocalQueueWatch],
) -> None:
    server, watch = watched
    eventually(lambda: watch.view().cluster_queues == {("ml", "team-a"): "research"}, 10, "listed")
    # a LocalQueue created after its pods: resolved at its watch event
    server.put(PLURAL, local_queue("lab", "notebooks", "interactive"))
    eventually(
        lambda: watch.view().cluster_queues.get(("lab", "notebooks")) == "interactive",
        10,
        "the new LocalQueue",
    )
    # pointed at another ClusterQueue
    server.put(PLURAL, local_queue("ml", "team-a", "research-2"))
    eventually(
        lambda: watch.view().cluster_queues.get(("ml", "team-a")) == "research-2", 10, "moved"
    )
    server.delete(PLURAL, "lab", "notebooks")
    eventually(lambda: ("lab", "notebooks") not in watch.view().cluster_queues, 10, "deleted")
    status = watch.status()
    assert status is not None
    assert (status.resource, status.up, status.objects) == ("localqueues", True, 1)
    watches = [q for q in server.requests if "/localqueues" in q]
    assert any("watch=true" in q for q in watches)
    assert all(q.startswith(f"/apis/{GROUP}/") for q in watches)


@pytest.mark.parametrize("older", [True, False], ids=["no Kueue", "RBAC 403"])
def test_a_cluster_without_local_queues_turns_the_watch_off_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, older: bool
) -> None:
    caplog.set_level(logging.INFO)
    with serve_kueue(FakeKube()) as server:
        if older:
            server.withheld.add(GROUP)
        else:
            server.forbidden.add(PLURAL)
        watch = start_watch(server, tmp_path)
        try:
            eventually(lambda: watch.off, 10, "LocalQueues off")
            assert watch.status() is None
            assert len(watch.view()) == 0
        finally:
            watch.stop()
        # no Kueue: v1beta2, then v1beta1, then nothing more; forbidden: the first list only
        assert len(server.requests) == (2 if older else 1)
    off = [r for r in caplog.records if "LocalQueues" in r.getMessage()]
    assert len(off) == 1
    assert off[0].levelno == (logging.INFO if older else logging.WARNING)
