"""gpuscope's Prometheus rules: promtool's checks and unit tests, and the conventions every
alert follows (severity, annotations, a runbook section that exists)."""

from __future__ import annotations

import re
import subprocess
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.helpers import ROOT, require_tool

if TYPE_CHECKING:
    from pathlib import Path

RULES = ROOT / "deploy" / "prometheus" / "gpuscope.rules.yaml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "gpuscope.rules.test.yaml"
SERVING_RULE_TESTS = ROOT / "tests" / "prometheus" / "serving.rules.test.yaml"
FIXED_NAMES = re.compile(r"workload:[a-z0-9_]+")
"""Two-part names issue 17 fixes for the serving figures (users' alerts and the rightsizing
report read them): a workload's ratio of two recorded rates, which no operation names."""
ROLLUP_TESTS = ROOT / "tests" / "prometheus" / "rollups.rules.test.yaml"
"""The fleet rollups' tests: a file of their own, beside the alerts' and the other recordings'."""
PRICE_TESTS = ROOT / "tests" / "prometheus" / "prices.rules.test.yaml"
"""The price rules' tests: OpenCost's node prices, the catalog's, and the rules that read them."""
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/gpuscope/gpuscope/blob/main/docs/runbook.md#"
SEVERITIES = {"critical", "warning", "info"}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def unit_tests() -> list[dict[str, Any]]:
    return [
        test
        for path in (RULE_TESTS, ROLLUP_TESTS, SERVING_RULE_TESTS, PRICE_TESTS)
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]
    ]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        # Evaluating a file's tests is CPU-bound: give a loaded machine room.
        timeout=240,
        cwd=ROOT,
        check=False,
    )


def test_promtool_check_rules_with_every_lint() -> None:
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    "tests", [RULE_TESTS, ROLLUP_TESTS, SERVING_RULE_TESTS, PRICE_TESTS], ids=lambda p: p.name
)
def test_promtool_unit_tests_pass(tests: Path) -> None:
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1


def test_rule_file_is_a_plain_prometheus_rule_file() -> None:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    assert set(document) == {"groups"}, "the Helm chart embeds this file as a PrometheusRule spec"
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names))
    records = [rule["record"] for rule in rules() if "record" in rule]
    assert len(records) == len(set(records))
    for record in records:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", record) or FIXED_NAMES.fullmatch(
            record
        ), f"{record}: recording rules are named level:metric:operations"


@pytest.mark.parametrize("alert", alerts(), ids=lambda alert: alert["alert"])
def test_every_alert_has_a_severity_annotations_and_a_runbook(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"] == RUNBOOK_URL + name.lower()
    headings = re.findall(r"^## (\w+)$", RUNBOOK.read_text(encoding="utf-8"), re.MULTILINE)
    assert name in headings, f"docs/runbook.md has no section '## {name}'"


def test_runbook_has_a_section_for_each_alert_and_no_other() -> None:
    headings = re.findall(r"^## (\w+)$", RUNBOOK.read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(headings) == sorted(alert["alert"] for alert in alerts())


@pytest.mark.parametrize("alert", alerts(), ids=lambda alert: alert["alert"])
def test_every_alert_is_unit_tested_firing_and_silent(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    cases = [
        case
        for test in unit_tests()
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == name
    ]
    firing = [case for case in cases if case.get("exp_alerts")]
    silent = [case for case in cases if not case.get("exp_alerts")]
    assert firing, f"{name}: no unit test where it fires"
    assert silent, f"{name}: no unit test where it stays silent"
    for case in firing:
        for expected in case["exp_alerts"]:
            assert expected["exp_labels"]["severity"] == alert["labels"]["severity"]
            assert set(expected["exp_annotations"]) == set(alert["annotations"]), (
                f"{name}: a firing case must check every annotation"
            )


def test_every_recording_rule_is_unit_tested() -> None:
    tested = " ".join(
        case["expr"] for test in unit_tests() for case in test.get("promql_expr_test", [])
    )
    untested = [
        rule["record"]
        for rule in rules()
        if "record" in rule
        and not re.search(rf"(?<![\w:]){re.escape(rule['record'])}(?![\w:])", tested)
    ]
    assert not untested, f"recording rules without a promql_expr_test: {untested}"


def test_costly_groups_evaluate_less_often_but_never_go_stale() -> None:
    """A day's window costs a day of samples per evaluation (64,000 allocations' at 1,000 nodes,
    benchmarks/daily_rules.py): every recording rule with one is in gpuscope-daily.rules. That
    group and gpuscope-tables.rules (a join over every allocation for tables read now, never
    over a range) evaluate every few minutes, under the 5-minute lookback of the queries that
    read them; no other group sets an interval (the dashboards' hours over a range count on
    that: tests/test_dashboards.py)."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    daily = {
        rule["record"]
        for group in groups
        for rule in group["rules"]
        if "record" in rule and "[1d" in rule["expr"]
    }
    (group,) = [group for group in groups if group["name"] == "gpuscope-daily.rules"]
    assert {rule["record"] for rule in group["rules"]} == daily
    spaced = {g["name"]: int(g["interval"].removesuffix("m")) for g in groups if "interval" in g}
    assert set(spaced) == {"gpuscope-daily.rules", "gpuscope-tables.rules"}
    for name, minutes in spaced.items():
        assert 1 < minutes < 5, f"{name} evaluates every {minutes} minutes"
