"""Confidence, terms and trend, replicas and autoscalers, several clusters: known answers on
built histories."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from typing import Any

import pytest

from exporter.rightsize.confidence import (
    FALLING,
    HIGH,
    LOW,
    MEDIUM,
    RISING,
    STEADY,
    TermAnswer,
    assess,
    term_label,
    trend,
)
from exporter.rightsize.formatters import FORMATTERS, Output, report_document
from exporter.rightsize.history import (
    Autoscaler,
    History,
    ResourceUse,
    TermHistory,
    WorkloadHistory,
    assemble,
)
from exporter.rightsize.prometheus import Sample
from exporter.rightsize.report import build_report
from exporter.rightsize.selection import Selection, parse_selector
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.signals import SIGNALS, render
from exporter.rightsize.strategy import STRATEGIES
from tests.rightsize_data import A100_80, DAY, END, H100, WINDOW, device, hardware, workload

pytestmark = pytest.mark.timeout(30)

run = STRATEGIES["simple"].run
SETTINGS = StrategySettings()


def confidence_of(history: WorkloadHistory, terms: tuple[TermAnswer, ...] = ()) -> Any:
    return assess(history, run(history, hardware(), SETTINGS), WINDOW, terms)


def small(**changes: Any) -> WorkloadHistory:
    """An A100 80GB at ~8% with 5 GiB: a 1g.10gb covers it with room to spare."""
    return workload(device(model=A100_80, **({"busy": 0.08, "memory_gib": 5} | changes)))


def test_steady_well_observed_and_clear_is_high() -> None:
    confidence = confidence_of(small())
    assert confidence.level == HIGH
    assert confidence.evidence == 1.0
    assert confidence.reason == (
        "high: 14d of GPU time per replica in the 14d window (high); steady use: p99 1.0x the "
        "mean (high); demand with headroom takes 67% of the A100 80GB SXM MIG 1g.10gb's compute "
        "and 61% of its memory (high)"
    )


@pytest.mark.parametrize(
    ("days", "level"),
    [(14, HIGH), (7, HIGH), (3, MEDIUM), (2.2, MEDIUM), (1, LOW)],
)
def test_evidence_is_gpu_time_per_replica_over_the_window(days: float, level: str) -> None:
    confidence = confidence_of(small(held=days * DAY))
    assert confidence.level == level
    assert confidence.evidence == pytest.approx(days / 14)


def test_replicas_add_evidence() -> None:
    # Three replicas for a day each are three days of evidence: medium, not low.
    replicas = workload(
        *(
            device(uuid=f"GPU-{n}", model=A100_80, busy=0.08, memory_gib=5, held=DAY)
            for n in range(3)
        ),
        pods=3,
    )
    assert confidence_of(replicas).level == MEDIUM


@pytest.mark.parametrize(
    ("mean", "p99", "level", "words"),
    [
        (0.08, 0.12, HIGH, "steady use: p99 1.5x the mean"),
        (0.04, 0.12, MEDIUM, "variable use: p99 3.0x the mean"),
        (0.02, 0.12, LOW, "bursty use: p99 6.0x the mean"),
    ],
)
def test_variability_is_p99_over_the_mean(mean: float, p99: float, level: str, words: str) -> None:
    confidence = confidence_of(small(busy_mean=mean, busy_p99=p99))
    assert confidence.level == level
    assert f"{words} ({level})" in confidence.reason


def test_a_decision_close_to_its_threshold_is_less_trusted() -> None:
    # 8 GiB peak: with 15% headroom, 9.2 of the 1g.10gb's 9.5 GiB usable (3% clear): low.
    close = confidence_of(small(memory_gib=8))
    assert close.level == LOW
    assert "and 97% of its memory (low)" in close.reason
    # 7 GiB: 85% of it, 15% clear: medium.
    assert confidence_of(small(memory_gib=7)).level == MEDIUM


def test_margins_of_each_classification() -> None:
    idle = confidence_of(workload(device(busy=0.0, in_use_ratio=0.0, memory_gib=0)))
    assert idle.level == HIGH
    assert "p99 utilization 0.0% against the 2% idle threshold (high)" in idle.reason
    assert "use under the idle threshold: nothing to vary (high)" in idle.reason
    saturated = confidence_of(workload(device(busy=0.81, memory_gib=40)))
    assert saturated.level == LOW  # 81% against the 80% saturation threshold: 5% of the room
    assert "utilization p95 81% against the 80% saturation threshold (low)" in saturated.reason
    undefined = confidence_of(small(held=3600))
    assert undefined.level == LOW
    assert undefined.reason == "no answer: not enough data: 1h of history, needs 6h"


def _term(name: str, days: float, history: WorkloadHistory) -> TermAnswer:
    answer = run(history, hardware(), SETTINGS)
    return TermAnswer(name, days * DAY, answer, term_label(answer))


def test_terms_that_disagree_cap_confidence_and_rising_demand_shows() -> None:
    # 14 days at ~8% (a 1g.10gb), the last day at 20% (a 2g.20gb).
    history = small()
    week = _term("medium_term", 7, small(busy=0.1))
    day = _term("short_term", 1, small(busy=0.2))
    confidence = confidence_of(history, (day, week))
    assert confidence.level == MEDIUM
    assert confidence.reason.endswith(
        "the last 1d alone would recommend A100 80GB SXM MIG 2g.20gb (at most medium)"
    )
    long_term = _term("long_term", 14, history)
    direction = trend(long_term, [day, week], "p95")
    assert direction.direction == RISING
    assert direction.reason == (
        "utilization p95 20% over the last 1d, 10% over the last 7d, 8% over 14d: rising"
    )
    assert trend(long_term, [_term("short_term", 1, small(busy=0.085))], "p95").direction == STEADY
    falling = trend(_term("long_term", 14, small(busy=0.3)), [day], "p95")
    assert falling.direction == FALLING
    assert trend(long_term, [], "p95").direction == "unknown"


def _history(*workloads: WorkloadHistory, **fields: Any) -> History:
    return History(
        end=END,
        window_seconds=WINDOW,
        step_seconds=300.0,
        quantile=0.95,
        workloads=workloads,
        **fields,
    )


def _report(history: History, **options: Any) -> Any:
    return build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=SETTINGS,
        source="http://prometheus:9090",
        **options,
    )


def test_the_report_runs_each_term_and_min_confidence_filters() -> None:
    rising = replace(small(), name="rising")
    steady = replace(small(uuid="GPU-2"), name="steady")
    short = replace(small(busy=0.2), name="rising")
    bursty = replace(small(uuid="GPU-3", busy_mean=0.01, busy_p99=0.12), name="bursty")
    history = _history(
        rising,
        steady,
        bursty,
        terms=(
            TermHistory("short_term", DAY, {short.configuration: short}),
            TermHistory(
                "medium_term",
                7 * DAY,
                {w.configuration: w for w in (rising, steady)},
            ),
        ),
    )
    report = _report(history)
    rows = {row.history.name: row for row in report.rows}
    assert [term.name for term in rows["rising"].terms] == [
        "short_term",
        "medium_term",
        "long_term",
    ]
    assert [term.label for term in rows["rising"].terms] == [
        "A100 80GB SXM MIG 2g.20gb",
        "A100 80GB SXM MIG 1g.10gb",
        "A100 80GB SXM MIG 1g.10gb",
    ]
    assert rows["rising"].trend.direction == RISING
    assert rows["rising"].confidence_level == MEDIUM
    assert rows["steady"].confidence_level == HIGH
    assert rows["bursty"].confidence_level == LOW
    assert rows["steady"].terms[0].recommendation is None, "no GPU of it in the last day"
    assert report.confidence_counts == {HIGH: 1, MEDIUM: 1, LOW: 1}
    document = report_document(report)
    (rising_document,) = [w for w in document["workloads"] if w["workload"] == "rising"]
    assert rising_document["confidence"] == MEDIUM
    assert rising_document["trend"] == RISING
    assert rising_document["terms"]["short_term"] == {
        "window": "1d",
        "classification": "underused",
        "recommended": "A100 80GB SXM MIG 2g.20gb",
        "compute_fraction": 0.2,
        "memory_peak_bytes": 5 * 1024**3,
    }
    high = _report(history, min_confidence=HIGH)
    assert [row.history.name for row in high.rows] == ["steady"]
    assert high.left_out == 2
    assert "2 recommendations below high confidence are left out." in high.business_case
    assert report_document(high)["summary"]["left_out_below_min_confidence"] == 2
    assert high.total.current == pytest.approx(rows["steady"].cost_current)


def test_replicas_and_an_autoscaler_make_the_recommendation_per_replica() -> None:
    web = workload(
        *(device(uuid=f"GPU-{n}", model=A100_80, busy=0.08, memory_gib=5) for n in range(3)),
        name="web",
        pods=3,
    )
    report = _report(
        _history(
            web,
            autoscalers={("", "team", "Deployment", "web"): Autoscaler("web-hpa", 2, 6, ("cpu",))},
        )
    )
    (row,) = report.rows
    assert row.replicas == 3
    assert row.replicas_mean == pytest.approx(3)
    assert row.gpus_per_replica == 1
    assert row.savings_per_replica == pytest.approx(row.savings / 3)
    assert row.recommendation.reason.endswith(
        "autoscaled by HorizontalPodAutoscaler web-hpa (2-6 replicas on cpu): sized per replica, "
        "the autoscaler sets how many"
    )
    document = report_document(report)["workloads"][0]
    assert document["autoscaler"] == {
        "name": "web-hpa",
        "min_replicas": 2,
        "max_replicas": 6,
        "metrics": ["cpu"],
    }
    assert document["replicas"] == 3
    assert document["savings_usd_per_month_per_replica"] == pytest.approx(
        document["savings_usd_per_month"] / 3, abs=0.01
    )


def test_autoscalers_and_resources_are_read_from_kube_state_metrics_and_allocations() -> None:
    hpa = {"namespace": "team", "horizontalpodautoscaler": "web-hpa"}
    history = assemble(
        {
            "autoscalers": [
                Sample(hpa | {"scaletargetref_kind": "Deployment", "scaletargetref_name": "web"}, 1)
            ],
            "autoscaler_min": [Sample(hpa, 2)],
            "autoscaler_max": [Sample(hpa, 6)],
            "autoscaler_metrics": [
                Sample(hpa | {"metric_name": "cpu"}, 70),
                Sample(hpa | {"metric_name": "gpu_duty"}, 50),
            ],
            "resources": [
                Sample({"resource": "nvidia.com/gpu"}, 10),
                Sample({"resource": "nvidia.com/mig-1g.10gb", "mig_profile": "1g.10gb"}, 3),
            ],
        },
        end=END,
        window=WINDOW,
        step=300,
        quantile=0.95,
    )
    assert history.autoscalers == {
        ("", "team", "Deployment", "web"): Autoscaler("web-hpa", 2, 6, ("cpu", "gpu_duty"))
    }
    assert history.resources == (
        ResourceUse("", "nvidia.com/gpu", None),
        ResourceUse("", "nvidia.com/mig-1g.10gb", "1g.10gb"),
    )


def test_a_cluster_label_groups_and_joins_every_query_per_cluster() -> None:
    selection = Selection(("ml",), parse_selector("team=a"))
    signals = {signal.name: signal for signal in SIGNALS}

    def promql(name: str) -> str:
        return render(
            signals[name],
            selection=selection,
            window=WINDOW,
            step=300,
            quantile=0.95,
            pods=[("ml", "a")],
            cluster_label="cluster",
        )

    assert promql("busy_quantile").startswith(
        "max by (cluster, namespace, workload_kind, workload, pod, uuid) (quantile_over_time("
    )
    assert "and on (cluster, namespace, pod) group by (cluster, namespace, pod)" in promql(
        "busy_quantile"
    )
    assert promql("sm_seconds").startswith("sum by (cluster, uuid) (increase(")
    assert "and on (cluster, uuid) group by (cluster, uuid)" in promql("sm_seconds")
    assert promql("cpu_limit").startswith("max by (cluster, namespace, pod, container) (")
    assert promql("resources").startswith("count by (cluster, resource, mig_profile) (")
    assert promql("autoscaler_min").startswith(
        "max by (cluster, namespace, horizontalpodautoscaler) ("
    )
    assert "avg_over_time((count by (cluster, uuid)" in promql("sharers")


def _clusters() -> History:
    """The same workload names in two clusters, and the same GPU uuid (a copied node image)."""
    labels = {
        "namespace": "ml",
        "workload_kind": "Deployment",
        "workload": "chat",
        "pod": "chat-1",
        "uuid": "GPU-1",
        "container": "main",
        "model": A100_80,
        "resource": "nvidia.com/gpu",
    }
    steps = WINDOW / 300 + 1
    prod, dev = labels | {"cluster": "prod"}, labels | {"cluster": "dev"}
    return assemble(
        {
            "held": [Sample(prod, steps), Sample(dev, steps)],
            "present": [Sample(prod, END), Sample(dev, END)],
            "in_use": [Sample(prod, 1), Sample(dev, 1)],
            "busy_steps": [Sample(prod, steps), Sample(dev, steps)],
            "busy_seconds": [Sample(prod, 0.08 * WINDOW), Sample(dev, 0.9 * WINDOW)],
            "busy_quantile": [Sample(prod, 0.08), Sample(dev, 0.95)],
            "busy_idle_quantile": [Sample(prod, 0.09), Sample(dev, 0.97)],
            "memory_peak": [Sample(prod, 5 * 1024**3), Sample(dev, 60 * 1024**3)],
            "sm_quantile": [
                Sample({"cluster": "prod", "uuid": "GPU-1"}, 0.07),
                Sample({"cluster": "dev", "uuid": "GPU-1"}, 0.9),
            ],
            "resources": [Sample({"cluster": "prod", "resource": "nvidia.com/gpu"}, 1)],
        },
        end=END,
        window=WINDOW,
        step=300,
        quantile=0.95,
        cluster_label="cluster",
    )


def test_two_clusters_are_apart_in_history_report_and_every_format() -> None:
    history = _clusters()
    by_cluster = {w.cluster: w for w in history.workloads}
    assert set(by_cluster) == {"prod", "dev"}
    assert by_cluster["prod"].devices[0].sm_quantile == 0.07, "joined on (cluster, uuid)"
    assert by_cluster["dev"].devices[0].sm_quantile == 0.9
    assert by_cluster["prod"].key == "prod/ml/Deployment/chat"
    report = _report(history)
    rows = {row.cluster: row for row in report.rows}
    assert rows["prod"].recommendation.classification == "underused"
    assert rows["dev"].recommendation.classification == "compute-bound"
    assert rows["prod"].patch is not None
    assert rows["prod"].patch.file == "prod.ml.deployment.chat.yaml"
    assert rows["prod"].patch.command()[:2] == ["kubectl", "--context=prod"]
    assert [cluster for cluster, _ in report.clusters] == ["dev", "prod"]
    assert {(n.cluster, n.namespace) for n in report.namespaces} == {("prod", "ml"), ("dev", "ml")}
    # Each cluster's GPUs are packed apart: the dev GPU is not shared with prod's slice.
    assert report.consolidation.gpus_after == 2
    assert "of 2 clusters" in report.business_case
    document = json.loads(FORMATTERS["json"](report, Output()))
    assert {w["cluster"] for w in document["workloads"]} == {"prod", "dev"}
    assert document["cluster_label"] == "cluster"
    assert {c["cluster"] for c in document["clusters"]} == {"prod", "dev"}
    rows_csv = list(csv.DictReader(io.StringIO(FORMATTERS["csv"](report, Output()))))
    assert {row["cluster"] for row in rows_csv} == {"prod", "dev"}
    markdown = FORMATTERS["markdown"](report, Output())
    assert "| prod: ml/chat |" in markdown
    assert "## Clusters" in markdown
    assert "prod: ml/chat" in FORMATTERS["table"](report, Output(width=250))
    page = FORMATTERS["html"](report, Output())
    assert "<option value='prod'>prod</option>" in page
    assert "data-cluster='prod'" in page
    assert FORMATTERS["yaml"](report, Output()).count("cluster: prod") >= 2


def test_without_a_cluster_label_nothing_says_cluster() -> None:
    report = _report(_history(small(), workload(device(uuid="GPU-2", model=H100, busy=0.9))))
    document = report_document(report)
    assert "cluster" not in document["workloads"][0]
    assert document["clusters"] == []
    assert "f-cluster" not in FORMATTERS["html"](report, Output())
