"""Pods for the stand-in API server, built with the kubernetes client's own models and
serialized by its ApiClient, so the JSON is the API's."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Final

from kubernetes.client import (
    ApiClient,
    V1Container,
    V1ContainerStatus,
    V1ObjectMeta,
    V1OwnerReference,
    V1Pod,
    V1PodSpec,
    V1PodStatus,
)

from tests.fake_kube.server import Collection

if TYPE_CHECKING:
    from collections.abc import Mapping

    from tests.fake_kube.server import FakeKube

PODS: Final = Collection(
    plural="pods",
    kind="Pod",
    fields={
        "spec.nodeName": lambda pod: str(pod.get("spec", {}).get("nodeName", "")),
        "status.phase": lambda pod: str(pod.get("status", {}).get("phase", "")),
    },
)
NODE: Final = "gpu-node-1"
_SERIALIZER: Final = ApiClient()
_CREATED: Final = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DEFAULT_IMAGE: Final = "example.com/app:1"


def pod(
    name: str,
    uid: str,
    *,
    namespace: str = "default",
    node: str = NODE,
    containers: Mapping[str, str | None] | None = None,
    owner: tuple[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Running",
    runtime: str = "containerd",
    images: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the API serves it. `containers` maps container name -> container id (64 hex,
    None for a container that has not started, so its status has no containerID yet); `images`
    container name -> image (default `example.com/app:1`)."""
    containers = {"main": None} if containers is None else containers
    images = images or {}
    model = V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=V1ObjectMeta(
            name=name,
            namespace=namespace,
            uid=uid,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}) or None,
            creation_timestamp=_CREATED,
            owner_references=[
                V1OwnerReference(
                    api_version="apps/v1",
                    kind=owner[0],
                    name=owner[1],
                    uid=f"owner-{uid}",
                    controller=True,
                )
            ]
            if owner
            else None,
        ),
        spec=V1PodSpec(
            node_name=node,
            containers=[
                V1Container(name=cname, image=images.get(cname, DEFAULT_IMAGE))
                for cname in containers
            ],
        ),
        status=V1PodStatus(
            phase=phase,
            container_statuses=[
                V1ContainerStatus(
                    name=cname,
                    container_id=f"{runtime}://{cid}" if cid else None,
                    image=images.get(cname, DEFAULT_IMAGE),
                    image_id="",
                    ready=cid is not None,
                    restart_count=0,
                )
                for cname, cid in containers.items()
            ],
        ),
    )
    document: dict[str, Any] = _SERIALIZER.sanitize_for_serialization(model)
    return document


def serve_pods(server: FakeKube, *pods: dict[str, Any]) -> FakeKube:
    server.serve(PODS)
    for item in pods:
        server.put("pods", item)
    return server


def tenant_pod(
    name: str, uid: str, container_id: str, *, env_bytes: int = 1_400_000
) -> dict[str, Any]:
    """A pod on the node as a tenant may make it: its one container carries about `env_bytes` of
    small env entries (4-character values, as many as fit), beside `team` and
    `pod-template-hash` it has 500 labels gpuscope does not read, and a ReplicaSet owns it."""
    document = pod(
        name,
        uid,
        containers={"main": container_id},
        labels={"team": "t", "pod-template-hash": "abc", **{f"l{i}": "v" for i in range(500)}},
        owner=("ReplicaSet", f"{name.rpartition('-')[0]}-abc"),
    )
    document["spec"]["containers"][0]["env"] = [
        {"name": f"E{i:06d}", "value": "xxxx"} for i in range(env_bytes // 33)
    ]
    return document
