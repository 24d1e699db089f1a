"""The pod cache: pure parsing of the API's pods and workloads, then list + watch (the watch
engine, exporter/attribution/watch.py) against the stand-in API server, including every way it
misbehaves, and the bounds on what is read: lists in pages, and of each pod only what
attribution uses."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import TYPE_CHECKING

import pytest
import trustme

from exporter.attribution import watch
from exporter.attribution.access import resolve_cluster
from exporter.attribution.cluster import MAX_OBJECT_BYTES, KubernetesClient
from exporter.attribution.jsonstream import JsonStream
from exporter.attribution.owners import OwnerReference, Workload, workload_of
from exporter.attribution.pod import (
    MAX_CONTAINERS,
    PodFormatError,
    PodIndex,
    pod_from_api,
    pod_shape,
)
from exporter.attribution.pods import PodWatch, pod_watch
from exporter.config import ConfigError
from tests.fake_kube.pods import NODE, pod, serve_pods, tenant_pod
from tests.fake_kube.server import FakeKube
from tests.helpers import eventually
from tests.proc_fixture import STATIC_UID, container_id, pod_uid

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from exporter.model import WatchStatus

FAST_BACKOFF = (0.05, 0.1, 0.2)


# -- pure: workloads and pod objects -------------------------------------------------------------


@pytest.mark.parametrize(
    ("owners", "labels", "expected"),
    [
        ([], {}, Workload("Pod", "p")),
        (
            [OwnerReference("ReplicaSet", "web-5d8f7c9b4", True)],
            {"pod-template-hash": "5d8f7c9b4"},
            Workload("Deployment", "web"),
        ),
        (
            [OwnerReference("ReplicaSet", "web-5d8f7c9b4", True)],
            {},
            Workload("ReplicaSet", "web-5d8f7c9b4"),
        ),
        (
            [OwnerReference("ReplicaSet", "web-abc", True)],
            {"pod-template-hash": "xyz"},
            Workload("ReplicaSet", "web-abc"),
        ),
        ([OwnerReference("Job", "nightly-29471040", True)], {}, Workload("CronJob", "nightly")),
        (
            [OwnerReference("Job", "train-12345678901", True)],
            {},
            Workload("Job", "train-12345678901"),
        ),
        ([OwnerReference("Job", "run-00000042", True)], {}, Workload("Job", "run-00000042")),
        ([OwnerReference("StatefulSet", "db", True)], {}, Workload("StatefulSet", "db")),
        ([OwnerReference("DaemonSet", "agent", True)], {}, Workload("DaemonSet", "agent")),
        ([OwnerReference("RayCluster", "ray", True)], {}, Workload("RayCluster", "ray")),
        ([OwnerReference("Node", "gpu-node-1", True)], {}, Workload("Pod", "p")),
        (
            [OwnerReference("ConfigMap", "x"), OwnerReference("JobSet", "js", True)],
            {},
            Workload("JobSet", "js"),
        ),
    ],
)
def test_workload_of(
    owners: list[OwnerReference], labels: dict[str, str], expected: Workload
) -> None:
    assert workload_of("p", owners, labels) == expected


def test_pod_from_the_apis_json() -> None:
    parsed = pod_from_api(
        pod(
            "web-5d8f7c9b4-x2x9q",
            pod_uid(1),
            namespace="shop",
            containers={"app": container_id(1), "sidecar": container_id(2), "late": None},
            owner=("ReplicaSet", "web-5d8f7c9b4"),
            labels={"pod-template-hash": "5d8f7c9b4", "team": "ml"},
        )
    )
    assert parsed.uid == pod_uid(1)
    assert (parsed.namespace, parsed.name) == ("shop", "web-5d8f7c9b4-x2x9q")
    assert parsed.workload == Workload("Deployment", "web")
    assert parsed.containers == {container_id(1): "app", container_id(2): "sidecar"}
    assert parsed.labels["team"] == "ml"
    assert not parsed.ended
    assert parsed.problems == ()


def test_static_pods_and_ended_pods() -> None:
    mirror = pod_from_api(
        pod(
            "etcd-gpu-node-1",
            pod_uid(9),
            annotations={"kubernetes.io/config.mirror": STATIC_UID},
            owner=("Node", NODE),
        )
    )
    assert mirror.static_uid == STATIC_UID
    assert mirror.workload == Workload("Pod", "etcd-gpu-node-1")
    done = pod_from_api(pod("job-abc", pod_uid(3), phase="Succeeded"))
    index = PodIndex.of([mirror, done])
    assert index.by_uid[STATIC_UID] is mirror
    assert index.by_uid[pod_uid(9)] is mirror
    assert pod_uid(3) not in index.by_uid, "ended pods attribute nothing"


def test_container_ids_of_unknown_runtimes_and_forms() -> None:
    crio = pod_from_api(pod("a", pod_uid(1), containers={"c": container_id(1)}, runtime="cri-o"))
    assert crio.containers == {container_id(1): "c"}
    assert crio.problems == ()
    odd = pod_from_api(pod("b", pod_uid(2), containers={"c": container_id(2)}, runtime="rkt"))
    assert odd.containers == {container_id(2): "c"}, "matched by id all the same"
    assert odd.problems == (("runtime", "rkt"),)
    document = pod("c", pod_uid(3), containers={"c": container_id(3)})
    document["status"]["containerStatuses"][0]["containerID"] = "virtlet://not-hex"
    assert pod_from_api(document).problems == (("container-id", "virtlet"),)
    assert pod_from_api(document).containers == {}


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"metadata": "x"},
        {"metadata": {"name": "a", "namespace": "b"}},
        {"metadata": {"uid": "u", "namespace": "b"}},
    ],
)
def test_pods_without_identity_are_rejected(document: dict[str, object]) -> None:
    with pytest.raises(PodFormatError):
        pod_from_api(document)


def test_pods_without_status_have_no_containers() -> None:
    document = pod("a", pod_uid(1))
    del document["status"]
    parsed = pod_from_api(document)
    assert parsed.containers == {}


# -- configuration ------------------------------------------------------------------------------


def test_no_configuration_means_no_cluster(tmp_path: Path) -> None:
    assert resolve_cluster(kubeconfig=None, node_name=NODE, environ={}) is None
    # a pod without a mounted service account token is not a configuration either
    environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert (
        resolve_cluster(
            kubeconfig=None, node_name=NODE, environ=environ, token_file=str(tmp_path / "none")
        )
        is None
    )


def test_in_cluster_configuration(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    ca = tmp_path / "ca.crt"
    trustme.CA().cert_pem.write_to_path(str(ca))
    environ = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": "/ignored",
    }
    access = resolve_cluster(
        kubeconfig=None, node_name=NODE, environ=environ, token_file=str(token), ca_file=str(ca)
    )
    assert access is not None
    assert access.source == "in-cluster"
    assert access.configuration.host == "https://10.0.0.1:443"


def test_kubeconfig_from_flag_or_environment(tmp_path: Path) -> None:
    with serve_pods(FakeKube()) as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")
        flag = resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
        env = resolve_cluster(kubeconfig=None, node_name=NODE, environ={"KUBECONFIG": str(path)})
    assert flag is not None
    assert env is not None
    assert flag.configuration.host == env.configuration.host == server.url


@pytest.mark.parametrize(
    ("content", "node", "setting"),
    [
        (None, NODE, "--kubeconfig"),
        ("not: [a kubeconfig", NODE, "--kubeconfig"),
        ("apiVersion: v1\nkind: Config\n", NODE, "--kubeconfig"),
        ("VALID", None, "--kubernetes.node-name"),
    ],
)
def test_unusable_configuration_is_a_config_error(
    tmp_path: Path, content: str | None, node: str | None, setting: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content == "VALID":
        FakeKube().write_kubeconfig(path)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        resolve_cluster(kubeconfig=path, node_name=node, environ={})
    assert str(caught.value).startswith(f"invalid {setting}: ")
    assert "\n" not in str(caught.value)


# -- list + watch against the stand-in ----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeKube]:
    with serve_pods(
        FakeKube(),
        pod("a", pod_uid(1), containers={"main": container_id(1)}),
        pod("b", pod_uid(2), containers={"main": container_id(2)}),
        pod("elsewhere", pod_uid(3), node="other-node"),
    ) as fake:
        yield fake


def start_cache(
    server: FakeKube,
    tmp_path: Path,
    *,
    page_objects: int = watch.PAGE_OBJECTS,
    max_object_bytes: int = MAX_OBJECT_BYTES,
    pod_labels: re.Pattern[str] | None = None,
) -> PodWatch:
    access = resolve_cluster(
        kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"), node_name=NODE, environ={}
    )
    assert access is not None
    cache = pod_watch(
        KubernetesClient(access.configuration),
        NODE,
        pod_labels=pod_labels,
        backoff=FAST_BACKOFF,
        page_objects=page_objects,
        max_object_bytes=max_object_bytes,
    )
    cache.start()
    return cache


def names(cache: PodWatch) -> set[str]:
    return {name for _, name in cache.view().by_name}


def status(cache: PodWatch) -> WatchStatus:
    found = cache.status()
    assert found is not None, "the pods' watch never turns itself off"
    return found


def test_lists_this_nodes_pods_and_follows_changes(server: FakeKube, tmp_path: Path) -> None:
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        current = status(cache)
        assert current.up
        assert current.resource == "pods"
        assert current.cache_age_seconds == 0.0
        assert current.objects == 2
        server.put("pods", pod("c", pod_uid(4), containers={"main": container_id(4)}))
        eventually(lambda: names(cache) == {"a", "b", "c"}, 10, "names(cache) == {'a', 'b', 'c'}")
        server.put("pods", pod("a", pod_uid(1), containers={"main": container_id(5)}))
        eventually(
            lambda: cache.view().by_uid[pod_uid(1)].containers == {container_id(5): "main"},
            10,
            "cache.view().by_uid[pod_uid(1)].containers == {container_id(5): 'main'}",
        )
        server.delete("pods", "default", "b")
        eventually(lambda: names(cache) == {"a", "c"}, 10, "names(cache) == {'a', 'c'}")
        server.put("pods", pod("c", pod_uid(4), phase="Succeeded"))
        eventually(lambda: names(cache) == {"a"}, 10, "names(cache) == {'a'}")
    finally:
        cache.stop()
    queries = [q for q in server.requests if "watch=true" in q]
    assert queries
    assert all("fieldSelector=spec.nodeName%3Dgpu-node-1" in q for q in server.requests)
    assert all("resourceVersion=" in q for q in queries)


@pytest.mark.parametrize("as_event", [False, True])
def test_410_gone_lists_again(server: FakeKube, tmp_path: Path, as_event: bool) -> None:
    server.gone_as_event = as_event
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        lists = sum("watch" not in q for q in server.requests)
        server.expire()  # open watches get an ERROR 410 event
        server.put("pods", pod("c", pod_uid(4)))
        eventually(lambda: names(cache) == {"a", "b", "c"}, 10, "names(cache) == {'a', 'b', 'c'}")
        server.answer_gone()
        server.drop_connections()
        server.delete("pods", "default", "a")
        eventually(lambda: names(cache) == {"b", "c"}, 10, "names(cache) == {'b', 'c'}")
        assert sum("watch" not in q for q in server.requests) >= lists + 2
    finally:
        cache.stop()


def test_dropped_connections_resume_without_losing_events(server: FakeKube, tmp_path: Path) -> None:
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        lists = sum("watch" not in q for q in server.requests)
        for n in range(3):
            server.drop_connections()
            server.put("pods", pod(f"new{n}", pod_uid(10 + n)))
        eventually(
            lambda: names(cache) == {"a", "b", "new0", "new1", "new2"},
            10,
            "names(cache) == {'a', 'b', 'new0', 'new1', 'new2'}",
        )
        eventually(lambda: status(cache).up, 10, "status(cache).up")
        assert sum("watch" not in q for q in server.requests) == lists, "resumed, not re-listed"
    finally:
        cache.stop()


def test_garbage_in_the_stream_is_logged_once_and_the_cache_heals(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        for n in range(3):
            eventually(lambda: server.watching("pods"), 10, "a watch of pods")
            server.send_garbage()
            server.put("pods", pod(f"g{n}", pod_uid(20 + n)))
            eventually(lambda n=n: f"g{n}" in names(cache), 10, "f'g{n}' in names(cache)")
    finally:
        cache.stop()
    malformed = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(malformed) == 1


def test_an_endless_watch_event_is_refused_and_the_cache_heals(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cache = start_cache(server, tmp_path, max_object_bytes=1024 * 1024)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        eventually(lambda: server.watching("pods"), 10, "a watch of pods")
        server.send_endless_line(watch.MAX_EVENT_BYTES + 1024 * 1024)
        server.put("pods", pod("after", pod_uid(30)))
        eventually(lambda: "after" in names(cache), 10, "'after' in names(cache)")
    finally:
        cache.stop()
    refused = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert refused, [r.__dict__ for r in caplog.records]


def test_a_watch_event_past_its_limit_is_refused_before_it_is_read_whole(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        endless = b'{"type": "ADDED", "object": {"metadata": {"name": "'
        eventually(lambda: server.watching("pods"), 10, "a watch of pods")
        server.send_raw(endless + b"x" * (watch.MAX_EVENT_BYTES + 1024 * 1024))
        server.put("pods", pod("after", pod_uid(30)))
        eventually(lambda: "after" in names(cache), 10, "'after' in names(cache)")
    finally:
        cache.stop()
    refused = [r for r in caplog.records if "larger than 8 MiB" in str(r.__dict__)]
    assert refused, [r.__dict__ for r in caplog.records]


def test_an_object_past_its_limit_is_refused_until_it_fits(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    large = pod("large", pod_uid(40))
    large["metadata"]["annotations"] = {"note": "x" * 20_000}
    server.put("pods", large)
    cache = start_cache(server, tmp_path, page_objects=1, max_object_bytes=10_000)
    try:
        eventually(
            lambda: any("larger than" in str(r.__dict__) for r in caplog.records),
            10,
            "the page with the large pod refused",
        )
        assert names(cache) == set()
        server.delete("pods", "default", "large")
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
    finally:
        cache.stop()


def test_api_away_keeps_the_last_pods_and_comes_back_by_itself(
    server: FakeKube, tmp_path: Path
) -> None:
    cache = start_cache(server, tmp_path)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
        with server.away():
            eventually(lambda: not status(cache).up, 10, "not status(cache).up")
            time.sleep(0.3)
            away = status(cache)
            assert names(cache) == {"a", "b"}
            assert away.cache_age_seconds is not None
            assert away.cache_age_seconds > 0.2
            server.put("pods", pod("while-away", pod_uid(30)))
        eventually(lambda: "while-away" in names(cache), 10, "'while-away' in names(cache)")
        assert status(cache).up
        assert status(cache).cache_age_seconds == 0.0
    finally:
        cache.stop()


def test_a_slow_api_server(server: FakeKube, tmp_path: Path) -> None:
    server.delay = 0.5
    cache = start_cache(server, tmp_path)
    try:
        assert status(cache).cache_age_seconds is None, "nothing known before the first list"
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
    finally:
        cache.stop()


def test_refusals_are_logged_once(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "kubeconfig"
    path.write_text(
        server.write_kubeconfig(path)
        .read_text()
        .replace("token: fake-token", "{}")
        .replace("user:\n", "user:")
    )
    access = resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
    assert access is not None
    cache = pod_watch(KubernetesClient(access.configuration), NODE, backoff=(0.02,))
    cache.start()
    try:
        eventually(
            lambda: sum("watch" not in q for q in server.requests) >= 3,
            10,
            "sum('watch' not in q for q in server.requests) >= 3",
        )
        assert not status(cache).up
        assert names(cache) == set()
    finally:
        cache.stop()
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1
    assert refused[0].status == 401  # type: ignore[attr-defined]


def test_stop_interrupts_an_open_watch_promptly(server: FakeKube, tmp_path: Path) -> None:
    cache = start_cache(server, tmp_path)
    eventually(
        lambda: status(cache).up and any("watch=true" in q for q in server.requests),
        10,
        "status(cache).up and any('watch=true' in q for q in server.requests)",
    )
    time.sleep(0.1)
    started = time.monotonic()
    cache.stop()
    assert time.monotonic() - started < 1.0


# -- bounded reads: pages, and only what attribution uses of each pod -------------------------------


def test_the_list_is_read_in_pages_from_one_snapshot(server: FakeKube, tmp_path: Path) -> None:
    for n in range(5):
        server.put("pods", pod(f"p{n}", pod_uid(50 + n)))
    cache = start_cache(server, tmp_path, page_objects=2)
    try:
        eventually(lambda: len(names(cache)) == 7, 10, "the seven pods of the node listed")
    finally:
        cache.stop()
    lists = [q for q in server.requests if "watch=true" not in q]
    assert len(lists) == 4, lists  # 7 pods (and one elsewhere, not selected), 2 a page
    assert all("limit=2" in q for q in lists)
    assert "continue=" not in lists[0]
    assert all("continue=" in q for q in lists[1:])
    watches = [q for q in server.requests if "watch=true" in q]
    assert watches[0].count("resourceVersion=") == 1, "watched from the list's resourceVersion"


def test_an_expired_continue_token_lists_again_from_the_start(
    server: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server.expire_continue_tokens(1)
    cache = start_cache(server, tmp_path, page_objects=1)
    try:
        eventually(lambda: names(cache) == {"a", "b"}, 10, "names(cache) == {'a', 'b'}")
    finally:
        cache.stop()
    lists = [q for q in server.requests if "watch=true" not in q]
    assert ["continue=" in q for q in lists] == [False, True, False, True], lists
    expired = [r for r in caplog.records if "410 Gone" in r.getMessage()]
    assert [r.expired for r in expired] == ["the continue token of the list of pods"]  # type: ignore[attr-defined]


def test_only_what_attribution_uses_of_a_pod_is_kept(server: FakeKube, tmp_path: Path) -> None:
    big = tenant_pod("tenant-1", pod_uid(101), container_id(101))
    big["metadata"]["annotations"] = {"note": "y" * 100_000}  # type: ignore[index]
    server.put("pods", big)
    cache = start_cache(server, tmp_path, pod_labels=re.compile("team"))
    try:
        eventually(lambda: "tenant-1" in names(cache), 30, "the large pod listed")
        kept = cache.view().by_name[("default", "tenant-1")]
    finally:
        cache.stop()
    assert kept.labels == {"team": "t", "pod-template-hash": "abc"}, "500 other labels dropped"
    assert kept.workload == Workload("Deployment", "tenant")
    assert kept.containers == {container_id(101): "main"}
    assert kept.images == (("main", "example.com/app:1"),)


def test_a_pods_containers_are_read_up_to_a_limit() -> None:
    document = pod(
        "many", pod_uid(1), containers={f"c{n}": container_id(n) for n in range(MAX_CONTAINERS + 5)}
    )
    read = JsonStream([json.dumps(document).encode()], max_value_bytes=2**20, what="x")
    parsed = pod_from_api(read.value(pod_shape()))  # type: ignore[arg-type]
    assert len(parsed.containers) == MAX_CONTAINERS
    assert len(parsed.images) == MAX_CONTAINERS
    assert parsed.containers[container_id(0)] == "c0"
