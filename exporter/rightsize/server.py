"""`gpuscope rightsize serve`: the rightsizing report, made again on a schedule, served live.

Every `--refresh` the report is made as a one-off run makes it (`cli.produce`), in the thread
`gpuscope-refresh` with an event loop of its own and a deadline (`refresh_deadline`), and
published whole: the report, its page, its JSON, its recommendations as Prometheus text and its
patches as a tarball, all rendered once there. The event loop only installs what the thread
returns (`Published` is immutable) and answers requests from it:

    /                    the HTML report: sortable, filterable by cluster, namespace, class and
                         confidence (state in the URL's fragment), the roofline picture, each
                         workload's patch
    /api/v1/report       the JSON report (`--format json`'s document)
    /patches.tar.gz      `--format patches`' directory: a patch per workload and apply.sh
    /metrics             the recommendations as series (`RECOMMENDATION_FAMILIES`) beside the
                         server's own: its refreshes, notifications, endpoint and process
    /-/healthy           200 while the refresh loop runs and no refresh has overrun its deadline
    /-/ready             200 once a report has been made

A refresh that fails (Prometheus unreachable, a query refused, the deadline passed, a bug) is
logged and counted, the last report stays served, and the next attempt comes sooner: 30 s after
the first failure, doubling up to `--refresh`. The endpoint is the daemon's: the same
`--web.config.file` (TLS, basic auth, ...), its listener's limits and `gpuscope_http_*` counts
(`exporter.web`). With `--notify`, a summary is posted after the first report and whenever the
recommended changes differ from those last posted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import io
import json
import logging
import os
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from exporter import __version__, logs, malloc
from exporter.durations import format_duration
from exporter.rightsize.exposition import (
    LAST_DURATION,
    LAST_REFRESH,
    LAST_SUCCESS,
    LAST_SUCCESS_TIME,
    NOTIFICATIONS,
    REFRESHES,
    TEXT_FORMAT,
    Collect,
    exposition,
    new_metric,
    recommendation_metrics,
    web_families,
)
from exporter.rightsize.formatters import FORMATTERS, Output, report_document
from exporter.rightsize.formatters.patches import SCRIPT, patch_files
from exporter.rightsize.notify import SERVICES, notify
from exporter.rightsize.options import PROG, ServeConfig, load_serve
from exporter.rightsize.produce import produce
from exporter.rightsize.prometheus import PrometheusError
from exporter.rightsize.replay.cut import Cut, ReplayCut
from exporter.settings import ConfigError
from exporter.supervise import DaemonExecutor, TaskHealth, background_task, supervised
from exporter.web.config import WebConfigError
from exporter.web.http import Handler, Request, Response, accepts_gzip, routed
from exporter.web.security import WebSecurity
from exporter.web.serving import CannotListen, listen, resolve, serve_until_stopped

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from prometheus_client.core import Metric

    from exporter.rightsize.report import Report

log = logging.getLogger("exporter.rightsize.server")

FIRST_RETRY_SECONDS: Final = 30.0
MAX_DEADLINE_SECONDS: Final = 3600.0
SHUTDOWN_SECONDS: Final = 4.0
LINKS: Final = (
    ("JSON", "api/v1/report"),
    ("metrics", "metrics"),
    ("patches (tar.gz)", "patches.tar.gz"),
)
"""Relative, so that the page works behind a proxy that serves it under a path."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """A body as served, and gzipped for a client that accepts that: each made once, in the
    refresh thread, and held with the report, so that both go when the next refresh replaces
    it (tens of MB each at 10,000 workloads)."""

    plain: bytes
    gzipped: bytes

    @classmethod
    def of(cls, body: bytes) -> Rendered:
        return cls(body, _gzip(body))


@dataclass(frozen=True, slots=True)
class Published:
    """One refresh's report and everything served from it, rendered once. Immutable."""

    report: Report
    made: float
    """Unix seconds."""
    seconds: float
    page: Rendered
    document: Rendered
    recommendations: bytes
    patches: bytes


def refresh_deadline(refresh: float) -> float:
    """How long a refresh may take: its period, at most an hour."""
    return min(refresh, MAX_DEADLINE_SECONDS)


