"""A stand-in for the Kubernetes API's ConfigMap endpoints, speaking the API's own JSON.

`add_configmap_routes(app)` adds these routes to an aiohttp Application and returns the
`ConfigMapStore` behind them:

    GET  /api/v1/namespaces/{namespace}/configmaps           ConfigMapList
    POST /api/v1/namespaces/{namespace}/configmaps           201 Created | 409 AlreadyExists
    GET  /api/v1/namespaces/{namespace}/configmaps/{name}    ConfigMap | 404 NotFound
    PUT  /api/v1/namespaces/{namespace}/configmaps/{name}    200 | 404 | 409 Conflict

As the real API server does, every write bumps a cluster-wide `resourceVersion`; a PUT whose
`metadata.resourceVersion` is not the stored one answers 409 Conflict; keys must match
`[-._a-zA-Z0-9]+` and all data together must stay within 1 MiB (422 Invalid otherwise); errors
are `Status` objects. Tests make trouble on purpose with `inject_conflicts` (another writer
changes the ConfigMap just before the next writes, so they meet a real conflict) and
`inject_failures` (answer the next requests with these statuses, e.g. 503 or 403).
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

API_PREFIX: Final = "/api/v1/namespaces/{namespace}/configmaps"
MAX_DATA_BYTES: Final = 1024 * 1024
_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")
_REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status(code: int, message: str, *, reason: str | None = None, name: str = "") -> web.Response:
    """A `Status` error body, as the API server sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if name:
        body["details"] = {"name": name, "kind": "configmaps"}
    return web.json_response(body, status=code)


@dataclass
class ConfigMapStore:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of every request, in order."""
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _conflicts: int = 0
    _failures: list[int] = field(default_factory=list)

    def put(
        self,
        namespace: str,
        name: str,
        data: dict[str, str],
        *,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create or replace a ConfigMap directly, as another client would have."""
        existing = self.objects.get((namespace, name))
        metadata = {
            "name": name,
            "namespace": namespace,
            "uid": existing["metadata"]["uid"] if existing else str(uuid.uuid4()),
            "resourceVersion": str(next(self._versions)),
            "creationTimestamp": "2026-01-01T00:00:00Z",
        }
        if labels:
            metadata["labels"] = dict(labels)
        stored = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": metadata, "data": dict(data)}
        self.objects[(namespace, name)] = stored
        return stored

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))

    def inject_conflicts(self, count: int) -> None:
        """Before each of the next `count` writes, another writer changes (or creates) the
        ConfigMap: the write then carries a stale resourceVersion (or finds it exists)."""
        self._conflicts += count

    def inject_failures(self, *codes: int) -> None:
        """Answer the next requests, one each, with these HTTP statuses."""
        self._failures.extend(codes)

    def _other_writer(self, namespace: str, name: str) -> None:
        self._conflicts -= 1
        existing = self.get(namespace, name)
        data = dict(existing.get("data") or {}) if existing else {}
        data[f"other-writer-{next(self._versions)}.json"] = "{}"
        self.put(namespace, name, data)

    async def list(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        items = [obj for (ns, _), obj in sorted(self.objects.items()) if ns == namespace]
        return web.json_response(
            {
                "kind": "ConfigMapList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": items,
            }
        )

    async def read(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        stored = self.get(namespace, name)
        if stored is None:
            return status(404, f'configmaps "{name}" not found', name=name)
        return web.json_response(stored)

    async def create(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        body = await request.json()
        name = str((body.get("metadata") or {}).get("name", ""))
        if self._conflicts > 0:
            self._other_writer(namespace, name)
        problem = _validate(body, namespace, name)
        if problem is not None:
            return problem
        if self.get(namespace, name) is not None:
            return status(
                409, f'configmaps "{name}" already exists', reason="AlreadyExists", name=name
            )
        metadata = body.get("metadata") or {}
        stored = self.put(namespace, name, body.get("data") or {}, labels=metadata.get("labels"))
        return web.json_response(stored, status=201)

    async def replace(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        body = await request.json()
        if self._conflicts > 0:
            self._other_writer(namespace, name)
        problem = _validate(body, namespace, name)
        if problem is not None:
            return problem
        stored = self.get(namespace, name)
        if stored is None:
            return status(404, f'configmaps "{name}" not found', name=name)
        sent_version = (body.get("metadata") or {}).get("resourceVersion")
        if sent_version and sent_version != stored["metadata"]["resourceVersion"]:
            return status(
                409,
                f'Operation cannot be fulfilled on configmaps "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
            )
        labels = (body.get("metadata") or {}).get("labels")
        return web.json_response(self.put(namespace, name, body.get("data") or {}, labels=labels))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        is_configmaps = "/configmaps" in request.path
        if is_configmaps and request.path.startswith("/api/v1/namespaces/") and self._failures:
            code = self._failures.pop(0)
            return status(code, f"injected failure {code}")
        response: web.StreamResponse = await handler(request)
        return response


def _validate(body: object, namespace: str, name: str) -> web.Response | None:
    """The API server's own checks on a ConfigMap body, as 400/422 Status answers."""
    if not isinstance(body, dict) or body.get("kind", "ConfigMap") != "ConfigMap":
        return status(400, "the body is not a ConfigMap")
    metadata = body.get("metadata") or {}
    if metadata.get("name") != name or not name:
        return status(400, "the name of the object does not match the name on the URL")
    if metadata.get("namespace", namespace) != namespace:
        return status(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    data = body.get("data") or {}
    bad = [key for key in data if not _KEY.fullmatch(key)]
    if bad:
        return status(
            422, f'ConfigMap "{name}" is invalid: data[{bad[0]}]: Invalid value', name=name
        )
    size = sum(len(key) + len(str(value).encode()) for key, value in data.items())
    if size > MAX_DATA_BYTES:
        return status(
            422,
            f'ConfigMap "{name}" is invalid: []: Too long: must have at most {MAX_DATA_BYTES} bytes',
            name=name,
        )
    return None


def add_configmap_routes(
    app: web.Application, store: ConfigMapStore | None = None
) -> ConfigMapStore:
    """Serve ConfigMaps from `store` (a new, empty one by default) on `app`; returns the store."""
    store = store if store is not None else ConfigMapStore()
    app.middlewares.append(store.middleware)
    app.router.add_get(API_PREFIX, store.list)
    app.router.add_post(API_PREFIX, store.create)
    app.router.add_get(API_PREFIX + "/{name}", store.read)
    app.router.add_put(API_PREFIX + "/{name}", store.replace)
    return store
