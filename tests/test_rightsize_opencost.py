"""`gpuscope rightsize` prices a GPU on a node OpenCost prices at OpenCost's `node_gpu_hourly_cost`
for that node, every other at the catalog's, and says which: from gpuscope's series and from
dcgm-exporter's, on one real Prometheus holding both histories and an OpenCost stand-in's series
(as a scrape with `honor_labels` stores them)."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import pytest

from tests import dcgm_history_data
from tests.helpers import require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_run import rightsize
from tests.synthetic_history import FakeWorkload, Wave, backfill, write_openmetrics

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

END = dcgm_history_data.END
DAY = 86400.0
SPAN = 1.1 * DAY
INTERVAL = 120.0
"""gpuscope's scrapes: a 5-minute step's rate needs two samples."""
DCGM_INTERVAL = 300.0
HOURS_PER_MONTH = 730.0
OPENCOST_H100 = 2.0
"""OpenCost's price of an H100 on node-a (spot: well under any catalog price)."""
OPENCOST_DCGM = 3.0
WORKLOADS = [
    FakeWorkload("priced", "train-a", busy=Wave(0.95, jitter=0.02), memory_gib=Wave(70)),
    FakeWorkload("priced", "train-b", busy=Wave(0.95, jitter=0.02), memory_gib=Wave(70)),
    FakeWorkload("priced", "chat-a", busy=Wave(0.08, jitter=0.02), memory_gib=Wave(6)),
    FakeWorkload("priced", "chat-b", busy=Wave(0.08, jitter=0.02), memory_gib=Wave(6)),
]
NODES = {"train-a": "node-a", "chat-a": "node-a", "train-b": "node-b", "chat-b": "node-b"}
"""node-a is priced by OpenCost; node-b only with 0 (OpenCost without a price for it)."""
DCGM_PRICED = {"48-plain", "49-plain"}
"""dcgm-exporter's nodes OpenCost prices: one named by 4.8's `Hostname`, one by 4.9's `hostname`."""


def _opencost(times: list[float]) -> str:
    """gpu_info for the synthetic GPUs (the scrape's `node`) and OpenCost's series: two replicas
    for node-a (another `instance` on one), 0 for node-b, a price for a node without GPUs."""
    lines = ["# TYPE gpu_info gauge\n"]
    for workload in WORKLOADS:
        for _, gpu, uuid in workload.devices():
            labels = (
                f'gpu="{gpu}",uuid="{uuid}",model="{workload.model}",job="gpuscope",'
                f'instance="10.0.0.7:9455",node="{NODES[workload.name]}"'
            )
            lines += [f"gpu_info{{{labels}}} 1 {t:.0f}\n" for t in times]
    prices = [
        ("node-a", "node-a", OPENCOST_H100),
        ("node-a", "10.1.0.1", OPENCOST_H100),
        ("node-b", "node-b", 0.0),
        ("node-z", "node-z", 9.0),
        *((f"gpu-node-{form}", f"gpu-node-{form}", OPENCOST_DCGM) for form in sorted(DCGM_PRICED)),
    ]
    lines.append("# TYPE node_gpu_hourly_cost gauge\n")
    for node, instance, price in prices:
        labels = (
            f'node="{node}",instance="{instance}",instance_type="p5.48xlarge",'
            f'region="us-east-1",job="opencost"'
        )
        lines += [f"node_gpu_hourly_cost{{{labels}}} {price:g} {t:.0f}\n" for t in times]
    return "".join(lines)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("opencost-prometheus")
    promtool = require_tool("promtool")
    gpuscope = io.StringIO()
    write_openmetrics(gpuscope, WORKLOADS, end=END, duration=SPAN, interval=INTERVAL)
    times = [END - i * INTERVAL for i in range(int(SPAN / INTERVAL), -1, -1)]
    history = gpuscope.getvalue().removesuffix("# EOF\n") + _opencost(times) + "# EOF\n"
    (root / "gpuscope.om").write_text(history)
    backfill(promtool, root / "gpuscope.om", root / "data")
    with (root / "dcgm.om").open("w") as out:
        dcgm_history_data.write_openmetrics(out, days=SPAN / DAY, interval=DCGM_INTERVAL)
    backfill(promtool, root / "dcgm.om", root / "data")
    with running_prometheus(root / "data") as url:
        yield url


def report(prometheus: str, source: str) -> dict[str, dict[str, Any]]:
    result = rightsize(
        "--prometheus", prometheus, f"--end={END}", "--window=1d", "--format=json",
        f"--source={source}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return {f"{w['namespace']}/{w['workload']}": w for w in document["workloads"]}


def test_gpus_on_a_node_opencost_prices_cost_its_price_the_others_the_catalogs(
    prometheus: str,
) -> None:
    rows = report(prometheus, "gpuscope")
    train_a, train_b = rows["priced/train-a"], rows["priced/train-b"]
    assert train_a["price_source"] == "opencost"
    assert train_a["cost_current_usd_per_month"] == pytest.approx(
        HOURS_PER_MONTH * OPENCOST_H100, rel=0.01
    )
    # node-b's OpenCost price is 0 (none known), node-z's is no other node's: the catalog's.
    assert train_b["price_source"] == "catalog"
    assert train_b["option_price_scale"] == 1
    catalog_h100 = train_b["cost_current_usd_per_month"] / HOURS_PER_MONTH
    assert catalog_h100 > OPENCOST_H100
    scale = OPENCOST_H100 / catalog_h100
    assert train_a["option_price_scale"] == pytest.approx(scale, rel=0.01)
    # Alike workloads get the same smaller GPU; its catalog price is scaled like the current
    # one's, so the savings compare OpenCost's price with OpenCost's, never with the catalog's.
    chat_a, chat_b = rows["priced/chat-a"], rows["priced/chat-b"]
    assert chat_a["recommended"] == chat_b["recommended"]
    assert chat_a["classification"] == "underused"
    assert chat_a["cost_recommended_usd_per_month"] < chat_a["cost_current_usd_per_month"]
    assert chat_a["cost_recommended_usd_per_month"] == pytest.approx(
        chat_b["cost_recommended_usd_per_month"] * scale, rel=0.01
    )


def test_dcgm_exporter_history_is_priced_by_opencost_through_its_hostname_label(
    prometheus: str,
) -> None:
    rows = report(prometheus, "dcgm-exporter")
    for form in dcgm_history_data.FORMS:
        pretrain = rows[f"{dcgm_history_data.namespace(form)}/pretrain"]
        if form in DCGM_PRICED:
            assert pretrain["price_source"] == "opencost", form
            assert pretrain["cost_current_usd_per_month"] == pytest.approx(
                HOURS_PER_MONTH * OPENCOST_DCGM, rel=0.01
            )
        else:
            assert pretrain["price_source"] == "catalog", form
