"""The aiohttp application: HTTP endpoints, and the lifecycle of everything the daemon runs.

`init_app(config, driver)` builds the Application; each long-lived resource is one
`cleanup_ctx` (started in order, stopped in reverse). Handlers never touch NVML: `/metrics`
sends the bytes of the latest snapshot, rendered by the sampling loop or, for the snapshot's
first scrape in a format, in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from typing import TYPE_CHECKING, Final

from aiohttp import web

from exporter import __version__
from exporter.catalog import Catalog, builtin_catalog
from exporter.config import ServeConfig
from exporter.metrics.base import add, new_metric
from exporter.metrics.exposition import accepts_gzip, negotiate
from exporter.metrics.families import BuildInfo
from exporter.metrics.process import own_families
from exporter.nvml.driver import NvmlDriver
from exporter.sampling import SamplingLoop
from exporter.supervise import TaskHealth, supervised
from exporter.web import counters
from exporter.web.security import WebSecurity

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from prometheus_client.core import Metric

    from exporter.attribution import ClusterAccess
    from exporter.attribution.attributor import Attributor
    from exporter.simulator.fleet import Fleet

log = logging.getLogger(__name__)

CONFIG: Final = web.AppKey("config", ServeConfig)
DRIVER: Final = web.AppKey("driver", NvmlDriver)
SAMPLING: Final = web.AppKey("sampling", SamplingLoop)
CATALOG: Final = web.AppKey("catalog", Catalog)
# Typed by annotation only: their classes live in modules imported only when a cluster exists.
CLUSTER: Final[web.AppKey[ClusterAccess | None]] = web.AppKey("cluster")
FLEET: Final[web.AppKey[Fleet | None]] = web.AppKey("fleet")
ATTRIBUTOR: Final[web.AppKey[Attributor]] = web.AppKey("attributor")
WEB: Final = web.AppKey("web", WebSecurity)
WEB_WATCH: Final = web.AppKey("web_watch", TaskHealth)


def init_app(
    config: ServeConfig,
    driver: NvmlDriver,
    *,
    catalog: Catalog | None = None,
    cluster: ClusterAccess | None = None,
    fleet: Fleet | None = None,
    security: WebSecurity | None = None,
) -> web.Application:
    """The application; `cluster` (from `exporter.attribution.cluster.resolve_cluster`) turns
    pod attribution on; without one, a simulated `fleet` with pods attributes from them;
    `security` (from `WebSecurity.load`) applies the web config; without it the endpoint is
    open, with `--web.max-requests` still in force."""
    security = security or WebSecurity(None, max_requests=config.max_requests)
    app = web.Application(client_max_size=64 * 1024, middlewares=[security.middleware])
    app[WEB] = security
    app[CONFIG] = config
    app[DRIVER] = driver
    app[CATALOG] = catalog or builtin_catalog()
    app[CLUSTER] = cluster
    app[FLEET] = fleet
    app[WEB_WATCH] = TaskHealth("web_config")
    app.cleanup_ctx.append(_attribution)
    app.cleanup_ctx.append(_sampling)
    app.cleanup_ctx.append(_web_config)
    app.router.add_get("/", landing)
    app.router.add_get(config.telemetry_path, metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    return app


async def _attribution(app: web.Application) -> AsyncIterator[None]:
    """The pod watch: started before sampling, stopped after it."""
    cluster = app[CLUSTER]
    config = app[CONFIG]
    fleet = app[FLEET]
    if "attribution" not in config.collectors:
        log.info("pod attribution is switched off (--no-collector.attribution)")
        yield
        return
    if cluster is not None:
        # The kubernetes client costs ~20 MiB: imported only when there is a cluster.
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
        # The attribution modules (protobuf among them) are imported only when used.
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
    app[ATTRIBUTOR] = attributor
    log.info("pod attribution on", extra=where)
    yield
    await asyncio.to_thread(attributor.stop)


async def _sampling(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    sampling = SamplingLoop(
        config,
        app[DRIVER],
        build=BuildInfo(__version__),
        catalog=app[CATALOG],
        attributor=app.get(ATTRIBUTOR),
        own_families=_own_families(app[WEB]),
        background=(app[WEB_WATCH],) if config.web_config_file is not None else (),
    )
    await sampling.start()
    app[SAMPLING] = sampling
    sampling.begin()
    yield
    await sampling.close()


def _own_families(security: WebSecurity) -> Callable[[], list[Metric]]:
    """The process's own families and the endpoint's counts, read by each sampling cycle."""
    process = own_families()

    def read() -> list[Metric]:
        return [*process(), *_web_families(security.counts())]

    return read


def _web_families(counts: counters.WebCounts) -> Iterator[Metric]:
    for family, value in (
        (counters.CONNECTIONS_OPEN, counts.connections_open),
        (counters.CONNECTIONS_MAX, counts.connections_max),
        (counters.BAD_REQUESTS, counts.bad_requests),
    ):
        metric = new_metric(family)
        add(metric, {}, value)
        yield metric
    for family, by_reason in (
        (counters.CONNECTIONS_CLOSED, counts.closed),
        (counters.REQUESTS_REFUSED, counts.refused),
    ):
        metric = new_metric(family)
        for reason, value in by_reason:
            add(metric, {"reason": reason}, value)
        yield metric


async def _web_config(app: web.Application) -> AsyncIterator[None]:
    """Re-read the web config when its files change; restarted if the watch fails."""
    security = app[WEB]
    health = app[WEB_WATCH]
    task = asyncio.create_task(supervised(health, security.watch), name="gpuscope-web-config")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    security.close()


async def metrics(request: web.Request) -> web.Response:
    sampling = request.app[SAMPLING]
    exposition = sampling.exposition
    if exposition is None:
        return web.Response(status=503, text="no sample taken yet; retry in a moment\n")
    name = negotiate(request.headers.get("Accept", ""))
    rendered = exposition.rendered(name)
    if rendered is None:  # the snapshot's first scrape in this format renders it, off the loop
        rendered = await asyncio.to_thread(exposition.render, name)
    exposition.mark_served(name)
    headers = {"Content-Type": rendered.content_type, "Cache-Control": "no-store"}
    if accepts_gzip(request.headers.get("Accept-Encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=rendered.gzipped, headers=headers)
    return web.Response(body=rendered.body, headers=headers)


async def healthy(request: web.Request) -> web.Response:
    """Fails when the sampling loop is dead or wedged: the kubelet then restarts the daemon."""
    return _probe(request.app[SAMPLING].alive())


async def ready(request: web.Request) -> web.Response:
    """200 once a first cycle finished and while cycles keep completing."""
    return _probe(request.app[SAMPLING].ready())


def _probe(state: tuple[bool, str]) -> web.Response:
    ok, reason = state
    return web.Response(status=200 if ok else 503, text=f"{reason}\n")


async def landing(request: web.Request) -> web.Response:
    path = html.escape(request.app[CONFIG].telemetry_path)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuscope</title></head>
<body>
<h1>gpuscope {html.escape(__version__)}</h1>
<p>GPU metrics for Prometheus, attributed to Kubernetes pods.</p>
<ul>
<li><a href="{path}">{path}</a> &mdash; metrics</li>
<li><a href="/-/healthy">/-/healthy</a> &mdash; the sampling loop is alive</li>
<li><a href="/-/ready">/-/ready</a> &mdash; samples are current</li>
</ul>
</body></html>
"""
    return web.Response(text=page, content_type="text/html")
