"""A pod's revision on gpu_pod_info and its GPU containers' images on gpu_pod_container_info:
from the API's JSON (tests/fake_kube), from a fleet file's pods, bounded and allow-listed."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
import yaml

from exporter.attribution.cgroups import ContainerRef
from exporter.attribution.join import Join
from exporter.attribution.pod import MAX_IMAGE_LENGTH, PodIndex, pod_from_api
from exporter.attribution.podresources import DeviceAllocation
from exporter.metrics.exposition import TEXT, Exposition
from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import (
    GpuIdentity,
    GpuSample,
    KubernetesStatus,
    ProcessSample,
    Snapshot,
    WatchStatus,
)
from exporter.simulator.cluster import pod_document
from exporter.simulator.fleet import FleetError, parse_fleet
from tests.fake_kube.pods import NODE, pod
from tests.helpers import series
from tests.proc_fixture import container_id, pod_uid

if TYPE_CHECKING:
    from exporter.model import Attribution

GPU0 = GpuIdentity(0, "GPU-0000", "NVIDIA L4", minor_number=0)
KUBE = KubernetesStatus((WatchStatus("pods", True, 0.0, 3),), pods_cached=3)
DIGEST = "@sha256:" + "ab" * 32
LONG = "registry.example.com/" + "x" * 200 + ":v1"


def documents() -> tuple[dict[str, object], ...]:
    return (
        pod(
            "chat-6b9f7c5d4-7xq2m",
            pod_uid(1),
            namespace="serving",
            containers={"server": container_id(1), "proxy": container_id(11)},
            owner=("ReplicaSet", "chat-6b9f7c5d4"),
            labels={"pod-template-hash": "6b9f7c5d4"},
            images={"server": "vllm/vllm-openai:v0.8.5" + DIGEST, "proxy": "envoyproxy/envoy:v1"},
        ),
        pod(
            "ranker-0",
            pod_uid(2),
            namespace="serving",
            containers={"server": container_id(2)},
            owner=("StatefulSet", "ranker"),
            labels={"controller-revision-hash": "ranker-5b7f8d9c4b"},
            images={"server": LONG},
        ),
        pod("notebook", pod_uid(3), namespace="lab", containers={"jupyter": container_id(3)}),
    )


def attribute(join: Join) -> Attribution:
    pods = PodIndex.of(pod_from_api(document) for document in documents())
    containers = {n: ContainerRef(pod_uid(n), container_id(n)) for n in (1, 2)}
    gpus = (
        GpuSample(
            GPU0,
            up=True,
            processes=(ProcessSample(1, 2**30, 0.3, 0.0), ProcessSample(2, 2**30, 0.2, 0.0)),
        ),
    )
    held = (DeviceAllocation("lab", "notebook", "jupyter", "nvidia.com/gpu", "GPU-0000::0"),)
    return join(gpus, containers, pods, held, KUBE, now=1.0)


def rendered(attribution: Attribution) -> str:
    snapshot = Snapshot(1.0, (GpuSample(GPU0, up=True),), (), attribution=attribution)
    exposition = Exposition(lambda: snapshot_families(snapshot, BuildInfo("0")))
    return exposition.render(TEXT).body.decode()


def test_the_revision_is_the_template_hash_else_the_controller_revision_else_empty() -> None:
    text = rendered(attribute(Join(NODE)))
    revisions = {
        dict(labels)["pod"]: dict(labels)["revision"] for labels in series(text, "gpu_pod_info")
    }
    assert revisions == {
        "chat-6b9f7c5d4-7xq2m": "6b9f7c5d4",
        "ranker-0": "ranker-5b7f8d9c4b",
        "notebook": "",
    }


def test_images_of_containers_holding_or_using_a_gpu_without_digest_and_bounded() -> None:
    text = rendered(attribute(Join(NODE)))
    images = {
        (dict(labels)["pod"], dict(labels)["container"]): dict(labels)["image"]
        for labels in series(text, "gpu_pod_container_info")
    }
    assert (
        images
        == {
            ("chat-6b9f7c5d4-7xq2m", "server"): "vllm/vllm-openai:v0.8.5",  # the proxy runs no GPU
            ("ranker-0", "server"): LONG[:MAX_IMAGE_LENGTH],
            ("notebook", "jupyter"): "example.com/app:1",  # holds the GPU, runs nothing
        }
    )
    (labels,) = series(text, "gpu_pod_container_info", pod="ranker-0")
    assert set(dict(labels)) == {"namespace", "pod", "container", "image"}


def test_the_image_pattern_shows_only_the_images_it_matches() -> None:
    join = Join(NODE, image_pattern=re.compile(r"vllm/.*|example\.com/.*"))
    text = rendered(attribute(join))
    images = {
        dict(labels)["pod"]: dict(labels)["image"]
        for labels in series(text, "gpu_pod_container_info")
    }
    assert images == {
        "chat-6b9f7c5d4-7xq2m": "vllm/vllm-openai:v0.8.5",
        "ranker-0": "",  # hidden, the container still listed
        "notebook": "example.com/app:1",
    }


def test_images_come_from_every_kind_of_container_in_the_spec() -> None:
    document = pod("job", pod_uid(4), containers={"main": container_id(4)})
    spec = document["spec"]
    assert isinstance(spec, dict)
    spec["initContainers"] = [{"name": "fetch", "image": "busybox:1.36"}]
    spec["ephemeralContainers"] = [{"name": "debug", "image": "nicolaka/netshoot"}, {"name": 3}]
    parsed = pod_from_api(document)
    assert parsed.images == (
        ("main", "example.com/app:1"),
        ("fetch", "busybox:1.36"),
        ("debug", "nicolaka/netshoot"),
    )
    del document["spec"]
    assert pod_from_api(document).images == ()


FLEET = """
gpus: [{model: l4, count: 2}]
pods:
  - {name: chat-api-6b9f7c5d4-7xq2m, namespace: serving, workload: {kind: Deployment, name: chat-api}, containers: [server], images: {server: "vllm/vllm-openai:v0.8.5"}, gpus: [0]}
  - {name: chat-api-8c7d6b5f4-p2k9z, namespace: serving, workload: {kind: Deployment, name: chat-api}, labels: {pod-template-hash: 8c7d6b5f4}, containers: [server], gpus: [1]}
  - {name: ranker-0, namespace: serving, workload: {kind: StatefulSet, name: ranker}, containers: [server], gpus: [1]}
  - {name: ranker-1, namespace: serving, workload: {kind: StatefulSet, name: ranker}, labels: {controller-revision-hash: ranker-7c5f9d8b6d}, containers: [server], gpus: [1]}
  - {name: notebook, namespace: lab, containers: [jupyter], gpus: [0]}
