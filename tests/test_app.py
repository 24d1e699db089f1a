"""The daemon's application in-process, on the simulator, served on a loopback port."""

from __future__ import annotations

import gzip
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from exporter.app import App
from exporter.config import ServeConfig
from exporter.simulator import SimulatedNvml, default_fleet
from tests.helpers import eventually_async, loop_cycles_pass

if TYPE_CHECKING:
    from exporter.metrics.exposition import Exposition
    from exporter.sampling import SamplingLoop
    from tests.served_app import AppClient

CONFIG = replace(ServeConfig(), collect_interval=0.1, telemetry_path="/gpu-metrics")


async def ready_client(app_client: Any) -> AppClient:
    client: AppClient = await app_client(App(CONFIG, SimulatedNvml(default_fleet(2))))

    async def ready() -> bool:
        return (await client.get("/-/ready")).status == 200

    await eventually_async(ready, 4, "the app to be ready", every=0.02)
    return client


async def next_exposition(sampling: SamplingLoop) -> Exposition:
    """The loop's next snapshot, once its cycle published one."""
    previous = sampling.exposition
    return await eventually_async(
        lambda: sampling.exposition is not previous and sampling.exposition, 5, "the next snapshot"
    )


async def test_metrics_on_the_configured_path(app_client: Any) -> None:
    client = await ready_client(app_client)
    response = await client.get("/gpu-metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    body = await response.text()
    assert "gpu_utilization_ratio{" in body
    assert (await client.get("/metrics")).status == 404


async def test_openmetrics_and_gzip(app_client: Any) -> None:
    client = await ready_client(app_client)
    response = await client.get(
        "/gpu-metrics",
        headers={"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"},
        auto_decompress=False,
    )
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(await response.read()).endswith(b"# EOF\n")


async def test_snapshots_render_eagerly_only_while_scrapes_keep_up(app_client: Any) -> None:
    client = await ready_client(app_client)
    sampling = client.app.sampling
    await loop_cycles_pass(sampling, 2)  # cycles nobody scraped
    idle = sampling.exposition
    assert idle is not None
    assert idle.rendered("text") is None, "nobody scraped: nothing rendered"
    response = await client.get("/gpu-metrics")  # the first scrape renders it
    assert response.status == 200
    assert "gpu_up{" in await response.text()
    assert idle.served == {"text"}
    # Scraped every cycle from here on, every snapshot arrives rendered.
    for _ in range(5):
        current = await next_exposition(sampling)
        assert current.rendered("text") is not None
        assert (await client.get("/gpu-metrics")).status == 200


async def test_health_ready_and_landing(app_client: Any) -> None:
    client = await ready_client(app_client)
    assert (await client.get("/-/healthy")).status == 200
    assert (await client.get("/-/ready")).status == 200
    landing = await client.get("/")
    assert landing.status == 200
    assert 'href="/gpu-metrics"' in await landing.text()
    get, head = await client.get("/gpu-metrics"), await client.head("/gpu-metrics")
    assert head.status == 200
    assert await head.read() == b""
    assert head.headers["Content-Type"] == get.headers["Content-Type"]
    assert int(head.headers["Content-Length"]) > 0
    post = await client.request("POST", "/gpu-metrics", data=b"x")
    assert (post.status, post.headers["Allow"]) == (405, "GET, HEAD")
    assert (await client.request("POST", "/nowhere")).status == 404


async def test_not_ready_before_the_first_sample(app_client: Any) -> None:
    client = await ready_client(app_client)
    client.app.sampling.exposition = None
    assert (await client.get("/-/ready")).status == 503
    assert (await client.get("/gpu-metrics")).status == 503
    assert (await client.get("/-/healthy")).status == 200