def make_report(config: ServeConfig, *, stop: threading.Event | None = None) -> Published:
    """One refresh, start to finish; blocking (its own event loop): the refresh thread's. The
    deadline cuts the queries (`wait_for`) and the policy replay, which computes without
    yielding to the loop, as does `stop` once set (`ReplayCut`)."""
    started, began = time.time(), time.monotonic()
    run = config.run if config.run.fixed_end else replace(config.run, end=started)
    deadline = refresh_deadline(config.refresh)
    cut = Cut(stop or threading.Event(), began + deadline)
    report = asyncio.run(asyncio.wait_for(produce(run, cut=cut), deadline))
    seconds = time.monotonic() - began
    status = (
        f"made {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(time.time()))} in "
        f"{seconds:.1f}s, made again every {format_duration(config.refresh)}"
    )
    page = FORMATTERS["html"](report, Output(links=LINKS, status=status)).encode()
    return Published(
        report=report,
        made=time.time(),
        seconds=seconds,
        page=Rendered.of(page),
        document=Rendered.of(json.dumps(report_document(report), indent=1).encode()),
        recommendations=exposition(recommendation_metrics(report)),
        patches=tarball(patch_files(report), report.end),
    )


def tarball(files: dict[str, str], mtime: float) -> bytes:
    """`--format patches`' directory as a gzipped tar under `gpuscope-patches/`."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=int(mtime)) as zipped,
        tarfile.open(fileobj=zipped, mode="w") as tar,
    ):
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"gpuscope-patches/{name}")
            info.size, info.mtime = len(data), int(mtime)
            info.mode = 0o755 if name == SCRIPT else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Refresher:
    """The refresh loop and what it published. Event loop only, but for `make_report`, which
    runs in the refresh thread and hands back an immutable `Published`."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.published: Published | None = None
        self.successes = 0
        self.failures = 0
        self.last_end: float | None = None
        self.last_seconds = 0.0
        self.last_ok = False
        self.started: float | None = None
        """Monotonic start of the refresh under way, if one is."""
        self.notified: frozenset[tuple[str, str, str]] | None = None
        self.notifications: dict[tuple[str, str], int] = {
            (service, result): 0 for service in SERVICES for result in ("success", "failure")
        }
        # A daemon thread: a refresh under way never keeps a stopping server from exiting.
        self._thread = DaemonExecutor("gpuscope-refresh")
        self._stop = threading.Event()
        """Set once on close: the refresh thread's replay stops at its next look (`Cut`)."""

    async def run(self) -> None:
        """Refresh forever: every `--refresh` after a success, sooner after a failure."""
        retry = FIRST_RETRY_SECONDS
        while True:
            if await self.refresh():
                wait, retry = self.config.refresh, FIRST_RETRY_SECONDS
            else:
                wait, retry = min(retry, self.config.refresh), min(2 * retry, self.config.refresh)
            await asyncio.sleep(wait)

    async def refresh(self) -> bool:
        """One refresh; True when a new report is published."""
        self.started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            published = await loop.run_in_executor(
                self._thread, functools.partial(make_report, self.config, stop=self._stop)
            )
        except (PrometheusError, TimeoutError, ReplayCut) as error:
            reason = str(error) or (
                f"not done within {format_duration(refresh_deadline(self.config.refresh))}"
            )
            self._done(ok=False)
            log.error("refresh failed; the last report stays served", extra={"error": reason})
            return False
        except Exception as error:  # whatever failed, the last report stays
            self._done(ok=False)
            log.error(
                "refresh failed; the last report stays served",
                extra={"error": f"{type(error).__name__}: {error}"},
                exc_info=error,
            )
            return False
        self.published = published  # the last report goes, unless a response still holds it
        self._done(ok=True)
        # What the last report and this refresh's queries held, hundreds of MB at 10,000
        # workloads, is free now: without a trim glibc keeps it resident for the next refresh,
        # and the server grew by some 100 MB a refresh (benchmarks/rightsize.py).
        await loop.run_in_executor(self._thread, malloc.trim)
        log.info(
            "report refreshed",
            extra={
                "workloads": len(published.report.rows),
                "seconds": round(published.seconds, 2),
                "savings_usd_per_month": round(published.report.total.savings, 2),
            },
        )
        await self._notify(published.report)
        return True

    def _done(self, *, ok: bool) -> None:
        if self.started is not None:
            self.last_seconds = time.monotonic() - self.started
        self.started = None
        self.last_end = time.time()
        self.last_ok = ok
        if ok:
            self.successes += 1
        else:
            self.failures += 1

    async def _notify(self, report: Report) -> None:
        """Post a summary of the first report and of any that changes what to do."""
        run = self.config.run
        changes = frozenset(
            (row.history.key, row.recommendation.action, row.target_label)
            for row in report.rows
            if row.recommendation.action not in {"keep", "none"}
        )
        if not run.notify or changes == self.notified:
            return
        sent = await notify(
            report, run.notify, report_url=run.report_url, attempt_seconds=run.notify_timeout
        )
        for outcome in sent:
            key = (outcome.webhook.service, "success" if outcome.ok else "failure")
            self.notifications[key] += 1
        self.notified = changes

    def alive(self) -> tuple[bool, str]:
        """Whether no refresh has overran its deadline (with a minute's grace)."""
        if self.started is None:
            return True, "ok"
        late = time.monotonic() - self.started - refresh_deadline(self.config.refresh) - 60
        return (late <= 0, "ok" if late <= 0 else "the refresh under way overran its deadline")

    def families(self) -> Iterator[Metric]:
        """The server's own families, now."""
        for family, value in (
            (LAST_REFRESH, self.last_end),
            (LAST_DURATION, self.last_seconds if self.last_end is not None else None),
            (LAST_SUCCESS, float(self.last_ok) if self.last_end is not None else None),
            (LAST_SUCCESS_TIME, self.published.made if self.published else None),
        ):
            metric = new_metric(family)
            if value is not None:
                metric.add_metric([], value)
            yield metric
        refreshes = new_metric(REFRESHES)
        refreshes.add_metric(["success"], self.successes)
        refreshes.add_metric(["failure"], self.failures)
        yield refreshes
        sent = new_metric(NOTIFICATIONS)
        for (service, result), value in self.notifications.items():
            sent.add_metric([service, result], value)
        yield sent

    def close(self) -> None:
        self._stop.set()
        self._thread.shutdown(wait=False, cancel_futures=True)


