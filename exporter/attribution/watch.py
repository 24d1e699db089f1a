"""List + watch of one kind of Kubernetes object, kept current in a cache, never polled per scrape.

One dedicated thread per kind lists `<path>?fieldSelector=<selector>` in pages (`limit` and
`continue`, as client-go's pager does), then watches from the list's resourceVersion, applying
each event to the cache; the sampler's worker thread takes an immutable index of it once per
cycle (`view`), rebuilt only after a change. When the API server is away the last known objects
stay, reconnection follows `BACKOFF_SECONDS`, and a watch answered with `410 Gone` (in the status
line or as an ERROR event), or a list whose continue token expired, starts again from a fresh
list. Failures are logged once per cause, and the return of the API server once.

Everything is read as it arrives (`exporter.attribution.jsonstream`): of each object only what
its `Kind.shape` names is built, so what a tenant puts in a pod (1.5 MiB of env entries or
annotations) is scanned past, never held; each object read is bounded (`MAX_OBJECT_BYTES`), and
so is a page (`PAGE_OBJECTS` of them).

The pods of this node (`exporter.attribution.pods`), its ResourceSlices
(`exporter.attribution.resourceslices`) and the cluster's Kueue LocalQueues
(`exporter.attribution.localqueues`) are kept this way. A kind the cluster may not serve
(`Kind.optional`: resource.k8s.io before Kubernetes 1.34, Kueue not installed, or without the
RBAC for it) turns itself off at the first 404 or 403, with one log line, and costs nothing
after; one served under several API versions (`Kind.older_paths`) tries the next older one at a
404 first.

Stopping is two steps, so that an owner stopping several watches waits once: `request_stop`
tells the thread and cuts its open connection, `join` waits for it until a deadline. The thread
is a daemon thread: one stuck past the deadline (in a connect) cannot hold the process.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Generic, TypeVar

import urllib3

from exporter.attribution.cluster import MAX_OBJECT_BYTES, ApiError, CredentialError
from exporter.attribution.jsonstream import (
    CHUNK_BYTES,
    TEXT,
    Fields,
    Incomplete,
    Items,
    JsonError,
    JsonStream,
    Scalar,
)
from exporter.logs import LogOnce
from exporter.model import WatchStatus
from exporter.supervise import SupervisedThread

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from urllib3 import BaseHTTPResponse

    from exporter.attribution.cluster import KubernetesClient

log = logging.getLogger(__name__)

T = TypeVar("T")
V = TypeVar("V")

BACKOFF_SECONDS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
"""Waits before successive reconnection attempts while the API server fails (each +-20%)."""
RETRYABLE_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Answers worth retrying soon; any other refusal (401, 403, 404) waits the longest backoff."""
ABSENT_STATUS: Final = frozenset({403, 404})
"""What an optional kind's API answers on a cluster that does not serve it, or not to us."""
GONE: Final = 410
CONNECT_TIMEOUT_SECONDS: Final = 5.0
LIST_READ_TIMEOUT_SECONDS: Final = 30.0
WATCH_READ_TIMEOUT_SECONDS: Final = 120.0
"""A watch that sends nothing for this long is re-opened from the last resourceVersion."""
WATCH_SECONDS: Final = (300, 600)
"""The server ends each watch after a random time in this range (spreads reconnections)."""
STOP_SECONDS: Final = 1.0
BATCH_SECONDS: Final = 0.5
"""After an event that arrived while the watch was idle, wait this long for more (see _watch)."""
PAGE_OBJECTS: Final = 100
"""Objects asked for per page of a list (`limit`): a node's few hundred pods in a few requests."""
MAX_EVENT_BYTES: Final = MAX_OBJECT_BYTES
"""One watch event: an object (of at most 1.5 MiB in etcd) and its envelope of a few bytes."""
MAX_CONTINUE: Final = 64 * 1024
"""A continue token is a few hundred characters; one longer is cut, and the server refuses it."""
_BLOCKED_SECONDS: Final = 0.002
_ENVELOPE: Final = Fields(
    {"metadata": Fields({"resourceVersion": TEXT}), "code": Scalar(), "message": TEXT}
)
"""What the watch itself reads of every object besides its kind's fields: the resourceVersion,
and a Status's code and message (an ERROR event's object)."""


