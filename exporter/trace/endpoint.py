"""`GET /debug/gpu-trace?seconds=N[&gpu=<index or UUID>]` (with `--web.enable-trace` only).

The handler polls each GPU traced every `POLL_SECONDS` on the GPU's own worker thread
(`GpuThreads.call`, between the sampling cycle's jobs), so a GPU hung in the driver holds up its
own trace only, never the event loop, the other GPUs or `/metrics`; it waits on the event loop
with `asyncio` alone. The pods' tracks come from the snapshots the sampling loop publishes
meanwhile. After N seconds it answers the trace (`exporter.trace.chrome`); earlier with 503 when
the daemon stops (`Tracing.stop`: the sampler's shutdown waits for a poll in the driver and
refuses new ones, so no poll races it), and not at all when the client left (its GPUs are free
at once).

One trace at a time per GPU: a request for a GPU being traced is refused with 409.

Threading: which GPUs are being traced is the event loop's alone; a GPU's `GpuPoller` belongs to
its one poll out (never two), whose points come back through the poll's future.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import select
import time
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl

from exporter.documents import quote
from exporter.nvml.workers import CallRefused
from exporter.trace.chrome import GpuTrace, pod_values, trace_events
from exporter.trace.poll import POLL_SECONDS, GpuLostDuringTrace, GpuPoller
from exporter.web.http import Response

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from concurrent.futures import Future

    from exporter.model import Snapshot
    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device
    from exporter.nvml.workers import GpuThreads
    from exporter.trace.poll import Point
    from exporter.web.http import Request

log = logging.getLogger(__name__)

PATH: Final = "/debug/gpu-trace"
MAX_SECONDS: Final = 60
PARAMETERS: Final = ("seconds", "gpu")
_SECONDS: Final = re.compile(r"[0-9]{1,2}")
LAST_POLL_SECONDS: Final = 1.0
"""How long the answer waits, after the N seconds, for the polls still in the driver."""
_HUNG_UP: Final = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


class BadQuery(ValueError):
    """A query the endpoint refuses (400), with the one-line reason."""


class _Cut(Exception):
    """A trace ended before its time: the daemon stops, or the client left."""


def parse_query(query: str) -> tuple[int, str | None]:
    """`seconds` (1 to 60) and the optional `gpu`, each at most once, and nothing else."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise BadQuery(f"malformed query {quote(query)}") from None
    given: dict[str, str] = {}
    for key, value in pairs:
        if key not in PARAMETERS:
            raise BadQuery(f"unknown parameter {quote(key)} (seconds and gpu only)")
        if key in given:
            raise BadQuery(f"{key} given twice")
        given[key] = value
    if "seconds" not in given:
        raise BadQuery(f"missing seconds=N (an integer from 1 to {MAX_SECONDS})")
    text = given["seconds"]
    if not _SECONDS.fullmatch(text) or not 1 <= int(text) <= MAX_SECONDS:
        raise BadQuery(f"seconds must be an integer from 1 to {MAX_SECONDS}, not {quote(text)}")
    return int(text), given.get("gpu")


def pick(devices: Sequence[Device], wanted: str | None) -> list[Device]:
    """The GPUs `wanted` names (an index or a UUID), or all of them."""
    if wanted is None:
        return list(devices)
    for device in devices:
        identity = device.identity
        if wanted == str(identity.index) or wanted.lower() == identity.uuid.lower():
            return [device]
    known = ", ".join(str(device.identity.index) for device in devices) or "none"
    raise BadQuery(f"no GPU {quote(wanted)} on this node (GPUs by index: {known}; or a UUID)")


