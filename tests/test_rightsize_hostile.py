"""A hostile PromQL API (a forged series through a PodMonitor with `honorLabels` or remote
write, or a server of an attacker's): a negative, infinite, NaN or absurd value, a deeply nested
element, every series in every per-pod batch, names PromQL has to escape. Each costs only its
own series, with one warning naming it, in `gpuscope rightsize` and in `serve`'s refresh."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from exporter.rightsize.fetch import fetch
from exporter.rightsize.history import ContainerCpu
from exporter.rightsize.prometheus import Bounds, Connection, PrometheusClient, Sample
from exporter.rightsize.selection import Selection
from exporter.rightsize.signals import SIGNALS, render
from tests.helpers import require_tool
from tests.hostile_answers import matrix_samples
from tests.prometheus_server import free_port, running_prometheus
from tests.rightsize_hostile import (
    END,
    STEP,
    WINDOW,
    StandIn,
    held_pod,
    with_nested_element,
    with_value,
)
from tests.rightsize_run import rightsize, serving
from tests.rightsize_stack import serving as serving_report
from tests.synthetic_history import backfill

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.timeout(180)

GOOD, HOSTILE = "good", "hostile"
PODS = [held_pod(GOOD), held_pod(HOSTILE)]


def run(stand_in: StandIn, *args: str) -> tuple[dict[str, Any], str]:
    """The job's JSON report against the stand-in, and its log; the job must succeed."""
    with serving(stand_in.handle) as url:
        result = rightsize(f"--prometheus={url}", f"--end={END}", "--format=json", *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result.stderr


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {workload["workload"]: workload for workload in document["workloads"]}


def dropped_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if 'msg="prometheus series dropped"' in line]


CASES: list[tuple[str, str, Callable[[list[dict[str, Any]]], str], str]] = [
    ("negative", "busy_seconds", with_value(HOSTILE, "-5"), "outside 0.."),
    ("huge bytes", "memory_peak", with_value(HOSTILE, "1e308"), "bytes of GPU memory"),
    ("ratio far past 1", "busy_quantile", with_value(HOSTILE, "1e6"), "a ratio"),
    ("infinite", "in_use", with_value(HOSTILE, "+Inf"), "not a finite number"),
    ("NaN", "busy_idle_quantile", with_value(HOSTILE, "NaN"), "not a finite number"),
    ("a count past the window", "held", with_value(HOSTILE, "1e308"), "a count of steps"),
    ("not a number", "memory_quantile", with_value(HOSTILE, "many"), "not a number"),
]


