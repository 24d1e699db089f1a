"""Merging profiles into a ConfigMap: the real Kubernetes client against the API stand-in."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web
from kubernetes import client

from exporter.calibrate.configmap import (
    MAX_KUBECONFIG_BYTES,
    ConfigMapError,
    api_client,
    check_access,
    merge_profile,
)
from tests.fake_kube.configmaps import ConfigMapStore, add_configmap_routes
from tests.yaml_bombs import alias_bomb

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from aiohttp.test_utils import TestServer

NAMESPACE, NAME = "gpuscope", "gpuscope-calibration"
NO_WAIT = (0.0, 0.0, 0.0)


@pytest.fixture
async def kube(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> tuple[ConfigMapStore, client.CoreV1Api]:
    app = web.Application()
    store = add_configmap_routes(app)
    server = await aiohttp_server(app)
    configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
    return store, client.CoreV1Api(client.ApiClient(configuration))


async def merge(api: client.CoreV1Api, key: str, text: str, **kwargs: Any) -> str:
    return await asyncio.to_thread(
        merge_profile, api, NAMESPACE, NAME, key, text, delays=NO_WAIT, **kwargs
    )


async def test_creates_the_configmap_when_missing(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    assert await merge(api, "nvidia-l4.json", '{"model": "NVIDIA L4"}') == "created"
    stored = store.get(NAMESPACE, NAME)
    assert stored is not None
    assert stored["data"] == {"nvidia-l4.json": '{"model": "NVIDIA L4"}'}
    assert stored["metadata"]["labels"]["app.kubernetes.io/component"] == "calibration"
    assert [method for method, _ in store.requests] == ["GET", "POST"]


async def test_update_keeps_other_models_keys(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    store.put(NAMESPACE, NAME, {"nvidia-l4.json": "l4", "nvidia-h100-80gb-hbm3.json": "old"})
    assert await merge(api, "nvidia-h100-80gb-hbm3.json", "new") == "updated"
    stored = store.get(NAMESPACE, NAME)
    assert stored is not None
    assert stored["data"] == {"nvidia-l4.json": "l4", "nvidia-h100-80gb-hbm3.json": "new"}
    assert [method for method, _ in store.requests] == ["GET", "PUT"]


async def test_a_conflict_is_retried_from_a_fresh_read_without_losing_the_other_write(
    kube: tuple[ConfigMapStore, client.CoreV1Api], caplog: pytest.LogCaptureFixture
) -> None:
    store, api = kube
    store.put(NAMESPACE, NAME, {"nvidia-l4.json": "l4"})
    store.inject_conflicts(2)
    with caplog.at_level(logging.WARNING):
        assert await merge(api, "b200.json", "mine") == "updated"
    data = (store.get(NAMESPACE, NAME) or {})["data"]
    assert data["b200.json"] == "mine"
    assert data["nvidia-l4.json"] == "l4"
    assert sum(key.startswith("other-writer-") for key in data) == 2  # both concurrent writes kept
    assert [method for method, _ in store.requests] == ["GET", "PUT"] * 3
    attempts = [record.attempt for record in caplog.records if hasattr(record, "attempt")]
    assert attempts == ["#2/4", "#3/4"]


async def test_losing_the_create_race_turns_into_an_update(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    store.inject_conflicts(1)  # someone creates it between our 404 and our POST
    assert await merge(api, "l4.json", "mine") == "updated"
    data = (store.get(NAMESPACE, NAME) or {})["data"]
    assert data["l4.json"] == "mine"
    assert len(data) == 2
    assert [method for method, _ in store.requests] == ["GET", "POST", "GET", "PUT"]


async def test_conflicts_beyond_the_retries_fail_with_one_line(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    store.put(NAMESPACE, NAME, {})
    store.inject_conflicts(10)
    with pytest.raises(ConfigMapError) as raised:
        await merge(api, "l4.json", "mine")
    message = str(raised.value)
    assert message.startswith(f"cannot write ConfigMap {NAMESPACE}/{NAME}: 409 Conflict: ")
    assert "the object has been modified" in message
    assert "\n" not in message


async def test_transient_failures_are_retried_and_forbidden_is_final(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    store.inject_failures(503, 429)
    assert await merge(api, "l4.json", "x") == "created"
    store.inject_failures(403)
    with pytest.raises(ConfigMapError, match=r"403 Forbidden: injected failure 403"):
        await merge(api, "l4.json", "y")
    assert (store.get(NAMESPACE, NAME) or {})["data"] == {"l4.json": "x"}


async def test_invalid_data_is_refused_by_the_api_and_not_retried(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    with pytest.raises(ConfigMapError, match=r"422 Unprocessable Entity: .*data\[bad key\]"):
        await merge(api, "bad key", "x")
    assert [method for method, _ in store.requests] == ["GET", "POST"]


async def test_access_check_fails_early_only_when_forbidden(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    await asyncio.to_thread(check_access, api, NAMESPACE, NAME)  # 404 is fine: it will be created
    store.inject_failures(403)
    with pytest.raises(
        ConfigMapError, match=r"cannot read ConfigMap gpuscope/gpuscope-calibration: 403"
    ):
        await asyncio.to_thread(check_access, api, NAMESPACE, NAME)


async def test_the_stand_in_lists_in_the_api_shape(
    kube: tuple[ConfigMapStore, client.CoreV1Api],
) -> None:
    store, api = kube
    store.put(NAMESPACE, NAME, {"a.json": json.dumps({"x": 1})})
    store.put("other", NAME, {})
    listed = await asyncio.to_thread(api.list_namespaced_config_map, NAMESPACE)
    assert [item.metadata.name for item in listed.items] == [NAME]
    assert listed.items[0].data == {"a.json": '{"x": 1}'}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (alias_bomb().encode(), "expands to more than 100,000 values (aliases repeated?)"),
        (b"\x89PNG\r\n\x1a\n\x00", "not UTF-8 text (byte 0 is 0x89)"),
        (b"clusters: []\nclusters: []\n", "a key appears twice in one mapping (line 2)"),
        (b"#" * (MAX_KUBECONFIG_BYTES + 1), "larger than 4 MiB (the limit)"),
        (b"- a list\n", "expected a mapping, got a list"),
        (b"users: [{name: u, user: {token: s3cr3t-token\n", "not valid YAML at line 2"),
    ],
    ids=["alias-bomb", "binary", "duplicate-key", "oversized", "a-list", "secret-not-quoted"],
)
def test_a_hostile_kubeconfig_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, problem: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    expected = f"cannot load the Kubernetes configuration: {path}: {problem}"
    with pytest.raises(ConfigMapError) as raised:
        api_client(path)
    assert str(raised.value) == expected
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{path}")  # a list, as kubectl reads
    with pytest.raises(ConfigMapError) as raised:
        api_client(None)
    assert str(raised.value) == expected


def test_a_kubeconfig_of_the_wrong_shape_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: 3\ncontexts: {a: b}\ncurrent-context: a\n")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigMapError, match=r"^cannot load the Kubernetes configuration: ") as e:
        api_client(path)
    assert "\n" not in str(e.value)
