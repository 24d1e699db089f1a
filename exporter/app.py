"""The daemon's application: its HTTP endpoints, and the lifecycle of everything it runs.

`App(config, driver)` holds what the daemon runs; `start()` starts each long-lived resource in
order (pod attribution, sampling, the node condition's and Events' tasks, the web config's
watch) and `stop()` stops them in reverse.
`handle` answers a request: the web config's checks (`exporter.web.security`), then the route.
Handlers never touch NVML: `/metrics` sends the bytes of the latest snapshot, rendered by the
sampling loop or, for the snapshot's first scrape in a format, in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.actions import task_healths
from exporter.catalog import Catalog, builtin_catalog
from exporter.metrics.base import add, new_metric
from exporter.metrics.exposition import negotiate
from exporter.metrics.families import BuildInfo
from exporter.metrics.process import own_families
from exporter.sampling import SamplingLoop
from exporter.supervise import TaskHealth, background_task, in_daemon_thread, supervised
from exporter.trace.endpoint import PATH as TRACE_PATH
from exporter.trace.endpoint import Tracing
from exporter.web.http import Handler, Request, Response, accepts_gzip, routed
from exporter.web.security import WebSecurity

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from prometheus_client.core import Metric

    from exporter.attribution import ClusterAccess
    from exporter.attribution.attributor import Attributor
    from exporter.config import ServeConfig
    from exporter.nvml.driver import NvmlDriver
    from exporter.simulator.fleet import Fleet
    from exporter.web import counters

log = logging.getLogger(__name__)


class App:
    """The daemon: `cluster` (from `exporter.attribution.access.resolve_cluster`) turns pod
    attribution on; without one, a simulated `fleet` with pods attributes from them;
    `security` (from `WebSecurity.load`) applies the web config; without it the endpoint is
    open, with `--web.max-requests` still in force."""

    def __init__(
        self,
        config: ServeConfig,
        driver: NvmlDriver,
        *,
        catalog: Catalog | None = None,
        cluster: ClusterAccess | None = None,
        fleet: Fleet | None = None,
        security: WebSecurity | None = None,
    ) -> None:
        self.config = config
        self.driver = driver
        self.catalog = catalog or builtin_catalog()
        self.cluster = cluster
        self.fleet = fleet
        self.security = security or WebSecurity(None, max_requests=config.max_requests)
        self.web_watch = TaskHealth("web_config")
        self.actions = task_healths(config)
        """`--kubernetes.node-condition`'s and `--kubernetes.events`' tasks, by collector name."""
        self.attributor: Attributor | None = None
        self._sampling: SamplingLoop | None = None
        self._running: list[contextlib.AsyncExitStack] = []
        """One exit stack per started resource, so that `stop` can stop them all at once."""
        self.routes: dict[str, Handler] = {
            "/": self.landing,
            config.telemetry_path: self.metrics,
            "/-/healthy": self.healthy,
            "/-/ready": self.ready,
        }
        """The endpoints by path (read per request)."""
        self.tracing: Tracing | None = None
        if config.enable_trace:
            self.tracing = Tracing(
                driver, lambda: self.sampling.gpu_threads, lambda: self.sampling.snapshot
            )
            self.routes[TRACE_PATH] = self.tracing.handle
        self.handle = self.security.guard(routed(self.routes))

    @property
    def sampling(self) -> SamplingLoop:
        """The sampling loop (once started)."""
        assert self._sampling is not None, "App.start() first"
        return self._sampling

    async def start(self) -> None:
        """Start everything, in order (sampling takes the attributor the pod watch made); what
        started is stopped again, in reverse, if a later part fails."""
        running: list[contextlib.AsyncExitStack] = []
        async with contextlib.AsyncExitStack() as starting:
            for resource in (
                self._attribution,
                self._sampling_loop,
                self._traces,
                self._cluster_actions,
                self._web_config,
            ):
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(resource())
                starting.push_async_callback(stack.aclose)
                running.append(stack)
            starting.pop_all()
        self._running = running

    async def stop(self) -> None:
        """Stop everything at once: each part has its own bound (sampling's cycle in flight and
        NVML's shutdown, the pod watch's threads, the web config's watch), and none waits for
        another, so the whole stop takes as long as the slowest part, not their sum. A part
        that fails to stop is logged; the others stop all the same."""
        running, self._running = self._running, []
        results = await asyncio.gather(
            *(stack.aclose() for stack in running), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                log.error("a part of the daemon failed to stop", exc_info=result)

    @contextlib.asynccontextmanager
    async def _attribution(self) -> AsyncIterator[None]:
        """The pod watch: started before sampling, stopped after it."""
        cluster = self.cluster
        config = self.config
        fleet = self.fleet
        if "attribution" not in config.collectors:
            log.info("pod attribution is switched off (--no-collector.attribution)")
            yield
            return
        if cluster is not None:
            # A real node's sources (the API server's watches over urllib3, the kubelet's HTTP/2)
            # are imported only when there is a cluster. The `kubernetes` package is not among
            # them: only a kubeconfig's auth-provider loads it, at its first request.
            from exporter.attribution.live import cluster_attributor  # noqa: PLC0415

            attributor = cluster_attributor(config, cluster)
            where: dict[str, object] = {
                "node": cluster.node_name,
                "cluster": cluster.source,
                "procfs": str(config.procfs),
                "pod_resources_socket": str(config.pod_resources_socket),
                "dra_drivers": ",".join(config.dra_drivers) or "off",
            }
        elif fleet is not None and fleet.pods:
            # The attribution modules are imported only when used.
            from exporter.simulator.cluster import NODE, simulated_attributor  # noqa: PLC0415

            attributor = simulated_attributor(
                fleet,
                node=config.node_name,
                pod_labels=config.pod_labels,
                image_pattern=config.image_pattern,
            )
            where = {"node": config.node_name or NODE, "cluster": "the fleet file's pods"}
        else:
            log.info(
                "no Kubernetes configuration (no --kubeconfig, no service account, no $KUBECONFIG): "
                "pod attribution is off"
            )
            yield
            return
        attributor.start()
        self.attributor = attributor
        log.info("pod attribution on", extra=where)
        try:
            yield
        finally:
            # In a daemon thread: a stop that overran the daemon's own deadline must not hold
            # up the exit (asyncio's default executor is joined when the loop ends).
            await in_daemon_thread("gpuscope-attribution-stop", attributor.stop)

    @contextlib.asynccontextmanager
    async def _sampling_loop(self) -> AsyncIterator[None]:
        config = self.config
        sampling = SamplingLoop(
            config,
            self.driver,
            build=BuildInfo(__version__),
            catalog=self.catalog,
            attributor=self.attributor,
            own_families=_own_families(self.security),
            background=(
                *((self.web_watch,) if config.web_config_file is not None else ()),
                *self.actions.values(),
            ),
        )
        await sampling.start()
        self._sampling = sampling
        sampling.begin()
        try:
            yield
        finally:
            await sampling.close()

    @contextlib.asynccontextmanager
    async def _traces(self) -> AsyncIterator[None]:
        """The traces under way end (503) when the daemon stops, rather than holding its stop
        up for up to a minute."""
        try:
            yield
        finally:
            if self.tracing is not None:
                self.tracing.stop()

    @contextlib.asynccontextmanager
    async def _cluster_actions(self) -> AsyncIterator[None]:
        """The node condition and the pods' Events, when asked for: they read what sampling
        publishes, so they start after it and stop before it."""
        if not self.actions:
            yield
            return
        # Imported only when asked for, as attribution's are: they bring the API client.
        from exporter.actions.tasks import running  # noqa: PLC0415

        sampling = self.sampling
        async with running(self.config, self.cluster, lambda: sampling.snapshot, self.actions):
            yield

    @contextlib.asynccontextmanager
    async def _web_config(self) -> AsyncIterator[None]:
        """Re-read the web config when its files change; restarted if the watch fails."""
        security = self.security
        task = background_task(
            supervised(self.web_watch, security.watch), name="gpuscope-web-config"
        )
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            security.close()

    # -- the endpoints ----------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        exposition = self.sampling.exposition
        if exposition is None:
            return Response.text("no sample taken yet; retry in a moment\n", 503)
        name = negotiate(request.header("accept"))
        rendered = exposition.rendered(name)
        if rendered is None:  # the snapshot's first scrape in this format renders it, off the loop
            rendered = await asyncio.to_thread(exposition.render, name)
        exposition.mark_served(name)
        headers = {"Content-Type": rendered.content_type, "Cache-Control": "no-store"}
        if accepts_gzip(request.header("accept-encoding")):
            headers["Content-Encoding"] = "gzip"
            return Response(body=rendered.gzipped, headers=headers)
        return Response(body=rendered.body, headers=headers)

    async def healthy(self, _request: Request) -> Response:
        """Fails when the sampling loop is dead or wedged: the kubelet then restarts the daemon."""
        return _probe(self.sampling.alive())

    async def ready(self, _request: Request) -> Response:
        """200 once a first cycle finished and while cycles keep completing."""
        return _probe(self.sampling.ready())

    async def landing(self, _request: Request) -> Response:
        path = html.escape(self.config.telemetry_path)
        trace = (
            f'\n<li><a href="{TRACE_PATH}?seconds=5">{TRACE_PATH}?seconds=5</a> &mdash; '
            "a 5-second GPU trace (Perfetto)</li>"
            if self.tracing is not None
            else ""
        )
        page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuscope</title></head>
<body>
<h1>gpuscope {html.escape(__version__)}</h1>
<p>GPU metrics for Prometheus, attributed to Kubernetes pods.</p>
<ul>
<li><a href="{path}">{path}</a> &mdash; metrics</li>
<li><a href="/-/healthy">/-/healthy</a> &mdash; the sampling loop is alive</li>
<li><a href="/-/ready">/-/ready</a> &mdash; samples are current</li>{trace}
</ul>
</body></html>
"""
        return Response(body=page.encode(), content_type="text/html; charset=utf-8")


def _own_families(security: WebSecurity) -> Callable[[], list[Metric]]:
    """The process's own families and the endpoint's counts, read by each sampling cycle."""
    process = own_families()

    def read() -> list[Metric]:
        return [*process(), *_web_families(security.counts())]

    return read


def _web_families(counts: counters.WebCounts) -> Iterator[Metric]:
    for family, samples in counts.by_family():
        metric = new_metric(family)
        for values, value in samples:
            add(metric, dict(zip(family.labels, values, strict=True)), value)
        yield metric


def _probe(state: tuple[bool, str]) -> Response:
    ok, reason = state
    return Response.text(f"{reason}\n", 200 if ok else 503)
