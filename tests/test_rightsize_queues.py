"""Showback per queue in `gpuscope rightsize`: each workload's queue from the daemon's
`gpu_pod_queue_info` (joined to its pods' workloads), and the report's per-queue totals in JSON,
Markdown and HTML, adding up with the workloads in no queue to the report's total."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from exporter.rightsize.formatters import FORMATTERS
from exporter.rightsize.formatters.common import Output
from exporter.rightsize.history import assemble
from exporter.rightsize.prometheus import Sample
from exporter.rightsize.report import Report, build_report
from exporter.rightsize.selection import Selection
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.signals import SIGNALS, render
from exporter.rightsize.strategy import STRATEGIES
from tests.rightsize_data import hardware, sample_history

pytestmark = pytest.mark.timeout(60)
QUEUES = {"llm": ("research", "kueue"), "embed": ("research", "kueue"), "ocr": ("serving", "kai")}


def queued_report(queues: dict[str, tuple[str, str]]) -> Report:
    history = sample_history()
    workloads = tuple(
        replace(w, queue=queues[w.name][0], queue_kind=queues[w.name][1]) if w.name in queues else w
        for w in history.workloads
    )
    return build_report(
        replace(history, workloads=workloads),
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="test",
    )


def test_the_queue_signal_joins_queue_info_to_the_pods_workloads() -> None:
    (signal,) = [s for s in SIGNALS if s.name == "queue"]
    assert render(
        signal, selection=Selection(("ml",)), window=86400.0, step=300.0, quantile=0.95
    ) == (
        "max by (namespace, workload_kind, workload, queue, queue_kind) "
        '(last_over_time(gpu_pod_queue_info{namespace=~"ml"}[1d]) '
        "* on (namespace, pod) group_left (workload_kind, workload) "
        "max by (namespace, pod, workload_kind, workload) "
        '(last_over_time(gpu_pod_info{namespace=~"ml"}[1d])))'
    )


def test_each_workload_takes_its_pods_queue_the_first_by_name_of_several() -> None:
    steps = 86400.0 / 300.0 + 1
    h100 = {"model": "NVIDIA H100 80GB HBM3", "resource": "nvidia.com/gpu"}
    train = {"namespace": "ml", "workload_kind": "Job", "workload": "train"}
    chat = {"namespace": "ml", "workload_kind": "Deployment", "workload": "chat"}
    bare = {"namespace": "lab", "workload_kind": "Pod", "workload": "notebook"}
    history = assemble(
        {
            "held": [
                Sample({**train, "pod": "train-0", "uuid": "GPU-1", **h100}, steps),
                Sample({**chat, "pod": "chat-0", "uuid": "GPU-2", **h100}, steps),
                Sample({**bare, "pod": "notebook", "uuid": "GPU-3", **h100}, steps),
            ],
            "queue": [
                Sample({**train, "queue": "research", "queue_kind": "kueue"}, 1.0),
                # moved from one queue to another within the window: one of them, always the same
                Sample({**chat, "queue": "serving", "queue_kind": "kai"}, 1.0),
                Sample({**chat, "queue": "batch", "queue_kind": "kueue"}, 1.0),
            ],
        },
        end=1e9,
        window=86400.0,
        step=300.0,
        quantile=0.95,
    )
    assert {w.name: (w.queue, w.queue_kind) for w in history.workloads} == {
        "train": ("research", "kueue"),
        "chat": ("batch", "kueue"),
        "notebook": ("", ""),
    }


def test_per_queue_totals_add_up_with_the_unqueued_to_the_reports_total() -> None:
    report = queued_report(QUEUES)
    by_queue = {(q.queue, q.queue_kind): q.money for q in report.queues}
    assert set(by_queue) == {("research", "kueue"), ("serving", "kai"), ("", "")}
    rows = {row.history.name: row for row in report.rows}
    research = [rows[name] for name in ("llm", "embed") if name in rows]
    assert by_queue[("research", "kueue")].current == pytest.approx(
        sum(row.cost_current or 0.0 for row in research)
    )
    assert sum(m.current for m in by_queue.values()) == pytest.approx(report.total.current)
    assert sum(m.recommended for m in by_queue.values()) == pytest.approx(report.total.recommended)

    document = json.loads(FORMATTERS["json"](report, Output()))
    workloads = {w["workload"]: w for w in document["workloads"]}
    assert workloads["ocr"]["queue"] == {"name": "serving", "kind": "kai"}
    assert workloads["notebook"]["queue"] is None
    queues = {(q["queue"], q["queue_kind"]) for q in document["queues"]}
    assert queues == {("research", "kueue"), ("serving", "kai"), ("", "none")}
    markdown = FORMATTERS["markdown"](report, Output())
    assert "## Queues" in markdown
    assert "| research | kueue |" in markdown
    assert "| (no queue) | none |" in markdown
    html = FORMATTERS["html"](report, Output())
    assert "<h2>Queues</h2>" in html
    assert "<td>serving</td><td>kai</td>" in html


def test_a_report_without_queues_shows_no_queue_section() -> None:
    report = queued_report({})
    assert report.queues == ()
    assert json.loads(FORMATTERS["json"](report, Output()))["queues"] == []
    assert "## Queues" not in FORMATTERS["markdown"](report, Output())
    assert "<h2>Queues</h2>" not in FORMATTERS["html"](report, Output())
