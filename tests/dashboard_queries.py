"""What the dashboard tests share (tests/test_dashboards.py checks the queries offline,
tests/test_dashboards_live.py runs them against a live Prometheus): the Prometheus rules and the
names they record, and Grafana's variable substitutions for the live stack's scrape interval."""

from __future__ import annotations

from functools import cache
from typing import Any, Final

import yaml

from dashboards import promql
from dashboards.live import RULE_FILES

SCRAPE_SECONDS: Final = 1.0
RANGE_SECONDS: Final = 60.0
"""The dashboard time range the queries are run for ($__range); longer than the data there is."""


@cache
def rule_documents() -> tuple[dict[str, Any], ...]:
    return tuple(yaml.safe_load(path.read_text(encoding="utf-8")) for path in RULE_FILES)


def rules() -> list[dict[str, Any]]:
    """Every alerting and recording rule of the rule files."""
    return [
        rule
        for document in rule_documents()
        for group in document["groups"]
        for rule in group["rules"]
    ]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def grafana_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """Grafana's substitutions for a 1 s scrape interval and the test's time range."""
    return promql.grafana_values(
        dashboard,
        interval=SCRAPE_SECONDS,
        scrape_seconds=SCRAPE_SECONDS,
        range_seconds=RANGE_SECONDS,
    )
