"""The pods on this node, kept current by list + watch, never by polling per scrape.

One dedicated thread lists `/api/v1/pods?fieldSelector=spec.nodeName=<node>`, then watches from
the list's resourceVersion, applying each event to the cache; the sampler's worker thread takes
an immutable `PodIndex` from it once per cycle. When the API server is away the last known pods
stay, reconnection follows `BACKOFF_SECONDS`, and a watch answered with `410 Gone` (in the
status line or as an ERROR event) starts again from a fresh list. Failures are logged once per
cause, and the return of the API server once.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Final

import urllib3
from kubernetes.client.exceptions import ApiException

from exporter.attribution.cluster import PODS_PATH
from exporter.attribution.pod import EMPTY_INDEX, Pod, PodFormatError, PodIndex, pod_from_api
from exporter.documents import size_text
from exporter.logs import LogOnce
from exporter.model import KubernetesStatus
from exporter.supervise import SupervisedThread

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from urllib3 import BaseHTTPResponse

    from exporter.attribution.cluster import KubernetesClient

log = logging.getLogger(__name__)

BACKOFF_SECONDS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
"""Waits before successive reconnection attempts while the API server fails (each +-20%)."""
RETRYABLE_STATUS: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Answers worth retrying soon; any other refusal (401, 403, 404) waits the longest backoff."""
GONE: Final = 410
CONNECT_TIMEOUT_SECONDS: Final = 5.0
LIST_READ_TIMEOUT_SECONDS: Final = 30.0
WATCH_READ_TIMEOUT_SECONDS: Final = 120.0
"""A watch that sends nothing for this long is re-opened from the last resourceVersion."""
WATCH_SECONDS: Final = (300, 600)
"""The server ends each watch after a random time in this range (spreads reconnections)."""
STOP_SECONDS: Final = 1.0
BATCH_SECONDS: Final = 0.5
MAX_LIST_BYTES: Final = 64 * 1024 * 1024
"""The node's pod list: a pod is a few KiB (at most 1.5 MiB, etcd's limit), a node runs 110 by
default; past this the list is refused (and retried with backoff) rather than read into memory."""
MAX_EVENT_BYTES: Final = 4 * 1024 * 1024
"""One watch event: a pod object and its envelope, well within etcd's 1.5 MiB per object."""
"""After an event that arrived while the watch was idle, wait this long for more (see _watch)."""
_BLOCKED_SECONDS: Final = 0.002


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class _BadStream(Exception):
    """The watch stream sent something that is not a watch event."""