"""


def test_a_fleet_files_pods_carry_revisions_and_images_as_a_cluster_would() -> None:
    fleet = parse_fleet(yaml.safe_load(FLEET))
    parsed = {p.name: pod_from_api(pod_document(p, "node-a")) for p in fleet.pods}
    chat, rolled = parsed["chat-api-6b9f7c5d4-7xq2m"], parsed["chat-api-8c7d6b5f4-p2k9z"]
    assert chat.labels["pod-template-hash"] == "6b9f7c5d4"  # from the pod's name
    assert rolled.labels["pod-template-hash"] == "8c7d6b5f4"  # the fleet file's own
    assert (chat.workload.kind, chat.workload.name) == ("Deployment", "chat-api")
    assert (rolled.workload.kind, rolled.workload.name) == ("Deployment", "chat-api")
    assert chat.images == (("server", "vllm/vllm-openai:v0.8.5"),)
    assert rolled.images == ()  # no image named: none invented
    made = parsed["ranker-0"].labels["controller-revision-hash"]
    assert re.fullmatch(r"ranker-[bcdfghjklmnpqrstvwxz2456789]{10}", made)
    assert parsed["ranker-1"].labels["controller-revision-hash"] == "ranker-7c5f9d8b6d"
    assert "controller-revision-hash" not in parsed["notebook"].labels


@pytest.mark.parametrize(
    ("images", "problem"),
    [
        ("{sidecar: busybox}", r"pods\[0\]\.images\.sidecar: .*has no container 'sidecar'"),
        ("{main: 'has spaces'}", r"pods\[0\]\.images\.main: .*image reference"),
        ("[busybox]", r"pods\[0\]\.images: expected a mapping"),
    ],
)
def test_a_fleet_files_bad_images_are_one_line(images: str, problem: str) -> None:
    text = f"gpus: [{{model: l4}}]\npods:\n  - {{name: a, images: {images}, gpus: [0]}}\n"
    with pytest.raises(FleetError, match=problem):
        parse_fleet(yaml.safe_load(text))
