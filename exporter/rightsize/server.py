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
import gzip
import io
import json
import logging
import os
import sys
import tarfile
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import __version__, logs, malloc
from exporter.durations import format_duration
from exporter.rightsize.formatters import FORMATTERS, Output, report_document
from exporter.rightsize.formatters.patches import SCRIPT, patch_files
from exporter.rightsize.notify import SERVICES, notify
from exporter.rightsize.options import PROG, ServeConfig, load_serve
from exporter.rightsize.produce import produce
from exporter.rightsize.prometheus import PrometheusError
from exporter.rightsize.replay.metrics import SIMULATION_FAMILIES, simulation_metrics
from exporter.rightsize.strategy import IDLE, UNDERUSED
from exporter.series import Family
from exporter.settings import ConfigError
from exporter.supervise import DaemonExecutor, TaskHealth, background_task, supervised
from exporter.web import counters
from exporter.web.config import WebConfigError
from exporter.web.http import Handler, Request, Response, accepts_gzip, routed
from exporter.web.security import WebSecurity
from exporter.web.serving import CannotListen, listen, resolve, serve_until_stopped

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from exporter.rightsize.report import Report, WorkloadRow

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
TEXT_FORMAT: Final = "text/plain; version=0.0.4; charset=utf-8"

WORKLOAD_LABELS: Final = ("cluster", "namespace", "workload", "workload_kind")
RECOMMENDATION_INFO: Final = Family(
    "gpuscope_recommendation_info",
    "A workload's recommendation: its classification, action, confidence, trend, what it runs "
    "on now and what it should run on.",
    labels=(
        *WORKLOAD_LABELS,
        "classification",
        "action",
        "confidence",
        "trend",
        "current",
        "recommended",
    ),
    gpu=False,
)
SAVINGS: Final = Family(
    "gpuscope_recommendation_savings_usd_per_month",
    "What following the recommendation saves, in USD a month (0 to keep).",
    labels=(*WORKLOAD_LABELS, "action", "confidence"),
    gpu=False,
)
COST_CURRENT: Final = Family(
    "gpuscope_recommendation_current_cost_usd_per_month",
    "What the workload's GPUs cost now, in USD a month.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
COST_RECOMMENDED: Final = Family(
    "gpuscope_recommendation_recommended_cost_usd_per_month",
    "What its GPUs would cost as recommended, in USD a month.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
GPUS_CURRENT: Final = Family(
    "gpuscope_recommendation_current_gpus",
    "GPUs the workload held on average over the window, a MIG slice or a time-sliced share "
    "counting as its part of one: its share of the whole GPUs gpuscope_rightsize_report_gpus "
    "counts at the end of the window.",
    labels=(*WORKLOAD_LABELS, "gpu"),
    gpu=False,
    labels_doc="`gpu`: what it runs on (`A100 80GB SXM`, `H100 SXM MIG 1g.10gb`)",
)
GPUS_RECOMMENDED: Final = Family(
    "gpuscope_recommendation_recommended_gpus",
    "Its share as recommended, counted the same way (0 when it should release its GPUs).",
    labels=(*WORKLOAD_LABELS, "gpu"),
    gpu=False,
)
REPORT_GPUS: Final = Family(
    "gpuscope_rightsize_report_gpus",
    "GPUs the report's workloads hold at the end of the window, as the report counts them (its "
    "'GPUs now'): whole GPUs, MIG instances packed onto GPUs of their model and pods "
    "time-slicing a GPU counted once; per cluster and GPU model.",
    labels=("cluster", "gpu"),
    gpu=False,
    labels_doc="`gpu`: the GPU model (`A100 80GB SXM`)",
)
REPORT_RECOMMENDED_GPUS: Final = Family(
    "gpuscope_rightsize_report_recommended_gpus",
    "GPUs they would hold following the recommendations, counted the same way (the report's "
    "'after'); per cluster and GPU model.",
    labels=("cluster", "gpu"),
    gpu=False,
)
REPLICAS: Final = Family(
    "gpuscope_recommendation_replicas",
    "Pods of the workload holding its GPUs at the end of the window.",
    labels=WORKLOAD_LABELS,
    gpu=False,
)
REPORT_END: Final = Family(
    "gpuscope_rightsize_report_end_timestamp_seconds",
    "End of the window the served report covers, in unix seconds.",
    unit="seconds",
    gpu=False,
)
RECOMMENDATION_FAMILIES: Final = (
    RECOMMENDATION_INFO,
    SAVINGS,
    COST_CURRENT,
    COST_RECOMMENDED,
    GPUS_CURRENT,
    GPUS_RECOMMENDED,
    REPORT_GPUS,
    REPORT_RECOMMENDED_GPUS,
    REPLICAS,
    REPORT_END,
)
LAST_REFRESH: Final = Family(
    "gpuscope_rightsize_last_refresh_timestamp_seconds",
    "When the last refresh ended, successful or not, in unix seconds.",
    unit="seconds",
    gpu=False,
)
LAST_DURATION: Final = Family(
    "gpuscope_rightsize_last_refresh_duration_seconds",
    "How long the last refresh took.",
    unit="seconds",
    gpu=False,
)
LAST_SUCCESS: Final = Family(
    "gpuscope_rightsize_last_refresh_success",
    "1 if the last refresh made a report, 0 if it failed (the previous report is still served).",
    gpu=False,
)
LAST_SUCCESS_TIME: Final = Family(
    "gpuscope_rightsize_last_success_timestamp_seconds",
    "When the served report was made, in unix seconds.",
    unit="seconds",
    gpu=False,
)
REFRESHES: Final = Family(
    "gpuscope_rightsize_refreshes",
    "Refreshes by result: success, failure.",
    kind="counter",
    labels=("result",),
    gpu=False,
)
NOTIFICATIONS: Final = Family(
    "gpuscope_rightsize_notifications",
    "Summaries posted to webhooks, by service (slack, teams, json) and result (success, failure).",
    kind="counter",
    labels=("service", "result"),
    gpu=False,
)
SERVER_FAMILIES: Final = (
    LAST_REFRESH,
    LAST_DURATION,
    LAST_SUCCESS,
    LAST_SUCCESS_TIME,
    REFRESHES,
    NOTIFICATIONS,
)


def metrics_table() -> str:
    """The rightsizing guide's table of the series `gpuscope rightsize serve` exports."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for family in (*RECOMMENDATION_FAMILIES, *SIMULATION_FAMILIES, *SERVER_FAMILIES):
        labels = ", ".join(f"`{label}`" for label in family.labels)
        if family.labels_doc:
            labels += f"; {family.labels_doc}"
        rows.append(f"| `{family.exposed_name}` | {family.kind} | {labels} | {family.meaning} |")
    return "\n".join(rows)


def _metric(family: Family) -> GaugeMetricFamily | CounterMetricFamily:
    if family.kind == "counter":
        return CounterMetricFamily(family.name, family.help, labels=list(family.labels))
    return GaugeMetricFamily(family.name, family.help, labels=list(family.labels))


def _workload(row: WorkloadRow) -> list[str]:
    history = row.history
    return [history.cluster, history.namespace, history.name, history.kind]


def recommendation_metrics(report: Report) -> Iterator[Metric]:
    """The report's recommendations as metric families."""
    metrics = {family.name: _metric(family) for family in RECOMMENDATION_FAMILIES}

    def add(family: Family, labels: list[str], value: float) -> None:
        metrics[family.name].add_metric(labels, value)

    for row in report.rows:
        recommendation, labels = row.recommendation, _workload(row)
        current = recommendation.current
        current_gpus = row.gpus_held * (current.share if current else 1.0)
        recommended_gpus = current_gpus
        target = recommendation.target
        if recommendation.classification == IDLE:
            recommended_gpus = 0.0
        elif recommendation.classification == UNDERUSED and target is not None:
            recommended_gpus = row.gpus_held * target.share
        now = current.label if current else row.history.model
        after = row.target_label if recommendation.action != "keep" else now
        add(
            RECOMMENDATION_INFO,
            [
                *labels,
                recommendation.classification,
                recommendation.action,
                row.confidence_level,
                row.trend.direction if row.trend else "unknown",
                now,
                after,
            ],
            1,
        )
        add(SAVINGS, [*labels, recommendation.action, row.confidence_level], row.savings or 0.0)
        if row.cost_current is not None:
            add(COST_CURRENT, labels, row.cost_current)
        if row.cost_recommended is not None:
            add(COST_RECOMMENDED, labels, row.cost_recommended)
        add(GPUS_CURRENT, [*labels, now], current_gpus)
        add(GPUS_RECOMMENDED, [*labels, after], recommended_gpus)
        add(REPLICAS, labels, row.replicas)
    for cluster, consolidation in report.cluster_consolidations:
        for change in consolidation.models:
            add(REPORT_GPUS, [cluster, change.model], change.gpus_before)
            add(REPORT_RECOMMENDED_GPUS, [cluster, change.model], change.gpus_after)
    add(REPORT_END, [], report.end)
    yield from metrics.values()
    yield from simulation_metrics(report.simulation)


class _Collect:
    """A prometheus_client collector of metrics made by a function."""

    def __init__(self, make: Any) -> None:
        self._make = make

    def collect(self) -> Iterable[Metric]:
        return list(self._make())


def exposition(metrics: Iterable[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collect(lambda: metrics))
    return generate_latest(registry)


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


def make_report(config: ServeConfig) -> Published:
    """One refresh, start to finish; blocking (its own event loop): the refresh thread's."""
    started, began = time.time(), time.monotonic()
    run = config.run if config.run.fixed_end else replace(config.run, end=started)
    report = asyncio.run(asyncio.wait_for(produce(run), refresh_deadline(config.refresh)))
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
            published = await loop.run_in_executor(self._thread, make_report, self.config)
        except (PrometheusError, TimeoutError) as error:
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
            metric = _metric(family)
            if value is not None:
                metric.add_metric([], value)
            yield metric
        refreshes = _metric(REFRESHES)
        refreshes.add_metric(["success"], self.successes)
        refreshes.add_metric(["failure"], self.failures)
        yield refreshes
        sent = _metric(NOTIFICATIONS)
        for (service, result), value in self.notifications.items():
            sent.add_metric([service, result], value)
        yield sent

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def web_families(counts: counters.WebCounts) -> Iterator[Metric]:
    """The endpoint's counts, as the daemon exports them."""
    for family, value in (
        (counters.CONNECTIONS_OPEN, counts.connections_open),
        (counters.CONNECTIONS_MAX, counts.connections_max),
        (counters.BAD_REQUESTS, counts.bad_requests),
    ):
        metric = _metric(family)
        metric.add_metric([], value)
        yield metric
    for family, by_reason in (
        (counters.CONNECTIONS_CLOSED, counts.closed),
        (counters.REQUESTS_REFUSED, counts.refused),
    ):
        metric = _metric(family)
        for reason, value in by_reason:
            metric.add_metric([reason], value)
        yield metric


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
            _Collect(lambda: [*refresher.families(), *web_families(security.counts())])
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
