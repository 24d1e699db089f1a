"""The rightsizing report's cost per million tokens for workloads that serve: from the serving
rules' tokens over the window, now and after each recommendation (assuming unchanged
throughput), in every format; on plain data."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest

from exporter.rightsize.formatters import FORMATTERS
from exporter.rightsize.formatters.common import TOKENS_NOTE, Output
from exporter.rightsize.history import History, assemble
from exporter.rightsize.prometheus import Sample
from exporter.rightsize.report import build_report
from exporter.rightsize.selection import Selection
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.signals import SIGNALS, render
from exporter.rightsize.strategy import STRATEGIES
from tests.rightsize_data import END, WINDOW, hardware, sample_history

pytestmark = pytest.mark.timeout(30)

HOURS = 730.0
TOKENS_PER_SECOND = 1000.0


def serving_report():  # type: ignore[no-untyped-def]
    """The sample history, its small chat service (an A100 it underuses: a 1g.10gb slice is
    recommended) serving 1,000 tokens a second over the whole window."""
    history = sample_history()
    workloads = tuple(
        replace(w, served_tokens=TOKENS_PER_SECOND * WINDOW) if w.name == "chat|small" else w
        for w in history.workloads
    )
    return build_report(
        replace(history, workloads=workloads),
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )


def test_cost_per_million_tokens_now_and_after_the_recommendation() -> None:
    rows = {row.history.name: row for row in serving_report().rows}
    chat = rows["chat|small"]
    assert chat.tokens_per_month == pytest.approx(TOKENS_PER_SECOND * HOURS * 3600)
    # 3.43 $/h for 3.6 M tokens an hour; a 1g.10gb slice costs a seventh of the A100.
    assert chat.cost_per_million_tokens_current == pytest.approx(3.43 / 3.6)
    assert chat.cost_per_million_tokens_recommended == pytest.approx(3.43 / 7 / 3.6)
    for name, row in rows.items():
        if name != "chat|small":
            assert row.tokens_per_month is None
            assert row.cost_per_million_tokens_current is None
            assert row.cost_per_million_tokens_recommended is None


def test_a_released_gpu_has_no_cost_per_token_after() -> None:
    history = sample_history()
    workloads = tuple(
        replace(w, served_tokens=5.0 * WINDOW) if w.name == "notebook" else w
        for w in history.workloads
    )
    report = build_report(
        History(END, WINDOW, 300.0, 0.95, workloads),
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )
    (notebook,) = [row for row in report.rows if row.history.name == "notebook"]
    assert notebook.cost_recommended == 0.0
    assert notebook.cost_per_million_tokens_current == pytest.approx(6.88 / (5 * 3600) * 1e6)
    assert notebook.cost_per_million_tokens_recommended is None


def test_every_format_shows_it_and_says_throughput_is_assumed_unchanged() -> None:
    report = serving_report()
    document = json.loads(FORMATTERS["json"](report, Output()))
    assert document["cost_per_million_tokens"] == TOKENS_NOTE
    assert "unchanged throughput" in TOKENS_NOTE
    by_name = {w["workload"]: w for w in document["workloads"]}
    assert by_name["chat|small"]["cost_current_usd_per_million_tokens"] == pytest.approx(
        3.43 / 3.6, abs=1e-4
    )
    assert by_name["chat|small"]["cost_recommended_usd_per_million_tokens"] == pytest.approx(
        3.43 / 7 / 3.6, abs=1e-4
    )
    assert by_name["chat|small"]["tokens_per_month"] == round(TOKENS_PER_SECOND * HOURS * 3600)
    assert by_name["notebook"]["cost_current_usd_per_million_tokens"] is None

    page = FORMATTERS["html"](report, Output())
    assert "$0.953 → $0.136 per million tokens" in page
    assert TOKENS_NOTE in page
    markdown = FORMATTERS["markdown"](report, Output())
    assert "| $0.953 → $0.136 |" in markdown
    assert TOKENS_NOTE in markdown
    rows = {
        row["workload"]: row
        for row in csv.DictReader(io.StringIO(FORMATTERS["csv"](report, Output())))
    }
    assert float(rows["chat|small"]["cost_current_usd_per_million_tokens"]) == pytest.approx(
        3.43 / 3.6, abs=1e-4
    )
    assert rows["notebook"]["cost_recommended_usd_per_million_tokens"] == ""


def test_without_serving_workloads_the_page_says_nothing_of_tokens() -> None:
    history = sample_history()
    report = build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )
    assert TOKENS_NOTE not in FORMATTERS["html"](report, Output())
    assert TOKENS_NOTE not in FORMATTERS["markdown"](report, Output())


def test_served_tokens_come_from_the_serving_rules_per_workload() -> None:
    (served,) = [s for s in SIGNALS if s.name == "served_tokens"]
    assert render(
        served, selection=Selection(("ml",)), window=14 * 86400.0, step=300.0, quantile=0.95
    ) == (
        "sum by (namespace, workload_kind, workload) "
        '(sum_over_time(workload_model:serving_tokens:rate5m{namespace=~"ml"}[14d:5m]))'
    )


def test_assembled_tokens_are_the_rate_summed_over_the_steps_for_one_configuration() -> None:
    window, step = 86400.0, 300.0
    steps = window / step + 1
    chat = {"namespace": "ml", "workload_kind": "Deployment", "workload": "chat"}
    moved = {"namespace": "ml", "workload_kind": "Deployment", "workload": "moved"}
    h100 = {"model": "NVIDIA H100 80GB HBM3", "resource": "nvidia.com/gpu"}
    held = [
        Sample({**chat, "pod": "chat-1", "uuid": "GPU-1", **h100}, steps),
        # `moved` changed GPU model within the window: two rows, its tokens not split between them
        Sample({**moved, "pod": "moved-1", "uuid": "GPU-2", **h100}, steps / 2),
        Sample({**moved, "pod": "moved-2", "uuid": "GPU-3", **h100, "model": "NVIDIA L4"}, 10),
    ]
    history = assemble(
        {
            "held": held,
            "served_tokens": [Sample(chat, 200.0 * steps), Sample(moved, 50.0 * steps)],
        },
        end=1e9,
        window=window,
        step=step,
        quantile=0.95,
    )
    tokens = {(w.name, w.model): w.served_tokens for w in history.workloads}
    assert tokens == {
        ("chat", "NVIDIA H100 80GB HBM3"): pytest.approx(200.0 * steps * step),
        ("moved", "NVIDIA H100 80GB HBM3"): None,
        ("moved", "NVIDIA L4"): None,
    }
