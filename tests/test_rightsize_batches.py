"""Per-pod rightsizing signals ask about the pods found in batches, each query short enough for
any PromQL server (VictoriaMetrics refuses queries over 16 KiB by default); the job keeps to
`--prometheus.concurrency` and `--step` while doing so."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp import web

from exporter.rightsize.selection import Selection
from exporter.rightsize.signals import MAX_POD_MATCHER_BYTES, SIGNALS, pod_batches, render
from tests.rightsize_run import rightsize, serving

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


HELD = [
    {
        "namespace": f"team-{n % 7}",
        "workload_kind": "Deployment",
        "workload": f"service-{n:04d}",
        "pod": f"service-{n:04d}-7d9f8-{n:05d}",
        "uuid": f"GPU-{n:08x}",
        "container": "main",
        "model": "NVIDIA L4",
        "resource": "nvidia.com/gpu",
    }
    for n in range(600)
]
"""Pods enough for more than one batch of the per-pod queries."""


def _pods_named(query: str) -> list[str]:
    """The pods a per-pod query's `pod=~"..."` matcher names (unescaped)."""
    found = re.search(r'pod=~"([^"]*)"', query)
    assert found is not None, query
    return found[1].replace("\\\\", "").split("|")


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_job_keeps_to_its_concurrency_and_step_and_asks_every_pod(concurrency: int) -> None:
    seen: list[str] = []
    in_flight = 0
    most = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        query = (await request.post())["query"]
        assert isinstance(query, str)
        seen.append(query)
        in_flight += 1
        most = max(most, in_flight)
        try:
            # Hold each answer a moment, so that queries the job sends together overlap here.
            await asyncio.sleep(0.02)
        finally:
            in_flight -= 1
        if query == "vector(1)":
            result = [{"metric": {}, "value": [0, "1"]}]
        elif query.startswith("sum by") and "count_over_time(gpu_allocation_info" in query:
            result = [{"metric": labels, "value": [0, "4033"]} for labels in HELD]
        else:
            result = []
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    with serving(handler) as url:
        result = rightsize(
            f"--prometheus={url}",
            "--end=1780000200",
            "--step=10m",
            f"--prometheus.concurrency={concurrency}",
            "--format=json",
        )
    assert result.returncode == 0, result.stderr
    assert most <= concurrency
    # The step is the rate's range and every subquery's resolution.
    assert all("[5m]" not in query and ":5m]" not in query for query in seen)
    assert any("[14d:10m]" in query for query in seen)
    cpu = [query for query in seen if "container_cpu_usage_seconds_total" in query]
    window = [query for query in cpu if "[14d:10m]" in query]  # not a shorter term's
    named = [pod for query in window for pod in _pods_named(query)]
    assert sorted(named) == sorted(labels["pod"] for labels in HELD)
    assert len(window) > 1
    assert all(len(query.encode()) < 16 * 1024 for query in seen)
