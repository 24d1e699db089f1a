"""`gpuscope rightsize` gives the same report against VictoriaMetrics as against Prometheus.

The end-to-end fixture's history (tests/rightsize_stack.py: the rightsizing scenario, 14 days
scraped every 2 minutes, backfilled with promtool) is served by a real Prometheus, and the same
samples are copied into a real VictoriaMetrics (Debian's packages). The job runs against each as
a user would (`--format json`, the scenario's end). Every decision — classification, action,
recommended GPU or profile, confidence, CPU changes, patches, the money and the consolidation —
must be the same. Measured figures may differ by well under 1%: a rate over a 5-minute step is
PromQL's extrapolation to the step's edges in Prometheus and the increase since the sample
before the step in MetricsQL, and a range in Prometheus 2 includes a sample exactly at its start
(the fixture's 2-minute grid puts one there) where MetricsQL's does not.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any, Final

import pytest

from dashboards.live import Prometheus
from dashboards.victoria import VictoriaMetrics
from tests import dcgm_history_data as dcgm_history
from tests.helpers import require_tool
from tests.prometheus_server import running_prometheus
from tests.rightsize_run import rightsize
from tests.rightsize_scenario import END
from tests.rightsize_stack import DAY, history

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MEASURED_TOLERANCE: Final = 0.01
"""Relative difference allowed between the stores' measured figures (see the module's doc)."""
NUMBER: Final = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    require_tool("victoria-metrics")
    root = tmp_path_factory.mktemp("victoria-rightsize")
    data = history(root)
    with (
        running_prometheus(data) as prometheus,
        VictoriaMetrics(root / "victoria") as victoria,
    ):
        victoria.copy_from(Prometheus(prometheus), start=END - 15 * DAY, end=END)
        yield tuple(report(url) for url in (prometheus, victoria.url))


def report(url: str) -> Any:
    # The policy replay asks range queries (`replay/steps.py`): compared too.
    result = rightsize(
        f"--prometheus={url}", f"--end={END}", "--format=json", "--simulate=current,timeslice"
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def differences(prometheus: Any, victoria: Any, where: str = "") -> list[str]:
    """Where the two reports disagree beyond what the two query languages explain: numbers
    further apart than MEASURED_TOLERANCE, text other than in its numbers, anything else."""
    if isinstance(prometheus, dict) and isinstance(victoria, dict):
        if prometheus.keys() != victoria.keys():
            return [f"{where}: keys {sorted(prometheus.keys() ^ victoria.keys())}"]
        return [
            found
            for key in prometheus
            if key != "source"  # the store's URL
            for found in differences(prometheus[key], victoria[key], f"{where}.{key}")
        ]
    if isinstance(prometheus, list) and isinstance(victoria, list):
        if len(prometheus) != len(victoria):
            return [f"{where}: {len(prometheus)} items against {len(victoria)}"]
        return [
            found
            for index, (a, b) in enumerate(zip(prometheus, victoria, strict=True))
            for found in differences(a, b, f"{where}[{index}]")
        ]
    if prometheus == victoria:
        return []
    numbers = (int, float)
    close = (
        isinstance(prometheus, numbers)
        and isinstance(victoria, numbers)
        and not isinstance(prometheus, bool)
        and math.isclose(prometheus, victoria, rel_tol=MEASURED_TOLERANCE, abs_tol=1e-9)
    )
    same_text = (
        isinstance(prometheus, str)
        and isinstance(victoria, str)
        and NUMBER.sub("#", prometheus) == NUMBER.sub("#", victoria)
    )
    if close or same_text:
        return []
    return [f"{where}: Prometheus {prometheus!r}, VictoriaMetrics {victoria!r}"]


def test_the_report_is_the_same_on_both_stores(reports: tuple[Any, Any]) -> None:
    prometheus, victoria = reports
    assert [document["missing_signals"] for document in reports] == [[], []]
    assert [len(document["simulation"]) for document in reports] == [2, 2]
    assert differences(prometheus, victoria) == []


def test_every_decision_and_sum_of_money_is_identical(reports: tuple[Any, Any]) -> None:
    prometheus, victoria = reports

    def decisions(document: Any) -> list[tuple[Any, ...]]:
        return [
            (
                w["namespace"],
                w["workload"],
                w["classification"],
                w["action"],
                w["recommended"],
                w["confidence"],
                w["cost_current_usd_per_month"],
                w["cost_recommended_usd_per_month"],
                w["savings_usd_per_month"],
                json.dumps(w["cpu_changes"], sort_keys=True),
            )
            for w in document["workloads"]
        ]

    assert decisions(victoria) == decisions(prometheus)
    assert victoria["summary"] == prometheus["summary"]
    assert len(prometheus["workloads"]) == 9


def test_dcgm_exporter_history_gives_the_same_report_on_both_stores(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The dcgm-exporter source's queries (`or on (...)` inside subqueries, both versions' names)
    # mean the same in MetricsQL.
    require_tool("victoria-metrics")
    root = tmp_path_factory.mktemp("victoria-dcgm")
    with (
        running_prometheus(dcgm_history.backfilled(root)) as prometheus,
        VictoriaMetrics(root / "victoria") as victoria,
    ):
        victoria.copy_from(
            Prometheus(prometheus), start=dcgm_history.END - 8 * DAY, end=dcgm_history.END
        )
        documents = []
        for url in (prometheus, victoria.url):
            result = rightsize(
                f"--prometheus={url}",
                f"--end={dcgm_history.END}",
                "--window=7d",
                "--source=dcgm-exporter",
                "--format=json",
            )
            assert result.returncode == 0, result.stderr
            documents.append(json.loads(result.stdout))
    assert len(documents[0]["workloads"]) == 18
    assert differences(*documents) == []
