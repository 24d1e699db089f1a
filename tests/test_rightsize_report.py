"""Money, consolidation and the business case, on plain data."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.catalog import builtin_catalog
from exporter.rightsize.consolidation import Slot, consolidate, gpus_needed, pack_mig
from exporter.rightsize.exposition import recommendation_metrics
from exporter.rightsize.history import History
from exporter.rightsize.report import build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from tests.rightsize_data import (
    A100_80,
    END,
    WINDOW,
    device,
    hardware,
    sample_report,
    sample_workloads,
    workload,
)

pytestmark = pytest.mark.timeout(30)

HOURS = 730.0


def report_of(*workloads, prices=None):  # type: ignore[no-untyped-def]
    history = History(END, WINDOW, 300.0, 0.95, tuple(workloads))
    return build_report(
        history,
        strategy=STRATEGIES["simple"],
        hardware=hardware(prices=prices),
        settings=StrategySettings(),
        source="test",
    )


def test_money_per_workload_is_the_window_spend_scaled_to_a_month() -> None:
    report = sample_report()
    rows = {row.history.name: row for row in report.rows}
    assert rows["notebook"].cost_current == pytest.approx(6.88 * HOURS)
    assert rows["notebook"].cost_recommended == 0.0
    assert rows["chat|small"].cost_current == pytest.approx(3.43 * HOURS)
    # A 1g.10gb slice blocks 1/7 of the compute and 1/8 of the memory: it costs 1/7.
    assert rows["chat|small"].cost_recommended == pytest.approx(3.43 / 7 * HOURS)
    assert rows["chat|small"].savings == pytest.approx(3.43 * 6 / 7 * HOURS)
    assert rows["llm"].cost_current == pytest.approx(4 * 6.88 * HOURS)
    assert rows["llm"].savings == 0.0
    assert rows["<new>"].cost_current == pytest.approx(6.88 * HOURS * 2 / (14 * 24))
    for row in report.rows:
        assert row.savings == pytest.approx((row.cost_current or 0) - (row.cost_recommended or 0))
    assert report.total.current == pytest.approx(sum(r.cost_current or 0 for r in report.rows))
    assert report.total.savings == pytest.approx(sum(r.savings or 0 for r in report.rows))
    by_namespace = {entry.namespace: entry.money for entry in report.namespaces}
    assert set(by_namespace) == {"research", "serving", "training"}
    assert sum(m.savings for m in by_namespace.values()) == pytest.approx(report.total.savings)
    assert by_namespace["research"].savings == pytest.approx(6.88 * HOURS)
    # Rows come by savings, largest first.
    assert [row.history.name for row in report.rows][:2] == ["notebook", "chat|small"]


def test_shared_gpu_cost_is_split_between_holders() -> None:
    shared = device(uuid="GPU-s", model=A100_80, busy=0.2, memory_gib=10, shared=True, holders=2)
    report = report_of(workload(shared, name="tts"), workload(replace(shared), name="asr"))
    for row in report.rows:
        assert row.cost_current == pytest.approx(3.43 / 2 * HOURS)
        assert row.cost_recommended == pytest.approx(3.43 * 2 / 7 * HOURS)  # 2g.20gb each
    assert report.consolidation.gpus_before == 1
    assert report.consolidation.gpus_after == 1  # two 2g.20gb fit one A100


def test_half_the_window_costs_half_a_month() -> None:
    report = report_of(workload(device(held=WINDOW / 2, busy=0.9, sm_quantile=0.9)))
    (row,) = report.rows
    assert row.gpus_held == pytest.approx(0.5)
    assert row.cost_current == pytest.approx(6.88 * HOURS / 2)


def test_unpriced_models_are_left_out_of_the_sums_and_said_so() -> None:
    report = report_of(
        workload(device(model="NVIDIA H100 PCIe", busy=0.05, memory_gib=5), name="pcie"),
        workload(device(busy=0.0), name="idle"),
    )
    rows = {row.history.name: row for row in report.rows}
    assert rows["pcie"].cost_current is None
    assert rows["pcie"].savings is None
    assert report.total.unpriced == 1
    assert report.total.current == pytest.approx(6.88 * HOURS)
    assert "1 on GPU models without a price are left out of the sums" in report.business_case


def test_a_strategy_that_breaks_on_one_workload_costs_only_that_row() -> None:
    def broken(history, hardware, settings):  # type: ignore[no-untyped-def]
        if history.name == "bad":
            raise ValueError("boom")
        return STRATEGIES["simple"].run(history, hardware, settings)

    history = History(
        END, WINDOW, 300.0, 0.95, (workload(device(), name="bad"), workload(device(), name="good"))
    )
    strategy = replace(STRATEGIES["simple"], run=broken)
    report = build_report(
        history, strategy=strategy, hardware=hardware(), settings=StrategySettings(), source="t"
    )
    rows = {row.history.name: row.recommendation for row in report.rows}
    assert rows["bad"].classification == "undefined"
    assert rows["bad"].reason == "strategy failed: boom"
    assert rows["good"].classification != "undefined"


def _profiles(model_key: str, *names: str):  # type: ignore[no-untyped-def]
    model = builtin_catalog().by_key(model_key)
    assert model is not None
    return [model.mig_profile(name) for name in names]


@pytest.mark.parametrize(
    ("profiles", "gpus"),
    [
        (("3g.40gb", "3g.40gb"), 1),  # 6/7 compute, 8/8 memory
        (("4g.40gb", "4g.40gb"), 2),  # at most one 4g per GPU
        (("1g.10gb",) * 8, 2),  # at most seven 1g.10gb
        (("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"), 1),  # 7/7 compute, 7/8 memory
        (("1g.20gb",) * 5, 2),  # four per GPU (memory slices 2 each, max 4)
        (("7g.80gb", "1g.10gb"), 2),
        ((), 0),
    ],
)
def test_mig_packing_respects_slices_and_instance_limits(
    profiles: tuple[str, ...], gpus: int
) -> None:
    assert pack_mig(_profiles("a100-sxm4-80gb", *profiles)) == gpus


def test_gpus_needed_counts_whole_gpus_shared_gpus_once_and_packs_mig() -> None:
    catalog = builtin_catalog()
    h100 = catalog.by_key("h100-sxm")
    a100 = catalog.by_key("a100-sxm4-80gb")
    assert h100 is not None
    assert a100 is not None
    slots = [
        Slot(h100, None, 0.9),
        Slot(h100, None, 0.8),
        Slot(a100, None, 0.1, shared_uuid="GPU-x"),
        Slot(a100, None, 0.2, shared_uuid="GPU-x"),
        Slot(a100, a100.mig_profile("3g.40gb"), 0.2),
        Slot(a100, a100.mig_profile("3g.40gb"), 0.1),
    ]
    usage = {u.model: (u.gpus, round(u.work, 3)) for u in gpus_needed(slots)}
    assert usage == {"H100 SXM": (2, 1.7), "A100 80GB SXM": (2, 0.6)}


def test_consolidation_reports_before_after_and_utilization() -> None:
    catalog = builtin_catalog()
    h100 = catalog.by_key("h100-sxm")
    assert h100 is not None
    one_g = h100.mig_profile("1g.10gb")
    before = [
        Slot(h100, None, 0.05),
        Slot(h100, None, 0.05),
        Slot(h100, None, 0.0),
        Slot(h100, None, 0.9),
    ]
    after = [Slot(h100, one_g, 0.05), Slot(h100, one_g, 0.05), Slot(h100, None, 0.9)]
    result = consolidate(before, after)
    assert (result.gpus_before, result.gpus_after) == (4, 2)
    assert result.utilization_before == pytest.approx(1.0 / 4)
    assert result.utilization_after == pytest.approx(1.0 / 2)
    (change,) = result.models
    assert change.model == "H100 SXM"


def test_business_case_is_one_paragraph_with_the_numbers() -> None:
    report = sample_report()
    text = report.business_case
    assert "\n" not in text
    assert text.startswith("Over the last 14d, 7 workloads in 3 namespaces held ")
    assert "release 1 idle GPU holder" in text
    assert "give 1 starved input pipeline more CPU" in text
    assert f"${report.total.savings:,.0f} saved per month" in text
    assert f"${report.total.savings * 12:,.0f} a year" in text
    assert "1 workload has too little history to judge." in text


def test_an_empty_history_says_there_is_nothing_to_rightsize() -> None:
    report = report_of()
    assert report.rows == ()
    assert "nothing to rightsize" in report.business_case


def test_each_clusters_gpus_add_up_to_the_reports() -> None:
    """GPUs are packed within a cluster, never across two; each cluster's count (what the
    Rightsizing dashboard sums, from the server's series) adds up to the report's."""
    report = report_of(
        *(
            replace(w, cluster=cluster)
            for cluster in ("prod", "staging")
            for w in sample_workloads()
        )
    )
    per_cluster = dict(report.cluster_consolidations)
    assert sorted(per_cluster) == ["prod", "staging"]
    series = {
        (sample.name, sample.labels["cluster"], sample.labels["gpu"]): sample.value
        for family in recommendation_metrics(report)
        for sample in family.samples
        if sample.name.startswith("gpuscope_rightsize_report_") and "gpu" in sample.labels
    }
    for name, attribute in (
        ("gpuscope_rightsize_report_gpus", "gpus_before"),
        ("gpuscope_rightsize_report_recommended_gpus", "gpus_after"),
    ):
        one = getattr(per_cluster["prod"], attribute)
        assert one > 0
        assert getattr(per_cluster["staging"], attribute) == one
        assert getattr(report.consolidation, attribute) == 2 * one
        assert sum(v for (n, _, _), v in series.items() if n == name) == 2 * one
        assert sum(v for (n, c, _), v in series.items() if n == name and c == "staging") == one
