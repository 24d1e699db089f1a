"""The stand-in API server's writes: a node's status and Events, checked as the real server
checks them, and recorded.

`serve_writes(api, node)` stores the Node `node` and adds these routes:

    GET   /api/v1/nodes/{name}/status                                 the Node
    PATCH /api/v1/nodes/{name}/status                                 strategic merge or merge patch
    POST  /apis/events.k8s.io/v1/namespaces/{namespace}/events        201 | 409 | 422
    PATCH /apis/events.k8s.io/v1/namespaces/{namespace}/events/{name} merge patch (a series)

A strategic merge patch merges `status.conditions` by `type` (the list's merge key), maps
recursively, and replaces other lists; a JSON merge patch (RFC 7386) replaces lists whole and,
when it carries `metadata.resourceVersion`, answers 409 Conflict unless it is the stored one.
Events are refused (422 Invalid) as the API server refuses them: no name or generateName, an
`eventTime` not a MicroTime (`2006-01-02T15:04:05.000000Z`), no `reportingController`,
`reportingInstance`, `action` or `reason`, a note over 1 kB, a `type` other than Normal or
Warning, a `regarding` without kind and name or in another namespace, a series with a count under
2 or no `lastObservedTime`. `fail_writes` answers the next writes with the statuses it holds.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from tests.fake_kube.configmaps import status
from tests.fake_kube.server import Collection

if TYPE_CHECKING:
    from tests.fake_kube.server import FakeKube

NODES: Final = Collection("nodes", "Node")
EVENTS: Final = Collection("events", "Event", prefix="/apis/events.k8s.io/v1")
MICRO_TIME: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
TIME: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
QUALIFIED: Final = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
STRATEGIC: Final = "application/strategic-merge-patch+json"
MERGE: Final = "application/merge-patch+json"


class ClusterWrites:
    """The routes above over `api`'s store, and what was written through them."""

    def __init__(self, api: FakeKube) -> None:
        self.api = api
        self.node_patches: list[tuple[str, dict[str, Any]]] = []
        """(content type, body) of every node status patch accepted, in order."""
        self.event_writes: list[tuple[str, dict[str, Any]]] = []
        """(method, body) of every Event write accepted, in order."""
        self.fail_writes: list[int] = []
        self.refused: list[tuple[int, str]] = []
        """(status, message) of every write refused as invalid or in conflict."""

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.api.objects("nodes") if n["metadata"]["name"] == name)

    def condition(self, node: str, kind: str) -> dict[str, Any] | None:
        conditions = self.node(node).get("status", {}).get("conditions", [])
        return next((c for c in conditions if c.get("type") == kind), None)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.api.objects("events") if reason in (None, e.get("reason"))]

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/nodes/{name}/status", self._get_status)
        app.router.add_patch("/api/v1/nodes/{name}/status", self._patch_status)
        app.router.add_post(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events", self._post_event
        )
        app.router.add_patch(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}", self._patch_event
        )

    # -- nodes ----------------------------------------------------------------------------------

    def _failed(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") is None:
            return status(401, "no bearer token")
        if self.fail_writes and request.method != "GET":
            return status(self.fail_writes.pop(0), "the stand-in was told to fail")
        return None

    async def _get_status(self, request: web.Request) -> web.Response:
        failed = self._failed(request)
        if failed is not None:
            return failed
        try:
            return web.json_response(self.node(request.match_info["name"]))
        except StopIteration:
            return status(404, f'nodes "{request.match_info["name"]}" not found')

    async def _patch_status(self, request: web.Request) -> web.Response:
        failed = self._failed(request)
        if failed is not None:
            return failed
        name = request.match_info["name"]
        try:
            node = self.node(name)
        except StopIteration:
            return status(404, f'nodes "{name}" not found')
        patch = await request.json()
        kind = request.content_type
        if kind == STRATEGIC:
            merged = _strategic(node, patch)
        elif kind == MERGE:
            wanted = patch.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
                return self._refuse(409, f'Operation cannot be fulfilled on nodes "{name}"')
            merged = _merge(node, patch)
        else:
            return status(415, f"unsupported patch type {kind!r}")
        for condition in merged.get("status", {}).get("conditions", []):
            problem = _condition_problem(condition)
            if problem:
                return self._refuse(422, problem)
        if set(patch) - {"status", "metadata"}:
            return self._refuse(422, "a status patch may change the status only")
        self.node_patches.append((kind, patch))
        await self.api.store("nodes", merged)
        return web.json_response(self.node(name))

    def _refuse(self, code: int, message: str) -> web.Response:
        self.refused.append((code, message))
        return status(code, message)

    # -- events ---------------------------------------------------------------------------------

    async def _post_event(self, request: web.Request) -> web.Response:
        failed = self._failed(request)
        if failed is not None:
            return failed
        namespace = request.match_info["namespace"]
        event = await request.json()
        problem = _event_problem(event, namespace)
        if problem:
            return self._refuse(422, problem)
        metadata = event["metadata"]
        metadata.setdefault("namespace", namespace)
        if not metadata.get("name"):
            metadata["name"] = metadata["generateName"] + f"{len(self.event_writes):05x}"
        if any(e["metadata"]["name"] == metadata["name"] for e in self.events()):
            return self._refuse(409, f'events.events.k8s.io "{metadata["name"]}" already exists')
        self.event_writes.append(("POST", event))
        await self.api.store("events", event)
        return web.json_response(event, status=201)

    async def _patch_event(self, request: web.Request) -> web.Response:
        failed = self._failed(request)
        if failed is not None:
            return failed
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        found = [
            e
            for e in self.events()
            if e["metadata"]["name"] == name and e["metadata"]["namespace"] == namespace
        ]
        if not found:
            return status(404, f'events.events.k8s.io "{name}" not found')
        if request.content_type not in (MERGE, STRATEGIC):
            return status(415, f"unsupported patch type {request.content_type!r}")
        patch = await request.json()
        merged = _merge(found[0], patch)
        problem = _event_problem(merged, namespace)
        if problem:
            return self._refuse(422, problem)
        self.event_writes.append(("PATCH", patch))
        await self.api.store("events", merged)
        return web.json_response(merged)


def serve_writes(api: FakeKube, node: dict[str, Any]) -> ClusterWrites:
    """Serve nodes (holding `node`) and Events on `api`, before it starts."""
    api.serve(NODES)
    api.serve(EVENTS)
    api.put("nodes", node)
    writes = ClusterWrites(api)
    api.route_hooks.append(writes.add_routes)
    return writes


def node_object(name: str, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Node as the kubelet keeps it: a Ready condition, a label, an annotation, a taint."""
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [{"key": "gpu", "value": "true", "effect": "PreferNoSchedule"}]},
        "status": {
            "conditions": conditions
            or [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                }
            ],
            "capacity": {"nvidia.com/gpu": "3"},
        },
    }


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merged, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return json.loads(json.dumps(merged))


def _strategic(target: Any, patch: Any, path: str = "") -> Any:
    """Kubernetes' strategic merge, for what a node's status holds: `status.conditions` merged
    by `type`, maps recursively, other lists replaced."""
    if isinstance(patch, list) and path == ".status.conditions":
        merged = [dict(item) for item in (target or [])]
        for item in patch:
            at = next((i for i, c in enumerate(merged) if c.get("type") == item.get("type")), None)
            if at is None:
                merged.append(item)
            else:
                merged[at] = _strategic(merged[at], item, f"{path}[]")
        return merged
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _strategic(merged.get(key), value, f"{path}.{key}")
    return json.loads(json.dumps(merged))


def _condition_problem(condition: dict[str, Any]) -> str:
    if not condition.get("type"):
        return "status.conditions.type: Required value"
    if condition.get("status") not in ("True", "False", "Unknown"):
        return f"status.conditions.status: Unsupported value: {condition.get('status')!r}"
    for field in ("lastTransitionTime", "lastHeartbeatTime"):
        if field in condition and not TIME.fullmatch(str(condition[field])):
            return f"status.conditions.{field}: not an RFC 3339 time: {condition[field]!r}"
    return ""


def _event_problem(event: dict[str, Any], namespace: str) -> str:
    metadata = event.get("metadata") or {}
    if not metadata.get("name") and not metadata.get("generateName"):
        return "metadata.name: Required value: name or generateName is required"
    if metadata.get("namespace", namespace) != namespace:
        return "metadata.namespace: does not match the namespace of the request"
    if not MICRO_TIME.fullmatch(str(event.get("eventTime", ""))):
        return f"eventTime: Invalid value: {event.get('eventTime')!r}: not a MicroTime"
    controller = str(event.get("reportingController") or "")
    if not controller or len(controller) > 128 or not QUALIFIED.fullmatch(controller):
        return f"reportingController: Invalid value: {controller!r}"
    for field in ("reportingInstance", "action", "reason"):
        value = str(event.get(field) or "")
        if not value or len(value) > 128:
            return f"{field}: Required value (at most 128 characters)"
    if len(str(event.get("note", "")).encode()) > 1024:
        return "note: Too long: can have at most 1024 bytes"
    if event.get("type") not in ("Normal", "Warning"):
        return f"type: Unsupported value: {event.get('type')!r}"
    regarding = event.get("regarding") or {}
    if not regarding.get("kind") or not regarding.get("name"):
        return "regarding: kind and name are required"
    if regarding.get("namespace", namespace) != namespace:
        return "regarding.namespace: does not match event.namespace"
    series = event.get("series")
    if series is not None and (
        int(series.get("count", 0)) < 2
        or not MICRO_TIME.fullmatch(str(series.get("lastObservedTime", "")))
    ):
        return "series: count must be at least 2 and lastObservedTime a MicroTime"
    return ""
