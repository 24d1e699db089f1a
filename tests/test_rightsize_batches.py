"""Per-pod rightsizing signals ask about the pods found in batches, each query short enough for
any PromQL server (VictoriaMetrics refuses queries over 16 KiB by default)."""

from __future__ import annotations

import re

import pytest

from exporter.rightsize.history import MAX_POD_MATCHER_BYTES, SIGNALS, pod_batches, render
from exporter.rightsize.selection import Selection

pytestmark = pytest.mark.timeout(60)

PODS = [(f"team-{n % 20:02d}", f"w{n:05d}-7d9f8-{n % 3:05d}") for n in range(10_000)]


def test_batches_hold_every_pod_once_in_order() -> None:
    batches = pod_batches(PODS + PODS[:10])
    assert [pair for batch in batches for pair in batch] == sorted(PODS)
    assert len(batches) > 1


def test_every_per_pod_query_stays_under_victoriametrics_limit() -> None:
    per_pod = [signal for signal in SIGNALS if signal.per_pod]
    assert per_pod
    for signal in per_pod:
        for batch in pod_batches(PODS):
            promql = render(
                signal,
                selection=Selection(),
                window=14 * 86400,
                step=300,
                quantile=0.95,
                pods=batch,
                cluster_label="cluster",
            )
            assert len(promql.encode()) < 16 * 1024
            # The batch's pods, and no other, are named.
            named = re.search(r'pod=~"([^"]*)"', promql)
            assert named is not None
            assert named[1].count("|") == len(batch) - 1


def test_a_pod_longer_than_the_limit_is_a_batch_of_its_own() -> None:
    long = ("ns", "p" * (MAX_POD_MATCHER_BYTES + 1))
    assert pod_batches([("ns", "a"), long, ("ns", "q")]) == [[("ns", "a")], [long], [("ns", "q")]]
