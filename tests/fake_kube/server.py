"""A stand-in Kubernetes API server for the tests: aiohttp, in a thread of its own, speaking the
API's JSON for list and `watch=true` requests, and able to misbehave on demand.

Collections (pods here; more in sibling modules) are registered with `FakeKube.serve(...)` and
get both the cluster-wide and the namespaced path. Every change takes the next resourceVersion
from one server-wide counter and is kept in a history, so that a watch from an older
resourceVersion replays what it missed, and a watch from before `expire()` gets `410 Gone` —
as a status line or as an ERROR event, like the real server.

Lists are paged as the real server pages them: `limit=N` answers the first N objects in key
order (namespace, then name) with an opaque `metadata.continue` token while more remain (and
`remainingItemCount` when no selector was given, as the real server only counts then); every
page of one list is cut from the snapshot the first page was taken at, and carries its
resourceVersion. A continue token from before `expire()` (etcd compacted that revision) is
answered `410 Expired`, as is the next continue request after `expire_continue_tokens()`.

Single objects are served by name too (`GET <collection>/<name>`). Acting as an older cluster,
it serves none of the API groups in `withheld` (`resource.k8s.io` before Kubernetes 1.34): every
path under `/apis/<group>/` answers 404 as the real server does; a resource in `forbidden`
answers 403, as RBAC without a rule for it does.

Faults: `drop_connections()`, `expire()`, `answer_gone(n)`, `expire_continue_tokens(n)`,
`send_garbage()`, `go_away()` / `come_back()`, a `delay` before every answer, and a `failure`
status answered to every request.
Test code calls the synchronous methods from its own thread; they run on the server's loop and
return when done.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import yaml
from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator
    from pathlib import Path

    from aiohttp.typedefs import Handler

GARBAGE: Final = b"{this is not json\n"
_CLOSE: Final = object()
CONTINUE_EXPIRED: Final = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter."
)
"""What the real server says when etcd compacted the revision a continue token was cut at."""


@dataclass(frozen=True)
class Collection:
    """One kind of object the server stores and serves."""

    plural: str
    kind: str
    prefix: str = "/api/v1"
    fields: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    """Field selectors the server supports, beyond metadata.name and metadata.namespace."""

    def field_value(self, obj: dict[str, Any], name: str) -> str | None:
        metadata = obj.get("metadata", {})
        if name == "metadata.name":
            return str(metadata.get("name", ""))
        if name == "metadata.namespace":
            return str(metadata.get("namespace", ""))
        getter = self.fields.get(name)
        return getter(obj) if getter is not None else None


@dataclass
class _Change:
    version: int
    collection: str
    type: str
    obj: dict[str, Any]


@dataclass(eq=False)
class _Watcher:
    collection: Collection
    matches: Callable[[dict[str, Any]], bool]
    queue: asyncio.Queue[object] = field(default_factory=asyncio.Queue)


class FakeKube:
    def __init__(self) -> None:
        self.delay = 0.0
        """Seconds to wait before answering any request (a slow API server)."""
        self.failure: int | None = None
        """Answer every request with this HTTP status (e.g. 500) while set."""
        self.gone_as_event = False
        """Answer an expired watch with 200 and an ERROR event instead of a 410 status line."""
        self.requests: list[str] = []
        """Every request path with its query, in order."""
        self.calls: list[tuple[str, str]] = []
        """(method, path) of every request, writes included, in order."""
        self.route_hooks: list[Callable[[web.Application], None]] = []
        """More routes (`tests/fake_kube/writes.py`), added each time the server listens."""
        self.withheld: set[str] = set()
        """API groups not served at all (`resource.k8s.io`): an older cluster."""
        self.forbidden: set[str] = set()
        """Resources (plurals) every request for is refused with 403."""
        self._collections: dict[str, Collection] = {}
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._history: list[_Change] = []
        self._version = 1000
        self._expired_below = 0
        self._gone_answers = 0
        self._continues_gone = 0
        self._snapshots: dict[int, list[dict[str, Any]]] = {}
        """The objects of each paged list, in key order, as its first page saw them."""
        self._snapshot_ids = itertools.count(1)
        self._watchers: set[_Watcher] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------

    def serve(self, collection: Collection) -> None:
        self._collections[collection.plural] = collection
        self._objects.setdefault(collection.plural, {})

    def start(self) -> FakeKube:
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        self._call(self._shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, *, token: str = "fake-token") -> Path:
        """A kubeconfig file that points the real client at this server."""
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "gpuscope", "user": {"token": token}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "gpuscope"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # -- objects --------------------------------------------------------------------------------

    def put(self, plural: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (ADDED or MODIFIED for watchers)."""
        self._call(self._change(plural, obj, delete=False))

    async def store(self, plural: str, obj: dict[str, Any]) -> None:
        """`put` from a handler running on the server's own loop."""
        await self._change(plural, obj, delete=False)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        obj = self._objects[plural].get((namespace, name))
        if obj is None:
            raise KeyError(f"{plural} {namespace}/{name}")
        self._call(self._change(plural, obj, delete=True))

    def objects(self, plural: str) -> list[dict[str, Any]]:
        return list(self._objects[plural].values())

    # -- faults ---------------------------------------------------------------------------------

    def drop_connections(self) -> None:
        """End every open watch stream abruptly."""
        self._call(self._broadcast(_CLOSE))

    def watching(self, plural: str) -> int:
        """How many watch streams of `plural` are open now: a test that writes into the streams
        waits for one, since a client's watch opens a moment after its list has answered."""
        return sum(1 for watcher in list(self._watchers) if watcher.collection.plural == plural)

    def send_garbage(self) -> None:
        """Write a line that is not JSON into every open watch stream."""
        self._call(self._broadcast(GARBAGE))

    def send_endless_line(self, size: int) -> None:
        """Write `size` bytes without a newline into every open watch stream (an event that
        never ends)."""
        self.send_raw(b"x" * size)

    def send_raw(self, data: bytes) -> None:
        """Write `data` as it is into every open watch stream."""
        self._call(self._broadcast(data))

    def expire(self) -> None:
        """Forget the history (as etcd compaction does): open watches get a 410 ERROR event and
        watching from any resourceVersion seen so far answers 410 Gone."""

        async def expire() -> None:
            self._expired_below = self._version + 1
            self._history.clear()
            await self._broadcast(_gone_event(self._version))

        self._call(expire())

    def answer_gone(self, times: int = 1) -> None:
        """Answer the next `times` watch requests with 410 Gone, whatever their version."""
        self._gone_answers += times

    def expire_continue_tokens(self, times: int = 1) -> None:
        """Answer the next `times` continue requests with 410 Expired, whatever their token."""
        self._continues_gone += times

    def go_away(self) -> None:
        """Stop listening and close every connection (the API server is down)."""
        self._call(self._shut())

    def come_back(self) -> None:
        """Listen again on the same port."""
        self._call(self._listen())

    @contextlib.contextmanager
    def away(self) -> Iterator[None]:
        self.go_away()
        try:
            yield
        finally:
            self.come_back()

    # -- the server -----------------------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if not self._thread.is_alive():  # not started yet: set up state right here
            self._loop.run_until_complete(coroutine)
            return
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> None:
        app = web.Application(middlewares=[self._older_cluster])
        for hook in self.route_hooks:
            hook(app)
        for collection in self._collections.values():
            handler = self._handler(collection)
            one = self._one(collection)
            app.router.add_get(f"{collection.prefix}/{collection.plural}", handler)
            app.router.add_get(
                f"{collection.prefix}/namespaces/{{namespace}}/{collection.plural}", handler
            )
            app.router.add_get(f"{collection.prefix}/{collection.plural}/{{name}}", one)
            app.router.add_get(
                f"{collection.prefix}/namespaces/{{namespace}}/{collection.plural}/{{name}}", one
            )
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _shut(self) -> None:
        if self._runner is not None:
            await self._broadcast(_CLOSE)
            await self._runner.cleanup()
            self._runner = None

    async def _broadcast(self, item: object) -> None:
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(item)

    async def _change(self, plural: str, obj: dict[str, Any], *, delete: bool) -> None:
        collection = self._collections[plural]
        self._version += 1
        obj = json.loads(json.dumps(obj))  # a private copy
        metadata = obj.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._version)
        key = (metadata.get("namespace", ""), metadata["name"])
        store = self._objects[plural]
        if delete:
            store.pop(key, None)
            kind = "DELETED"
        else:
            kind = "MODIFIED" if key in store else "ADDED"
            store[key] = obj
        obj.setdefault("kind", collection.kind)
        obj.setdefault("apiVersion", collection.prefix.removeprefix("/api/").removeprefix("/apis/"))
        change = _Change(self._version, plural, kind, obj)
        self._history.append(change)
        for watcher in list(self._watchers):
            if watcher.collection.plural == plural and watcher.matches(obj):
                watcher.queue.put_nowait(change)

    @web.middleware
    async def _older_cluster(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """What a cluster answers for an API group it does not serve: the server's plain 404."""
        self.calls.append((request.method, request.path))
        group = request.path.split("/")[2] if request.path.startswith("/apis/") else ""
        if group in self.withheld:
            self.requests.append(request.path_qs)
            return web.Response(status=404, text="404 page not found\n")
        return await handler(request)

    def _one(
        self, collection: Collection
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def get(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path_qs)
            refused = self._refused(collection, request)
            if refused is not None:
                return refused
            key = (request.match_info.get("namespace", ""), request.match_info["name"])
            obj = self._objects[collection.plural].get(key)
            if obj is None:
                return _status(404, "NotFound", f'{collection.plural} "{key[1]}" not found')
            return web.json_response(obj)

        return get

    def _refused(self, collection: Collection, request: web.Request) -> web.Response | None:
        """The answer to a request refused before it is looked at, if it is."""
        if self.failure is not None:
            return _status(self.failure, "InternalError", "the stand-in was told to fail")
        if request.headers.get("Authorization") is None:
            return _status(401, "Unauthorized", "no bearer token")
        if collection.plural in self.forbidden:
            return _status(403, "Forbidden", f"cannot get resource {collection.plural!r}")
        return None

    def _handler(
        self, collection: Collection
    ) -> Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path_qs)
            if self.delay:
                await asyncio.sleep(self.delay)
            refused = self._refused(collection, request)
            if refused is not None:
                return refused
            try:
                matches = _selector(collection, request)
            except ValueError as error:
                return _status(400, "BadRequest", str(error))
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(collection, matches, request)
            return self._list(collection, matches, request)

        return handle

    def _list(
        self,
        collection: Collection,
        matches: Callable[[dict[str, Any]], bool],
        request: web.Request,
    ) -> web.Response:
        """A list, or one page of it."""
        token = request.query.get("continue")
        if token:
            try:
                position = json.loads(base64.b64decode(token, validate=True))
                version, snapshot, start = position["rv"], position["id"], position["start"]
            except (ValueError, binascii.Error, KeyError, TypeError):
                return _status(400, "BadRequest", "invalid continue token")
            if self._continues_gone > 0 or version < self._expired_below:
                self._continues_gone = max(self._continues_gone - 1, 0)
                return _status(410, "Expired", CONTINUE_EXPIRED)
            items = self._snapshots[snapshot][start:]
        else:
            version, snapshot, start = self._version, 0, 0
            items = sorted(
                (obj for obj in self._objects[collection.plural].values() if matches(obj)),
                key=lambda obj: (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]),
            )
        metadata: dict[str, Any] = {"resourceVersion": str(version)}
        limit = int(request.query.get("limit") or 0)
        if 0 < limit < len(items):
            if not snapshot:
                snapshot = next(self._snapshot_ids)
                self._snapshots[snapshot] = items
            position = {"rv": version, "id": snapshot, "start": start + limit}
            metadata["continue"] = base64.b64encode(json.dumps(position).encode()).decode()
            if not request.query.get("fieldSelector") and not request.query.get("labelSelector"):
                metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return web.json_response(
            {
                "kind": f"{collection.kind}List",
                "apiVersion": collection.prefix.removeprefix("/api/").removeprefix("/apis/"),
                "metadata": metadata,
                "items": items,
            }
        )

    async def _watch(
        self,
        collection: Collection,
        matches: Callable[[dict[str, Any]], bool],
        request: web.Request,
    ) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self._version)
        gone = since < self._expired_below or self._gone_answers > 0
        if self._gone_answers > 0:
            self._gone_answers -= 1
        if gone and not self.gone_as_event:
            return _status(410, "Expired", f"too old resource version: {since}")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if gone:
            await response.write(_line(_gone_event(since)))
            return response
        watcher = _Watcher(collection, matches)
        for change in self._history:
            if (
                change.version > since
                and change.collection == collection.plural
                and matches(change.obj)
            ):
                watcher.queue.put_nowait(change)
        self._watchers.add(watcher)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        item = await asyncio.wait_for(watcher.queue.get(), 10.0)
                    except TimeoutError:
                        if bookmarks:
                            await response.write(_line(_bookmark(collection, self._version)))
                        continue
                    if item is _CLOSE:
                        if request.transport is not None:
                            request.transport.abort()  # abruptly, no clean end of the stream
                        return response
                    if isinstance(item, bytes):
                        await response.write(item)
                    elif isinstance(item, _Change):
                        await response.write(_line({"type": item.type, "object": item.obj}))
                    elif isinstance(item, dict):  # an ERROR event ends the watch
                        await response.write(_line(item))
                        break
        except TimeoutError:
            pass  # the watch ran its timeoutSeconds: end the stream cleanly
        except ConnectionResetError:
            return response  # the client went away
        finally:
            self._watchers.discard(watcher)
        await response.write_eof()
        return response


def _selector(collection: Collection, request: web.Request) -> Callable[[dict[str, Any]], bool]:
    wanted: list[tuple[str, str]] = []
    namespace = request.match_info.get("namespace")
    if namespace:
        wanted.append(("metadata.namespace", namespace))
    for term in filter(None, request.query.get("fieldSelector", "").split(",")):
        name, sep, value = term.partition("=")
        if not sep or name.endswith("!"):
            raise ValueError(f"field selector term {term!r}: the stand-in knows only = and ==")
        value = value.removeprefix("=")
        if name not in ("metadata.name", "metadata.namespace", *collection.fields):
            raise ValueError(f'field label not supported: "{name}"')
        wanted.append((name, value))
    return lambda obj: all(collection.field_value(obj, name) == value for name, value in wanted)


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


def _gone_event(version: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {version}",
            "reason": "Expired",
            "code": 410,
        },
    }


def _bookmark(collection: Collection, version: int) -> dict[str, Any]:
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": collection.kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(version)},
        },
    }
