from __future__ import annotations

import gzip
import math
from typing import TYPE_CHECKING

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest as reference_text
from prometheus_client.openmetrics.exposition import generate_latest as reference_openmetrics

from exporter.metrics.exposition import (
    OPENMETRICS,
    TEXT,
    Exposition,
    negotiate,
)
from tests.golden_fleet import render_families

if TYPE_CHECKING:
    from collections.abc import Iterator


def family() -> GaugeMetricFamily:
    gauge = GaugeMetricFamily("gpu_up", "1 while the GPU answers.", labels=["gpu"])
    gauge.add_metric(["0"], 1)
    return gauge


PROMETHEUS_2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("", TEXT),
        ("*/*", TEXT),
        ("text/plain;version=0.0.4", TEXT),
        (PROMETHEUS_2_ACCEPT, OPENMETRICS),
        ("application/openmetrics-text; version=1.0.0", OPENMETRICS),
    ],
)
def test_negotiation(accept: str, chosen: str) -> None:
    assert negotiate(accept) == chosen


def test_formats_render_once_and_gzip_matches() -> None:
    exposition = Exposition(lambda: [family()], formats=[TEXT])
    assert exposition.rendered(OPENMETRICS) is None
    text = exposition.rendered(TEXT)
    assert text is not None
    assert b'gpu_up{gpu="0"} 1.0' in text.body
    assert text.content_type.startswith("text/plain; version=0.0.4")
    assert gzip.decompress(text.gzipped) == text.body
    openmetrics = exposition.render(OPENMETRICS)
    assert openmetrics is exposition.render(OPENMETRICS)
    assert openmetrics.body.endswith(b"# EOF\n")
    assert openmetrics.content_type.startswith("application/openmetrics-text")


def test_families_are_made_once_and_only_when_needed() -> None:
    made: list[int] = []

    def families() -> list[Metric]:
        made.append(1)
        return [family()]

    exposition = Exposition(families)
    assert made == []
    exposition.render(TEXT)
    exposition.render(OPENMETRICS)
    exposition.render(TEXT)
    assert made == [1]


def tricky_families() -> list[Metric]:
    gauge = GaugeMetricFamily(
        "gpu_info",
        'Identity with "quotes", a back\\slash\nand a newline.',
        labels=["gpu", "model", "note"],
        unit="",
    )
    gauge.add_metric(["0", 'NVIDIA "H100"', "back\\slash\nnewline é"], 1)
    gauge.add_metric(["1", "", "plain"], 0.5)
    counter = CounterMetricFamily("gpu_busy_seconds", "Busy time.", labels=["gpu"], unit="seconds")
    counter.add_metric(["0"], 1234567890.125)
    counter.add_metric(["1"], 1e-9)
    bare = GaugeMetricFamily(
        "gpuscope_last_sample_timestamp_seconds", "Last sample.", unit="seconds"
    )
    bare.add_metric([], 1.7e9)
    empty = GaugeMetricFamily("gpu_fan_speed_ratio", "No fans here.", labels=["gpu"], unit="ratio")
    special = GaugeMetricFamily("gpu_weird", "Special values.", labels=["kind"])
    for kind, number in (
        ("inf", math.inf),
        ("ninf", -math.inf),
        ("nan", math.nan),
        ("big", 1e22),
        ("int", 7),
        ("zero", 0),
        ("negative_zero", -0.0),
        ("float_again", 7.0),
        ("small", -2.5e-7),
    ):
        special.add_metric([kind], number)
    # the same label pairs as gpu_info's first series, given in another order
    reordered = GaugeMetricFamily("gpu_reordered", "Label order.", labels=["note", "model", "gpu"])
    reordered.add_metric(["back\\slash\nnewline é", 'NVIDIA "H100"', "0"], -0.0)
    return [gauge, counter, bare, empty, special, reordered]


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def test_fast_renderers_equal_prometheus_client_byte_for_byte() -> None:
    for families in (tricky_families(), await render_families(), tricky_families()):
        exposition = Exposition(lambda families=families: families)
        assert exposition.render(TEXT).body == reference_text(_Registry(families))  # type: ignore[arg-type]
        assert exposition.render(OPENMETRICS).body == reference_openmetrics(_Registry(families))
