"""OpenCost's GPU prices for the GPUs the workloads held: what their current GPUs cost.

OpenCost publishes `node_gpu_hourly_cost`, the price of one GPU on each node (scraped with
`honor_labels`, so its `node` label is OpenCost's own), from the cloud's billing or its custom
pricing: spot and committed prices the catalog cannot know. A GPU on such a node is priced at its
node's price averaged over the window; the highest of several OpenCost replicas' counts, and 0
(OpenCost not knowing the price) is no price. Devices are placed on nodes by the `node` label
of gpuscope's `gpu_info` (the scrape adds it), or dcgm-exporter's `Hostname`/`hostname` (its
node's name). One query per run, at the end of the window; a failure leaves every GPU priced by
the catalog, with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.prometheus import Bounds, PrometheusQueryError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from exporter.rightsize.history import DeviceHistory
    from exporter.rightsize.prometheus import PrometheusClient

log = logging.getLogger("exporter.rightsize.history")

OPENCOST: Final = "opencost"
CATALOG: Final = "catalog"
MAX_PRICE: Final = 1_000.0
"""USD per GPU-hour: ten times the dearest GPU a cloud rents; anything above is no price."""

_NODE_PRICE: Final = 'max by ({K}node) (avg_over_time(node_gpu_hourly_cost{{node!=""}}[{w}]) > 0)'
_DEVICES: Final = {
    "gpuscope": ("uuid", 'last_over_time(gpu_info{{node!=""}}[{w}])'),
    # dcgm-exporter names the node `Hostname` up to 4.8.2, `hostname` since: either becomes
    # `node`; a series with neither keeps the `node` a scrape may have added.
    "dcgm-exporter": (
        "UUID",
        (
            'label_replace(label_replace(last_over_time({{__name__=~"DCGM_FI_DEV_FB_USED'
            '|DCGM_FI_DEV_FB_USED_BYTES"}}[{w}]), "node", "$1", "hostname", "(.+)"), '
            '"node", "$1", "Hostname", "(.+)")'
        ),
    ),
}


def node_price_query(source: str, *, window: float, cluster_label: str | None = None) -> str:
    """PromQL: OpenCost's price of each GPU the source lists on a node OpenCost prices."""
    uuid, devices = _DEVICES[source]
    k = f"{cluster_label}, " if cluster_label else ""
    w = format_duration(window)
    return (
        f"max by ({uuid}) ({devices.format(w=w)} * 0 "
        f"+ on ({k}node) group_left () {_NODE_PRICE.format(K=k, w=w)})"
    )


async def node_prices(
    client: PrometheusClient,
    *,
    source: str,
    end: float,
    window: float,
    cluster_label: str | None = None,
) -> Mapping[str, float]:
    """OpenCost's price per GPU-hour of each GPU on a node it prices, by uuid (a GPU's; a MIG
    instance's own in gpuscope's series, its parent's in dcgm-exporter's)."""
    uuid = _DEVICES[source][0]
    try:
        samples = await client.query(
            node_price_query(source, window=window, cluster_label=cluster_label),
            at=end,
            name="opencost_prices",
            bounds=Bounds(0.0, MAX_PRICE, "USD per GPU-hour"),
        )
    except PrometheusQueryError as error:
        log.warning(
            "OpenCost's prices unavailable: GPUs priced by the catalog",
            extra={"error": str(error)},
        )
        return {}
    return {sample.labels[uuid]: sample.value for sample in samples if sample.labels.get(uuid)}


def opencost_price(prices: Mapping[str, float], uuid: str) -> float | None:
    """The OpenCost price of a device: its own, else its parent GPU's (dcgm-exporter's MIG
    instances are `UUID/GPU_I_ID`)."""
    price = prices.get(uuid)
    return price if price is not None else prices.get(uuid.split("/", 1)[0])


@dataclass(frozen=True, slots=True)
class CurrentCost:
    """What a workload's current GPUs cost per month, who priced them, and the factor that
    prices its options alike."""

    usd_per_month: float | None
    """None when a GPU it held has no price at all."""
    source: str | None
    """`opencost`, `catalog` (the catalog or `--prices`), `opencost+catalog` when its GPUs were
    on nodes of both kinds; None when unpriced."""
    option_scale: float = 1.0
    """The options the strategy compares are priced from the catalog: times this (OpenCost's
    cost over the catalog's for the same GPUs) so that savings compare like with like."""


def current_cost(
    devices: Sequence[DeviceHistory],
    months: Sequence[float],
    *,
    catalog_price: float | None,
    unshared: float,
    node_prices: Mapping[str, float],
) -> CurrentCost:
    """Each device at OpenCost's price for its node, else the catalog's: GPU-hours per month
    (`months`, one per device) times the price, times `unshared` (a MIG instance's part of the
    GPU), times the part of it the workload reserved (`DeviceHistory.part`)."""
    total = catalog_total = 0.0
    sources: set[str] = set()
    for hours, device in zip(months, devices, strict=True):
        price = opencost_price(node_prices, device.uuid)
        sources.add(CATALOG if price is None else OPENCOST)
        price = catalog_price if price is None else price
        if price is None:
            return CurrentCost(None, None)
        total += hours * price * unshared * device.part
        if catalog_price is not None:
            catalog_total += hours * catalog_price * unshared * device.part
    scale = total / catalog_total if catalog_total > 0 else 1.0
    return CurrentCost(total, "+".join(sorted(sources, key=(OPENCOST, CATALOG).index)), scale)