class App:
    """The report server: the refresher, the endpoint's security, the server's own registry,
    and the background tasks (started once it listens, stopped by `stop`)."""

    def __init__(self, config: ServeConfig, security: WebSecurity) -> None:
        self.refresher = Refresher(config)
        self.security = security
        self.tasks = TaskHealth("refresh")
        refresher = self.refresher
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(
            Collect(lambda: [*refresher.families(), *web_families(security.counts())])
        )
        self._background: list[asyncio.Task[None]] = []
        self.handle = security.guard(
            routed(
                {
                    "/": self._served(
                        lambda published: published.page,
                        "text/html; charset=utf-8",
                        headers=_NO_STORE,
                    ),
                    "/api/v1/report": self._served(
                        lambda published: published.document,
                        "application/json",
                        headers=_NO_STORE,
                    ),
                    "/patches.tar.gz": self._served(
                        lambda published: published.patches,
                        "application/gzip",
                        headers={
                            "Content-Disposition": 'attachment; filename="gpuscope-patches.tar.gz"',
                            **_NO_STORE,
                        },
                    ),
                    "/metrics": self.metrics,
                    "/-/healthy": self.healthy,
                    "/-/ready": self.ready,
                }
            )
        )

    def start_background(self) -> None:
        """The refresh loop and the web config's watch, each restarted if it crashes: started
        once the server listens, so that a server that cannot listen never queries Prometheus."""
        self._background.extend(
            (
                background_task(
                    supervised(self.tasks, self.refresher.run), name="gpuscope-refresh-loop"
                ),
                background_task(
                    supervised(TaskHealth("web_config"), self.security.watch),
                    name="gpuscope-web-config",
                ),
            )
        )

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.refresher.close()
        self.security.close()

    def _served(
        self,
        body: Callable[[Published], Rendered | bytes],
        content_type: str,
        *,
        headers: Mapping[str, str],
    ) -> Handler:
        """A handler that sends one of the last refresh's rendered bodies (503 before the
        first), gzipped to a client that accepts it where the refresh compressed it."""

        async def handler(request: Request) -> Response:
            published = self.refresher.published
            if published is None:
                return _not_yet()
            found = body(published)
            if isinstance(found, bytes):
                return Response(body=found, content_type=content_type, headers=headers)
            if accepts_gzip(request.header("accept-encoding")):
                return Response(
                    body=found.gzipped, content_type=content_type, headers={**headers, **_GZIPPED}
                )
            return Response(
                body=found.plain, content_type=content_type, headers={**headers, **_VARIES}
            )

        return handler

    async def metrics(self, request: Request) -> Response:
        body = generate_latest(self.registry)
        if self.refresher.published is not None:
            body += self.refresher.published.recommendations
        headers = {"Content-Type": TEXT_FORMAT, **_NO_STORE}
        if not accepts_gzip(request.header("accept-encoding")):
            return Response(body=body, headers={**headers, **_VARIES})
        zipped = (
            await asyncio.to_thread(_gzip, body) if len(body) > COMPRESS_IN_THREAD else _gzip(body)
        )
        return Response(body=zipped, headers={**headers, **_GZIPPED})

    async def healthy(self, _request: Request) -> Response:
        ok, reason = self.refresher.alive()
        ok = ok and self.tasks.healthy
        return Response.text(f"{reason if ok else 'unhealthy'}\n", 200 if ok else 503)

    async def ready(self, _request: Request) -> Response:
        if self.refresher.published is None:
            return Response.text("no report yet\n", 503)
        return Response.text("ok\n")