class PodCache:
    """List + watch of this node's pods in a thread of its own."""

    def __init__(
        self,
        client: KubernetesClient,
        node_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff: tuple[float, ...] = BACKOFF_SECONDS,
        watch_read_timeout: float = WATCH_READ_TIMEOUT_SECONDS,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        self._client = client
        self._node = node_name
        self._clock = clock
        self._backoff = backoff
        self._watch_read_timeout = watch_read_timeout
        self._batch_seconds = batch_seconds
        self._once = LogOnce(log)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = SupervisedThread("gpuscope-pod-watch", self._run, on_crash=self._crashed)
        self._response: BaseHTTPResponse | None = None
        self._pods: dict[str, Pod] = {}
        self._version = 0
        self._index: tuple[int, PodIndex] = (0, EMPTY_INDEX)
        self._resource_version: str | None = None
        self._up = False
        self._current_at: float | None = None
        """When the cache was last known current (None before the first list)."""
        self._attempt = 0
        self._failures = 0

    # -- the sampler's side -------------------------------------------------------------------

    def view(self) -> PodIndex:
        """The current pods; rebuilt only after a change. Safe from any thread."""
        with self._lock:
            version, index = self._index
            if version == self._version:
                return index
            version, pods = self._version, list(self._pods.values())
        index = PodIndex.of(pods)
        with self._lock:
            self._index = (version, index)
        return index

    def status(self) -> KubernetesStatus:
        with self._lock:
            if self._current_at is None:
                age = None
            else:
                age = 0.0 if self._up else max(0.0, self._clock() - self._current_at)
            return KubernetesStatus(self._up, age, len(self._pods))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop the watch thread, interrupting a blocked read; waits at most `timeout`."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()
            except OSError as error:
                log.debug("closing the watch connection failed", extra={"error": str(error)})
        self._thread.stop(timeout)
        self._client.close()

    # -- the watch thread ---------------------------------------------------------------------

    def _run(self) -> None:
        expired_before = False
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list()
                self._watch()
                self._attempt = 0  # the server ended the watch as asked: all is well
                expired_before = False
            except _Expired:
                log.info("pod watch expired (410 Gone); listing again")
                self._resource_version = None
                if expired_before:  # twice in a row: do not hammer the server with lists
                    self._stopping.wait(self._backoff[0])
                expired_before = True
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

    def _list(self) -> None:
        response = self._client.get(
            PODS_PATH,
            [("fieldSelector", f"spec.nodeName={self._node}")],
            timeout=(CONNECT_TIMEOUT_SECONDS, LIST_READ_TIMEOUT_SECONDS),
        )
        try:
            document = json.loads(_bounded_body(response, MAX_LIST_BYTES))
        except ValueError as error:
            raise _BadStream("the pod list is not JSON") from error
        finally:
            response.release_conn()
        items = document.get("items") if isinstance(document, dict) else None
        version = (
            (document.get("metadata") or {}).get("resourceVersion") if items is not None else None
        )
        if not isinstance(items, list) or not isinstance(version, str):
            raise _BadStream("the pod list has no items or no resourceVersion")
        pods: dict[str, Pod] = {}
        for item in items:
            pod = self._parse(item)
            if pod is not None:
                pods[pod.uid] = pod
        with self._lock:
            self._pods = pods
            self._version += 1
        self._resource_version = version
        self._connected(listed=len(pods))

    def _watch(self) -> None:
        assert self._resource_version is not None
        try:
            response = self._client.get(
                PODS_PATH,
                [
                    ("fieldSelector", f"spec.nodeName={self._node}"),
                    ("resourceVersion", self._resource_version),
                    ("allowWatchBookmarks", "true"),
                    ("timeoutSeconds", str(random.randint(*WATCH_SECONDS))),  # noqa: S311 - not a secret
                    ("watch", "true"),
                ],
                timeout=(CONNECT_TIMEOUT_SECONDS, self._watch_read_timeout),
            )
        except ApiException as error:
            if error.status == GONE:
                raise _Expired from error
            raise
        with self._lock:
            self._response = response
        if self._stopping.is_set():  # stop() came before the response was known
            response.shutdown()
        self._connected()
        try:
            waited_from = self._clock()
            for line in _lines(response):
                if self._stopping.is_set():
                    return
                self._apply(line)
                self._attempt = 0
                if self._clock() - waited_from > _BLOCKED_SECONDS and self._batch_seconds:
                    # The event came after a wait: let the next ones gather in the socket and
                    # take them together. Each wake-up from idle costs far more CPU than an
                    # event read in a row (cold caches); bursts are never slowed by this.
                    self._stopping.wait(self._batch_seconds)
                waited_from = self._clock()
        except urllib3.exceptions.ReadTimeoutError:
            return  # a quiet node: watch again from the same resourceVersion
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def _apply(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError as error:
            raise _BadStream("a watch event is not JSON") from error
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise _BadStream("a watch line is not an event with an object")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            code = obj.get("code")
            if code == GONE:
                raise _Expired
            raise ApiException(
                status=code if isinstance(code, int) else 0, reason=str(obj.get("message", ""))
            )
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if isinstance(version, str):
                self._resource_version = version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise _BadStream(f"unknown watch event type {kind!r}")
        pod = self._parse(obj)
        if isinstance(version, str):
            self._resource_version = version
        if pod is None:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(pod.uid, None)
            else:
                self._pods[pod.uid] = pod
            self._version += 1

    def _parse(self, obj: object) -> Pod | None:
        try:
            if not isinstance(obj, dict):
                raise PodFormatError("not an object")
            pod = pod_from_api(obj)
        except PodFormatError as error:
            self._once(
                logging.WARNING,
                ("pod", str(error)),
                "the API sent a pod without the fields every pod has; skipping it",
                fields={"problem": str(error)},
            )
            return None
        for cause, detail in pod.problems:
            self._once(
                logging.WARNING,
                (cause, detail),
                "container id of an unknown form; that container's processes attribute to no pod"
                if cause == "container-id"
                else "container runtime gpuscope does not know; matching its containers by id",
                fields={"namespace": pod.namespace, "pod": pod.name, "runtime": detail},
            )
        return pod

    def _connected(self, *, listed: int | None = None) -> None:
        with self._lock:
            was_up = self._up
            self._up = True
            self._current_at = self._clock()
        if self._failures:
            log.info(
                "Kubernetes API answers again; pod cache current",
                extra={"node": self._node, "failed_attempts": self._failures},
            )
            self._failures = 0
            self._once.forget_matching(("api",))
        elif listed is not None and not was_up:
            log.info("pod cache filled", extra={"node": self._node, "pods": listed})

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
        fields: dict[str, object] = {"node": self._node, "attempt": self._failures}
        if isinstance(error, ApiException) and error.status not in RETRYABLE_STATUS:
            wait = self._backoff[-1]
            fields["status"] = error.status
            fields["reason"] = str(error.reason)
            message = (
                "the Kubernetes API refused to list or watch pods (RBAC must allow get, list and "
                "watch on pods); keeping the last known pods"
            )
            cause: tuple[object, ...] = ("api", "refused", error.status)
        elif isinstance(error, _BadStream):
            self._resource_version = None  # an event may be lost: start again from a list
            fields["problem"] = str(error)
            message = "the Kubernetes API sent a malformed answer; listing again"
            cause = ("malformed", str(error))  # bad input: said once, even across recoveries
        else:
            fields["error"] = _describe(error)
            message = "Kubernetes API unreachable; keeping the last known pods and retrying"
            cause = ("api", "unreachable")
        self._once(logging.WARNING, cause, message, fields=fields)
        return wait * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret


def _describe(error: Exception) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    reason = getattr(error, "reason", None)
    return f"{type(error).__name__}: {reason or error}"


def _bounded_body(response: BaseHTTPResponse, limit: int) -> bytes:
    """The whole body, refused past `limit` bytes before more is read."""
    body = bytearray()
    for chunk in response.stream(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise _BadStream(f"the pod list is larger than {size_text(limit)}")
    return bytes(body)


def _lines(response: BaseHTTPResponse, limit: int = MAX_EVENT_BYTES) -> Iterator[bytes]:
    """The non-empty lines of a streamed body, as they arrive. A last line cut off without its
    newline is dropped: its event was not applied, so watching again from the last applied
    resourceVersion delivers it again. A line longer than `limit` is refused."""
    pending = b""
    for chunk in response.stream(None):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if len(line) > limit:
                raise _BadStream(f"a watch event is larger than {size_text(limit)}")
            if line.strip():
                yield line
        if len(pending) > limit:
            raise _BadStream(f"a watch event is larger than {size_text(limit)}")
