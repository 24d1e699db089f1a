"""Kueue's LocalQueues for the stand-in API server (`kueue.x-k8s.io`, list and watch in every
namespace), served as `v1beta2` (Kueue 0.15 and later) or `v1beta1` (older releases): one
version at a time, as a cluster serves its installed Kueue's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from tests.fake_kube.server import Collection

if TYPE_CHECKING:
    from tests.fake_kube.server import FakeKube

GROUP: Final = "kueue.x-k8s.io"
PLURAL: Final = "localqueues"


def local_queues(version: str) -> Collection:
    """The LocalQueue collection of `kueue.x-k8s.io/<version>`."""
    return Collection(plural=PLURAL, kind="LocalQueue", prefix=f"/apis/{GROUP}/{version}")


def local_queue(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    """A LocalQueue as the API serves it, with the status Kueue keeps on it (read past)."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"lq-{namespace}-{name}"},
        "spec": {"clusterQueue": cluster_queue, "stopPolicy": "None"},
        "status": {
            "admittedWorkloads": 1,
            "pendingWorkloads": 0,
            "conditions": [{"type": "Active", "status": "True", "reason": "Ready"}],
            "flavorsUsage": [{"name": "default", "resources": [{"name": "nvidia.com/gpu"}]}],
        },
    }


def serve_kueue(server: FakeKube, *queues: dict[str, Any], version: str = "v1beta2") -> FakeKube:
    """Serve LocalQueues as `kueue.x-k8s.io/<version>`, holding `queues`."""
    server.serve(local_queues(version))
    for queue in queues:
        server.put(PLURAL, queue)
    return server