_NO_STORE: Final = {"Cache-Control": "no-store"}
_VARIES: Final = {"Vary": "Accept-Encoding"}
_GZIPPED: Final = {"Content-Encoding": "gzip", **_VARIES}
COMPRESS_IN_THREAD: Final = 64 * 1024
"""A body larger than this is compressed off the event loop."""


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=6, mtime=0)


def _not_yet() -> Response:
    return Response.text(
        "the first report is being made; retry in a moment\n",
        503,
        headers={"Retry-After": "10"},
    )


def main(argv: Sequence[str]) -> int:
    """`gpuscope rightsize serve` with these arguments; the exit status."""
    malloc.fewer_arenas(os.environ)  # before any thread starts
    try:
        config = load_serve(argv, os.environ)
    except ConfigError as error:
        print(f"{PROG} serve: error: {error}", file=sys.stderr)
        return 2
    try:
        security = WebSecurity.load(config.web_config_file, max_requests=config.max_requests)
    except WebConfigError as error:
        print(
            f"{PROG} serve: error: invalid --web.config.file {config.web_config_file}: {error}",
            file=sys.stderr,
        )
        return 2
    logs.configure(config.run.log_level, config.run.log_format)
    return asyncio.run(_serve(config, security))


async def _serve(config: ServeConfig, security: WebSecurity) -> int:
    address = config.listen_address
    try:
        await resolve(address)
    except CannotListen as error:
        return _cannot_listen(error)
    app = App(config, security)
    try:
        listener = await listen(app.handle, address, security)
    except CannotListen as error:
        await app.stop()
        return _cannot_listen(error)
    app.start_background()
    log.info(
        "listening",
        extra={
            "address": listener.shown(),
            "version": __version__,
            "refresh": format_duration(config.refresh),
            "source": config.run.connection.shown,
            "notify": ", ".join(webhook.shown for webhook in config.run.notify),
            **security.describe(),
        },
    )
    await serve_until_stopped(
        listener,
        security,
        config.web_config_file,
        log,
        shutdown_seconds=SHUTDOWN_SECONDS,
        then=app.stop,
    )
    return 0


def _cannot_listen(error: CannotListen) -> int:
    print(f"{PROG} serve: error: {error}", file=sys.stderr)
    return error.status