@dataclass(frozen=True, slots=True)
class Kind(Generic[T, V]):
    """What to watch and how to keep it."""

    resource: str
    """The plural RBAC names it by (`pods`), and the `resource` label of its watch's series."""
    noun: str
    """How the log names the objects (`pods`, `ResourceSlices`)."""
    path: str
    """The collection, `/api/v1/pods`."""
    selector: str
    """The field selector: `spec.nodeName=<node>`."""
    shape: Fields
    """What is read of each object (everything else is skipped as it arrives)."""
    parse: Callable[[object], tuple[str, T] | None]
    """What `shape` kept of an object -> (its key in the cache, what is kept of it); None for
    one to skip (the parser says why, once)."""
    index: Callable[[Iterable[T]], V]
    """The immutable view the sampler reads, built from the objects kept."""
    empty: V
    """The view before the first list."""
    optional: bool = False
    """Turned off for good by a 404 or 403 (an API the cluster may not serve)."""
    absent: str = ""
    """For an optional kind: the one log line saying it is off, and what that costs."""
    page_objects: int = PAGE_OBJECTS
    max_object_bytes: int = MAX_OBJECT_BYTES
    older_paths: tuple[str, ...] = ()
    """For an optional kind: the same collection under the API versions to fall back to, newest
    first, each tried when the one before answers 404 (the cluster serves an older version)."""


@dataclass(frozen=True, slots=True)
class _Page(Generic[T]):
    objects: list[tuple[str, T]]
    version: str
    token: str
    """The continue token: "" on the last page."""


class _Expired(Exception):
    """The watch's resourceVersion, or a list's continue token, is too old (410 Gone): list
    again. `str()` names which."""


class _BadStream(Exception):
    """The API server sent something that is not what was asked for."""


class _Absent(Exception):
    """An optional kind the cluster does not serve (or not to this service account)."""


class _OlderVersion(Exception):
    """The kind's API version is not served: list again at the next older path."""


