"""The serving rules and the Serving efficiency dashboard against a real Prometheus.

A simulated node (tests/fixtures/fleets/serving.yaml: an H100 one vLLM service holds alone, an
L4 time-sliced between a vLLM and a Triton service, a StatefulSet's two pods on two revisions,
a grid carbon intensity configured) is scraped beside stand-in inference servers
(tests/serving_server.py) in vLLM's, Triton's, SGLang's and TGI's formats, each scraped as a
PodMonitor would, with its pod's `namespace` and `pod`; one of them serves on a pod gpuscope
attributes no GPU to. The servers' counters have 5.5 minutes of history backfilled, so the
rules' 5-minute rates are the servers' true rates from the first scrape on.

Every panel, annotation and variable query of the dashboard must return data, and
`workload:gpu_cost_usd_per_million_output_tokens` must be the GPU's price (its share of it on
the shared GPU) over the tokens generated in an hour, times a million.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final

import pytest

from dashboards import promql
from dashboards.draw import Source, Window
from dashboards.fit import overlaps
from dashboards.live import Node, Prometheus, wait_until
from dashboards.render import draw_dashboard
from tests.dashboard_queries import RANGE_SECONDS, SCRAPE_SECONDS, grafana_values
from tests.helpers import ROOT, require_tool
from tests.serving_server import SERVED, SERVING_FLEET, ServingStack

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DASHBOARD: Final = json.loads((ROOT / "dashboards" / "serving.json").read_text(encoding="utf-8"))
QUERIES: Final = promql.queries(DASHBOARD)
VARIABLES: Final = [v for v in promql.variables(DASHBOARD) if v["type"] == "query"]
NODE: Final = Node("sim-serving", SERVING_FLEET, ("--carbon.intensity=400",))
SERVED_BY: Final = {served.pod: served for served in SERVED}
READY: Final = " and ".join(
    f"count(count_over_time({name}[1m]) >= 3) >= {count}"
    for name, count in (
        ("workload:gpu_cost_usd_per_million_output_tokens", 3),
        ("workload:requests_per_kwh", 4),
        ("workload_revision:gpu_busy_seconds_per_request:median1h", 3),
        ("workload:gpu_co2e_grams:rate5m", 4),
    )
)
"""Every figure recorded three times for every serving workload: the rules have run on scraped
data for a few evaluations, so queries over the time since the start find them."""
RATE_TOLERANCE: Final = 5e-3
"""How far a figure built on the stand-in servers' 5-minute rates may sit from the true rate. A
server computes its counters when it answers, Prometheus stamps the sample when the scrape
starts: on a loaded machine the two drift apart by a few hundred milliseconds between the ends
of a window (0.14% seen in CI). A wrong split is off by far more (by requests instead of
inferences, the Triton models' shares move by 10%)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, float]]:
    require_tool("prometheus")
    with ServingStack(
        [NODE],
        tmp_path_factory.mktemp("serving"),
        served=SERVED,
        promtool_binary=require_tool("promtool"),
    ) as serving:
        started = time.time()
        prometheus = serving.prometheus
        wait_until("the serving rules", lambda: prometheus.value(READY) is not None, 60)
        yield prometheus, started


@pytest.mark.parametrize("query", QUERIES, ids=[query.name for query in QUERIES])
def test_panel_query_returns_data(
    stack: tuple[Prometheus, float], query: promql.PanelQuery
) -> None:
    prometheus, started = stack
    expr = promql.substitute(query.expr, grafana_values(DASHBOARD))
    now = time.time()
    if query.instant:
        answer = prometheus.query(expr, at=now)
    else:
        answer = prometheus.query_range(expr, start=started, end=now, step=SCRAPE_SECONDS)
    assert answer["status"] == "success", f"{expr}\n{answer.get('error')}"
    assert answer["data"]["result"], f"no data for {expr}"


@pytest.mark.parametrize("variable", VARIABLES, ids=[v["name"] for v in VARIABLES])
def test_variable_query_finds_values(
    stack: tuple[Prometheus, float], variable: dict[str, Any]
) -> None:
    prometheus, _ = stack
    selector, label = promql.label_values(variable["query"])
    selector = promql.substitute(selector, grafana_values(DASHBOARD))
    now = time.time()
    answer = prometheus.series(selector, start=now - RANGE_SECONDS, end=now)
    assert answer["status"] == "success", answer.get("error")
    assert {series.get(label) for series in answer["data"]} - {None}


def test_the_dashboards_picture_has_no_text_out_of_place(stack: tuple[Prometheus, float]) -> None:
    prometheus, started = stack
    end = time.time()
    window = Window(start=started, end=end, step=SCRAPE_SECONDS)
    figure = draw_dashboard(DASHBOARD, Source(prometheus, window, SCRAPE_SECONDS))
    assert overlaps(figure, DASHBOARD) == []


def _one(prometheus: Prometheus, expr: str, at: float) -> float:
    answer = prometheus.query(expr, at=at)
    assert answer["status"] == "success", answer.get("error")
    (row,) = answer["data"]["result"]
    return float(row["value"][1])


@pytest.mark.parametrize(
    ("workload", "pod", "gpu", "share"),
    [("chat", "chat-7c8d9f6b5-p9m2n", "0", 1.0), ("assist", "assist-5c8d9f7b6-k4t8p", "1", 0.5)],
    ids=["exclusive GPU", "time-sliced GPU"],
)
def test_cost_per_million_output_tokens_is_price_over_tokens_an_hour(
    stack: tuple[Prometheus, float], workload: str, pod: str, gpu: str, share: float
) -> None:
    prometheus, _ = stack
    at = time.time()
    price = _one(prometheus, f'gpu_price_usd_per_hour{{gpu="{gpu}"}}', at)
    (model,) = SERVED_BY[pod].models
    tokens_an_hour = model.output_tokens * 3600
    recorded = _one(
        prometheus,
        f'workload:gpu_cost_usd_per_million_output_tokens{{workload="{workload}"}}',
        at,
    )
    assert recorded == pytest.approx(share * price / tokens_an_hour * 1e6, rel=RATE_TOLERANCE)
    requests = _one(
        prometheus,
        f'workload:gpu_cost_usd_per_thousand_requests{{workload="{workload}"}}',
        at,
    )
    assert requests == pytest.approx(
        share * price / (model.requests * 3600) * 1e3, rel=RATE_TOLERANCE
    )


def test_triton_models_split_their_pods_cost_by_inferences(
    stack: tuple[Prometheus, float],
) -> None:
    prometheus, _ = stack
    at = time.time()
    price = _one(prometheus, 'gpu_price_usd_per_hour{gpu="1"}', at)
    models = SERVED_BY["vision-0"].models
    inferences = sum(model.output_tokens for model in models)
    for model in models:
        cost = _one(
            prometheus,
            f'workload:gpu_cost_usd_per_thousand_requests{{workload="vision", model="{model.name}"}}',
            at,
        )
        expected = 0.5 * price * model.output_tokens / inferences / (model.requests * 3600) * 1e3
        assert cost == pytest.approx(expected, rel=RATE_TOLERANCE)


def test_a_server_without_a_gpu_has_no_cost(stack: tuple[Prometheus, float]) -> None:
    prometheus, _ = stack
    at = time.time()
    assert _one(
        prometheus, 'pod_model:serving_output_tokens:rate5m{pod="summarize-cpu-0"}', at
    ) == (pytest.approx(50, rel=RATE_TOLERANCE))
    answer = prometheus.query('{__name__=~"workload.*:.*", workload=~"summarize.*"}', at=at)
    assert answer["data"]["result"] == []


def test_the_rollout_shows_both_revisions(stack: tuple[Prometheus, float]) -> None:
    prometheus, _ = stack
    answer = prometheus.query(
        'workload_revision:gpu_cost_usd_per_million_tokens:rate5m{workload="rerank"}',
        at=time.time(),
    )
    assert sorted(row["metric"]["revision"] for row in answer["data"]["result"]) == [
        "rerank-5d4c8b7f6",
        "rerank-7b9f6c8d5",
    ]


def test_pods_energies_add_up_to_each_gpus(stack: tuple[Prometheus, float]) -> None:
    """Between two scrapes, the pods' energy counters and the unattributed one of a GPU grow by
    what its own energy counter grows (the same scrape's samples, so no extrapolation)."""
    prometheus, _ = stack

    def by_gpu(expr: str, at: float) -> dict[str, float]:
        answer = prometheus.query(f"sum by (uuid) ({expr})", at=at)
        return {row["metric"]["uuid"]: float(row["value"][1]) for row in answer["data"]["result"]}

    def parts(at: float) -> dict[str, float]:
        pods = by_gpu("gpu_pod_energy_joules_total", at)
        rest = by_gpu("gpu_unattributed_energy_joules_total", at)
        return {uuid: pods.get(uuid, 0.0) + rest.get(uuid, 0.0) for uuid in pods | rest}

    gpus = set(by_gpu("gpu_energy_joules_total", time.time()))
    wait_until(
        "ten scrapes of every GPU's energy",
        lambda: set(by_gpu("gpu_energy_joules_total", time.time() - 10 * SCRAPE_SECONDS)) == gpus,
        60,
    )
    now = time.time()
    before, after = now - 10 * SCRAPE_SECONDS, now
    grown = {
        uuid: used - by_gpu("gpu_energy_joules_total", before)[uuid]
        for uuid, used in by_gpu("gpu_energy_joules_total", after).items()
    }
    shared = {uuid: used - parts(before).get(uuid, 0.0) for uuid, used in parts(after).items()}
    assert set(shared) == set(grown)
    assert any(number > 0 for number in grown.values())
    for uuid, number in grown.items():
        assert shared[uuid] == pytest.approx(number, rel=1e-6, abs=1e-6), uuid
    pods = by_gpu("gpu_pod_energy_joules_total", after)
    assert len(pods) >= 3, "the exclusive and the time-sliced GPUs' pods have energy"