@pytest.mark.parametrize(
    ("signal", "tamper", "reason"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_bad_value_drops_its_series_with_one_warning(
    signal: str, tamper: Callable[[list[dict[str, Any]]], str], reason: str
) -> None:
    document, log = run(StandIn(PODS, tamper={signal: tamper}))
    workloads = by_name(document)
    assert workloads[GOOD]["usage"]["utilization_mean"] == 0.5
    assert workloads[GOOD]["usage"]["memory_peak_bytes"] == 10 * 1024**3
    if signal != "held":
        assert HOSTILE in workloads, "the workload stays; only the bad series goes"
    else:
        assert HOSTILE not in workloads, "without its held series, nothing is known of it"
    (line,) = dropped_lines(log)  # once, although every term asks again
    assert f"query={signal}" in line
    assert f"workload={HOSTILE}" in line
    assert reason in line


def test_a_deeply_nested_element_is_one_dropped_series() -> None:
    stand_in = StandIn(PODS, tamper={"held": with_nested_element(200_000)})
    document, log = run(stand_in)
    assert set(by_name(document)) == {GOOD, HOSTILE}
    (line,) = dropped_lines(log)
    assert "nested too deeply" in line


def test_a_pod_name_with_a_newline_quote_or_backslash_costs_no_other_pods_cpu() -> None:
    """Its batch's per-pod queries stay valid PromQL: the other pods keep their CPU signals."""
    odd = [held_pod(GOOD, n) for n in range(3)]
    for number, name in enumerate(["line\nbreak", 'quote"d', "back\\slash", "bidi\u202eevil"]):
        odd.append({**held_pod(f"odd{number}"), "pod": name})
    stand_in = StandIn(odd)
    document, log = run(stand_in)
    assert "optional signal unavailable" not in log
    assert by_name(document)[GOOD]["usage"]["cpu_usage_over_limit"] == 0.375
    cpu = [query for query in stand_in.queries if "container_cpu_usage_seconds_total" in query]
    assert cpu
    assert all(query.isprintable() for query in cpu)
    assert "line\\\\\\nbreak" in cpu[0], "the regex's escaped newline, then PromQL's escape"
    assert 'quote\\"d' in cpu[0]


class Counting(PrometheusClient):
    """The client, counting the samples each signal's queries hand back."""

    def __init__(self, connection: Connection) -> None:
        super().__init__(connection)
        self.kept: dict[str, int] = {}
        self.asked: dict[str, int] = {}

    async def query(self, promql: str, **arguments: Any) -> list[Sample]:
        samples = await super().query(promql, **arguments)
        name = arguments["name"]
        self.kept[name] = self.kept.get(name, 0) + len(samples)
        self.asked[name] = self.asked.get(name, 0) + 1
        return samples


async def test_an_answer_with_every_series_in_every_batch_keeps_only_the_batch() -> None:
    """600 pods with long names are several batches of the per-pod queries, and the server
    answers each with every pod's series. Kept, they were every batch's answer over again
    (1,066 MiB against 409 MiB at 10,000 pods: benchmarks/hostile_prometheus.py); each batch
    keeps its own pods."""
    long_name = "inference-server-for-the-team-" * 2
    pods = [held_pod(f"{long_name}{n:05d}", n, namespace=f"team-{n % 20:02d}") for n in range(600)]
    with serving(StandIn(pods, every_series=True).handle) as url:
        client = Counting(Connection(url=url))
        async with client:
            history = await fetch(
                client,
                selection=Selection(),
                end=END,
                window=WINDOW,
                step=STEP,
                quantile=0.95,
            )
    assert client.asked["cpu_usage_quantile"] > 1, "more than one batch"
    for name in ("cpu_usage_quantile", "cpu_limit", "cpu_limit (short_term)"):
        assert client.kept[name] == len(pods), name
    cpu = {pod.cpu for workload in history.workloads for pod in workload.pods}
    assert cpu == {(ContainerCpu("main", 1.5, 4.0),)}


def test_serve_refreshes_from_a_hostile_server() -> None:
    """Every refresh meets the forged series; each is a report, not a failure."""
    tampered = StandIn(
        PODS,
        tamper={
            "busy_seconds": with_value(HOSTILE, "-5"),
            "memory_peak": with_value(HOSTILE, "1e308"),
            "held": with_nested_element(200_000),
        },
    )
    with (
        serving(tampered.handle) as url,
        serving_report(url, free_port(), "--refresh=1m") as server,
    ):
        assert "report refreshed" in server.text()
        assert "refresh failed" not in server.text()
        document = server.json("/api/v1/report")
        assert isinstance(document["workloads"], list)
        assert {w["workload"] for w in document["workloads"]} == {GOOD, HOSTILE}
    assert len(re.findall(r"prometheus series dropped", server.text())) == 3


@pytest.mark.slow
def test_a_real_prometheus_reads_the_escaped_names_and_matches_them(tmp_path: Path) -> None:
    """The per-pod matchers, with names that need PromQL's escapes, parse in a real Prometheus
    and match exactly the pods asked about."""
    odd = ["line\nbreak", 'quote"d', "back\\slash", "bidi\u202eevil", "dot.star.*", "plain"]
    at = 1_780_000_000
    lines = ["# TYPE kube_pod_container_resource_limits gauge"]
    for pod in [*odd, "dotXstarX", "unasked"]:
        label = pod.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(
            "kube_pod_container_resource_limits"
            f'{{namespace="team",pod="{label}",container="main",resource="cpu"}} 4 {at}'
        )
    openmetrics = tmp_path / "names.om"
    openmetrics.write_text("\n".join([*lines, "# EOF", ""]), encoding="utf-8")
    backfill(require_tool("promtool"), openmetrics, tmp_path / "data")
    (signal,) = [signal for signal in SIGNALS if signal.name == "cpu_limit"]
    promql = render(
        signal,
        selection=Selection(),
        window=3600,
        step=300,
        quantile=0.95,
        pods=[("team", pod) for pod in odd],
    )
    with running_prometheus(tmp_path / "data") as url:
        data = urllib.parse.urlencode({"query": promql, "time": at + 60}).encode()
        with urllib.request.urlopen(f"{url}/api/v1/query", data, timeout=60) as answer:
            document = json.load(answer)
    assert document["status"] == "success", document
    assert sorted(e["metric"]["pod"] for e in document["data"]["result"]) == sorted(odd)


async def test_a_bad_sample_in_a_matrix_costs_only_itself(caplog: pytest.LogCaptureFixture) -> None:
    """The replay's range answers are read with the vector's protections: a NaN, infinite,
    out-of-bounds, malformed or off-shape sample is dropped (one warning naming the first), a
    series whose samples precede its labels or with a label too long is dropped whole, one not
    asked for is dropped unread, and only the labels the query groups by are kept."""
    series = [
        (
            '{"metric":{"pod":"good","extra":"x"},"values":[[10,"0.5"],[20,"NaN"],[30,"+Inf"],'
            '[40,"-1"],[50,"many"],["60","1"],[70],[80,"1",1],{"a":1},[90,"0.25"]]}'
        ),
        '{"values":[[10,"1"]],"metric":{"pod":"late"}}',
        '{"metric":{"pod":"' + "p" * 5000 + '"},"values":[[10,"1"]]}',
        '{"metric":{"pod":"foreign"},"values":[[10,"1"]]}',
        '[{"metric":{"pod":"array"}}]',
    ]
    body = '{"status":"success","data":{"resultType":"matrix","result":['
    body += ",".join(series) + "]}}"

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body.encode(), content_type="application/json")

    with serving(handle) as url, caplog.at_level("DEBUG", "exporter.rightsize.prometheus"):
        async with PrometheusClient(Connection(url=url), backoff=(0.01,)) as client:
            answer = await client.query_matrix(
                "max by (pod) (up)",
                start=10,
                end=90,
                step=10,
                name="replay demand",
                keep=lambda labels: labels.get("pod") != "foreign",
                bounds=Bounds(0.0, 1e6, "busy GPUs"),
            )
    assert matrix_samples(answer) == [
        Sample({"pod": "good"}, 0.5, 10),
        Sample({"pod": "good"}, 0.25, 90),
    ]
    (warning,) = [r for r in caplog.records if r.getMessage() == "prometheus series dropped"]
    assert warning.dropped == 11  # type: ignore[attr-defined]
    assert warning.reason == "value nan is not a finite number"  # type: ignore[attr-defined]