class ListWatch(Generic[T, V]):
    """List + watch of one kind in a thread of its own (`gpuscope-<resource>-watch`)."""

    def __init__(
        self,
        client: KubernetesClient,
        kind: Kind[T, V],
        *,
        thread: str,
        clock: Callable[[], float] = time.monotonic,
        backoff: tuple[float, ...] = BACKOFF_SECONDS,
        watch_read_timeout: float = WATCH_READ_TIMEOUT_SECONDS,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        self._client = client
        self.kind = kind
        self._clock = clock
        self._backoff = backoff
        self._watch_read_timeout = watch_read_timeout
        self._batch_seconds = batch_seconds
        self._once = LogOnce(log)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = SupervisedThread(thread, self._run, on_crash=self._crashed)
        self._path = kind.path
        self._older_paths = list(kind.older_paths)
        """The paths not tried yet; the watch thread's alone."""
        self._response: BaseHTTPResponse | None = None
        """The answer being read (a page of the list, or the watch), cut by `request_stop`."""
        self._objects: dict[str, T] = {}
        self._version = 0
        self._index: tuple[int, V] = (0, kind.empty)
        self._resource_version: str | None = None
        self._up = False
        self._off = False
        self._current_at: float | None = None
        """When the cache was last known current (None before the first list)."""
        self._attempt = 0
        self._failures = 0
        object_shape = kind.shape.merged(_ENVELOPE)
        self._event_shape = Fields({"type": TEXT, "object": object_shape})
        self._page_shape = Fields(
            {
                "metadata": Fields(
                    {"resourceVersion": TEXT, "continue": Scalar(max_length=MAX_CONTINUE)}
                ),
                "items": Items(kind.shape, select=self._parsed),
            }
        )

    # -- the sampler's side -------------------------------------------------------------------

    def view(self) -> V:
        """The current objects' index; rebuilt only after a change. Safe from any thread."""
        with self._lock:
            version, index = self._index
            if version == self._version:
                return index
            version, objects = self._version, list(self._objects.values())
        index = self.kind.index(objects)
        with self._lock:
            self._index = (version, index)
        return index

    def status(self) -> WatchStatus | None:
        """How current the cache is; None once an optional kind turned out absent."""
        with self._lock:
            if self._off:
                return None
            if self._current_at is None:
                age = None
            else:
                age = 0.0 if self._up else max(0.0, self._clock() - self._current_at)
            return WatchStatus(self.kind.resource, self._up, age, len(self._objects))

    @property
    def off(self) -> bool:
        """An optional kind the cluster does not serve: nothing more is asked."""
        with self._lock:
            return self._off

    @property
    def answered(self) -> bool:
        """The API server answered the first list, or turned an optional kind off."""
        with self._lock:
            return self._current_at is not None or self._off

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Tell the watch thread to end, cutting the answer it reads; returns at once."""
        self._stopping.set()
        self._thread.stop(0)  # no restart after this; the thread is joined in `join`
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()
            except OSError as error:
                log.debug("closing the watch connection failed", extra={"error": str(error)})

    def join(self, deadline: float) -> None:
        """Wait for the watch thread until `deadline` (on `time.monotonic`'s clock), then close
        the connections."""
        self._thread.stop(max(0.0, deadline - time.monotonic()))
        self._client.close()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop the watch thread, interrupting a blocked read; waits at most `timeout`."""
        self.request_stop()
        self.join(time.monotonic() + timeout)

    # -- the watch thread ---------------------------------------------------------------------

    def _run(self) -> None:
        expired_before = False
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list()
                    if self._resource_version is None:
                        continue  # stopped between two pages
                self._watch()
                self._attempt = 0  # the server ended the watch as asked: all is well
                expired_before = False
            except _Expired as expired:
                log.info(
                    "410 Gone: listing again",
                    extra={"resource": self.kind.resource, "expired": str(expired)},
                )
                self._resource_version = None
                if expired_before:  # twice in a row: do not hammer the server with lists
                    self._stopping.wait(self._backoff[0])
                expired_before = True
            except _Absent:
                return
            except _OlderVersion:
                continue
            except Exception as error:  # noqa: BLE001 - whatever broke, retry with backoff
                if self._stopping.is_set():
                    break
                delay = self._failed(error)
                self._stopping.wait(delay)

    def _crashed(self) -> None:
        """The watch loop itself failed (not the API): the cache is stale until it restarts,
        and starts again from a fresh list."""
        with self._lock:
            if self._up:
                self._current_at = self._clock()
            self._up = False
        self._resource_version = None

    def _get(
        self, query: list[tuple[str, str]], read_timeout: float, *, what: str
    ) -> BaseHTTPResponse:
        try:
            response = self._client.get(
                self._path,
                [("fieldSelector", self.kind.selector), *query],
                timeout=(CONNECT_TIMEOUT_SECONDS, read_timeout),
            )
        except ApiError as error:
            if error.status == GONE:
                raise _Expired(what) from error
            if self.kind.optional and error.status == 404 and self._older_paths:
                log.info(
                    "the Kubernetes API does not serve this version; trying an older one",
                    extra={"path": self._path, "next": self._older_paths[0]},
                )
                self._path = self._older_paths.pop(0)
                raise _OlderVersion from error
            if self.kind.optional and error.status in ABSENT_STATUS:
                self._turn_off(error)
                raise _Absent from error
            raise
        with self._lock:
            self._response = response
        if self._stopping.is_set():  # request_stop came before the response was known
            response.shutdown()
        return response

    def _read(self, response: BaseHTTPResponse, limit: int, what: str) -> JsonStream:
        return JsonStream(response.stream(CHUNK_BYTES), max_value_bytes=limit, what=what)

    def _done(self, response: BaseHTTPResponse) -> None:
        with self._lock:
            self._response = None
        response.release_conn()

    def _list(self) -> None:
        """List every object in pages; the cache is replaced once the last page is read."""
        objects: dict[str, T] = {}
        version = token = ""
        while True:
            query = [("limit", str(self.kind.page_objects))]
            if token:
                query.append(("continue", token))
            page = self._page(query, continued=bool(token))
            objects.update(page.objects)
            version, token = page.version, page.token
            if not token:
                break
            if self._stopping.is_set():
                return
        with self._lock:
            self._objects = objects
            self._version += 1
        self._resource_version = version
        self._connected(listed=len(objects))

    def _page(self, query: list[tuple[str, str]], *, continued: bool) -> _Page[T]:
        what = f"a page of the list of {self.kind.noun}"
        response = self._get(
            query,
            LIST_READ_TIMEOUT_SECONDS,
            what=f"the continue token of the list of {self.kind.noun}" if continued else what,
        )
        limit = self.kind.page_objects * self.kind.max_object_bytes
        try:
            document = self._read(response, limit, what).value(self._page_shape)
        except JsonError as error:
            raise _BadStream(str(error)) from error
        finally:
            self._done(response)
        metadata = document.get("metadata") if isinstance(document, dict) else None
        items = document.get("items") if isinstance(document, dict) else None
        version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        token = metadata.get("continue") if isinstance(metadata, dict) else None
        if not isinstance(items, list) or not isinstance(version, str):
            raise _BadStream(f"the list of {self.kind.noun} has no items or no resourceVersion")
        return _Page(items, version, token if isinstance(token, str) else "")

    def _parsed(self, obj: object, _kept: Sequence[object]) -> tuple[str, T] | None:
        """A listed object as the cache keeps it, made as soon as it is read."""
        return self.kind.parse(obj)

    def _watch(self) -> None:
        assert self._resource_version is not None
        response = self._get(
            [
                ("resourceVersion", self._resource_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(random.randint(*WATCH_SECONDS))),  # noqa: S311 - not a secret
                ("watch", "true"),
            ],
            self._watch_read_timeout,
            what="a watch",
        )
        self._connected()
        events = self._read(response, self.kind.max_object_bytes, "a watch event").values(
            self._event_shape
        )
        try:
            waited_from = self._clock()
            for event in events:
                if self._stopping.is_set():
                    return
                self._apply(event)
                self._attempt = 0
                if self._clock() - waited_from > _BLOCKED_SECONDS and self._batch_seconds:
                    # The event came after a wait: let the next ones gather in the socket and
                    # take them together. Each wake-up from idle costs far more CPU than an
                    # event read in a row (cold caches); bursts are never slowed by this.
                    self._stopping.wait(self._batch_seconds)
                waited_from = self._clock()
        except urllib3.exceptions.ReadTimeoutError:
            return  # a quiet node: watch again from the same resourceVersion
        except Incomplete:
            return  # cut off mid-event: watching again from the last one applied sends it again
        except JsonError as error:
            raise _BadStream(str(error)) from error
        finally:
            self._done(response)

    def _apply(self, event: object) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise _BadStream("a watch event has no object")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            if code == GONE:
                raise _Expired("a watch")
            raise ApiError(
                status=code if isinstance(code, int) else 0, reason=str(obj.get("message", ""))
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if isinstance(version, str):
                self._resource_version = version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise _BadStream(f"unknown watch event type {kind!r}")
        parsed = self.kind.parse(obj)
        if isinstance(version, str):
            self._resource_version = version
        if parsed is None:
            return
        key, value = parsed
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = value
            self._version += 1

    def _connected(self, *, listed: int | None = None) -> None:
        with self._lock:
            was_up = self._up
            self._up = True
            self._current_at = self._clock()
        if self._failures:
            log.info(
                "Kubernetes API answers again; the cache is current",
                extra={
                    "resource": self.kind.resource,
                    "selector": self.kind.selector,
                    "failed_attempts": self._failures,
                },
            )
            self._failures = 0
            self._once.forget_matching(("api",))
        elif listed is not None and not was_up:
            log.info(
                "cache filled",
                extra={
                    "resource": self.kind.resource,
                    "selector": self.kind.selector,
                    "objects": listed,
                },
            )

    def _turn_off(self, error: ApiError) -> None:
        with self._lock:
            self._off = True
            self._up = False
            self._objects = {}
            self._version += 1
        log.log(
            logging.INFO if error.status == 404 else logging.WARNING,
            self.kind.absent,
            extra={"status": error.status, "reason": str(error.reason), "path": self._path},
        )

    def _failed(self, error: Exception) -> float:
        """Note a failure: the cache goes stale; the answer is how long to wait."""
        with self._lock:
            if self._up:
                self._current_at = self._clock()
            self._up = False
        self._failures += 1
        attempt = self._attempt
        self._attempt += 1
        wait = self._backoff[min(attempt, len(self._backoff) - 1)]
        noun, resource = self.kind.noun, self.kind.resource
        fields: dict[str, object] = {"selector": self.kind.selector, "attempt": self._failures}
        if isinstance(error, CredentialError):
            # Said once by what makes the credentials, whichever thread asked first.
            log.debug("no credentials for the Kubernetes API", extra={"problem": str(error)})
            return wait * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret
        if isinstance(error, ApiError) and error.status not in RETRYABLE_STATUS:
            wait = self._backoff[-1]
            fields["status"] = error.status
            fields["reason"] = str(error.reason)
            message = (
                f"the Kubernetes API refused to list or watch {noun} (RBAC must allow get, list "
                f"and watch on {resource}); keeping the last known {noun}"
            )
            cause: tuple[object, ...] = ("api", "refused", error.status)
        elif isinstance(error, _BadStream):
            self._resource_version = None  # an event may be lost: start again from a list
            fields["problem"] = str(error)
            message = "the Kubernetes API sent a malformed answer; listing again"
            cause = ("malformed", str(error))  # bad input: said once, even across recoveries
        else:
            fields["error"] = _describe(error)
            message = f"Kubernetes API unreachable; keeping the last known {noun} and retrying"
            cause = ("api", "unreachable")
        self._once(logging.WARNING, cause, message, fields=fields)
        return wait * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret


def _describe(error: Exception) -> str:
    if isinstance(error, ApiError):
        return f"HTTP {error.status} {error.reason}"
    reason = getattr(error, "reason", None)
    return f"{type(error).__name__}: {reason or error}"