class Tracing:
    """The endpoint: `handle` answers a request; `stop` ends the traces under way."""

    def __init__(
        self,
        driver: NvmlDriver,
        threads: Callable[[], GpuThreads[Device]],
        snapshot: Callable[[], Snapshot | None],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._driver = driver
        self._threads = threads
        self._snapshot = snapshot
        self._wall = wall
        self._tracing: set[str] = set()
        """UUIDs of the GPUs being traced now (the event loop's alone)."""
        self._stopping = asyncio.Event()

    @property
    def busy(self) -> frozenset[str]:
        """The UUIDs of the GPUs being traced now."""
        return frozenset(self._tracing)

    def stop(self) -> None:
        """The daemon stops: traces under way answer 503 at once."""
        self._stopping.set()

    async def handle(self, request: Request) -> Response:
        try:
            seconds, wanted = parse_query(request.query)
            threads = self._threads()
            devices = pick([d for d in threads.gpus() if not d.lost], wanted)
        except BadQuery as problem:
            return Response.text(f"{problem}\n", HTTPStatus.BAD_REQUEST)
        if not devices:
            return Response.text(
                "no GPU answers now; retry later\n", HTTPStatus.SERVICE_UNAVAILABLE
            )
        busy = [d.identity for d in devices if d.identity.uuid in self._tracing]
        if busy:
            return Response.text(
                f"GPU {busy[0].index} ({busy[0].uuid}) is being traced already: one trace at a "
                "time per GPU; retry when it ends\n",
                HTTPStatus.CONFLICT,
            )
        uuids = {d.identity.uuid for d in devices}
        self._tracing |= uuids
        log.info(
            "a GPU trace began",
            extra={"gpus": ",".join(str(d.identity.index) for d in devices), "seconds": seconds},
        )
        try:
            traces = await self._trace(request, threads, devices, seconds)
        except _Cut as cut:
            return Response.text(f"{cut}\n", HTTPStatus.SERVICE_UNAVAILABLE, close=True)
        finally:
            self._tracing -= uuids
        # Tens of thousands of events: encoded off the event loop.
        body = await asyncio.to_thread(_encode, traces)
        return Response(
            body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    async def _trace(
        self, request: Request, threads: GpuThreads[Device], devices: list[Device], seconds: int
    ) -> list[GpuTrace]:
        """Each GPU's points over `seconds`. Raises `_Cut` when the daemon stops meanwhile, or
        the client left."""
        loop = asyncio.get_running_loop()
        started_us = round(self._wall() * 1e6)
        runs = [
            _Run(device, GpuPoller(self._driver, device.handle, started_us=started_us))
            for device in devices
        ]
        begun = loop.time()
        end = begun + seconds
        seen: Snapshot | None = None
        tick = 0
        while True:
            now = loop.time()
            placed = {device.identity.uuid: device for device in threads.gpus()}
            for run in runs:
                run.collect()
                run.submit(threads, placed)
            snapshot = self._snapshot()
            if snapshot is not None and snapshot is not seen:
                seen = snapshot
                for run in runs:
                    run.pods_at(snapshot, started_us)
            if now >= end:
                break
            if _client_left(request):
                raise _Cut("the client left")
            tick = max(tick + 1, int((now - begun) / POLL_SECONDS) + 1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._stopping.wait(), min(begun + tick * POLL_SECONDS, end) - now
                )
            if self._stopping.is_set():
                raise _Cut("the daemon is stopping")
        out = [asyncio.wrap_future(run.out) for run in runs if run.out is not None]
        if out:
            await asyncio.wait(out, timeout=LAST_POLL_SECONDS)
        for run in runs:
            run.collect()
        return [run.trace() for run in runs]


class _Run:
    """One GPU's trace under way (the event loop's)."""

    def __init__(self, device: Device, poller: GpuPoller) -> None:
        self.device = device
        self.poller = poller
        self.points: list[Point] = []
        self.pods: list[Point] = []
        self._pod_last: dict[str, int] = {}
        self.out: Future[list[Point]] | None = None
        """The poll in the driver or waiting for it."""
        self.ended = False

    def collect(self) -> None:
        out = self.out
        if out is None or not out.done():
            return
        self.out = None
        try:
            self.points.extend(out.result())
        except CallRefused:
            pass  # NVML re-initialises: the next poll finds the GPU's new handle
        except GpuLostDuringTrace:
            self.ended = True
        except Exception:
            self.ended = True
            log.exception(
                "a GPU trace's poll failed; that GPU's trace ends",
                extra={"uuid": self.device.identity.uuid},
            )

    def submit(self, threads: GpuThreads[Device], placed: dict[str, Device]) -> None:
        """The next poll, unless one is out (a GPU hung in the driver gets no second one)."""
        if self.ended or self.out is not None:
            return
        device = placed.get(self.device.identity.uuid)
        if device is None or device.lost:
            return
        self.poller.handle = device.handle
        self.out = threads.call(device, self.poller.poll)

    def pods_at(self, snapshot: Snapshot, started_us: int) -> None:
        at = max(round(snapshot.timestamp * 1e6), started_us)
        for track, value in sorted(pod_values(snapshot, self.device.identity.uuid).items()):
            if at > self._pod_last.get(track, -1):
                self._pod_last[track] = at
                self.pods.append((track, at, value))

    def trace(self) -> GpuTrace:
        return GpuTrace(self.device.identity, self.points, self.pods)


def _encode(traces: list[GpuTrace]) -> bytes:
    document: Any = trace_events(traces)
    return json.dumps(document, separators=(",", ":")).encode()


def _client_left(request: Request) -> bool:
    """Whether the client has gone: its connection closed, hung up or reset. (The listener does
    not read a connection while it answers it, so the socket is asked without reading it.)"""
    transport = request.transport
    if transport is None:
        return False
    if transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), _HUNG_UP)
    return any(mask & _HUNG_UP for _, mask in poller.poll(0))
