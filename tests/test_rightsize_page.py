"""The HTML report in headless Chromium: opened with a link whose fragment is malformed or
hostile, its script opens the default view (every workload, sorted by savings) instead of
throwing; and its table fits a 1,400 px window whatever names it holds."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from exporter.rightsize.formatters import FORMATTERS, Output
from exporter.rightsize.report import build_report
from exporter.rightsize.settings import StrategySettings
from exporter.rightsize.strategy import STRATEGIES
from tests.helpers import eventually
from tests.rightsize_browser import browser
from tests.rightsize_data import hardware, sample_history, sample_report

if TYPE_CHECKING:
    from pathlib import Path

    from tests.rightsize_browser import Page

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FRAGMENTS = (
    "sort=x']",  # a selector's quote: querySelector threw a SyntaxError
    "sort=nothing",  # no such column: sorting read an undefined value
    "sort=__proto__&order=sideways",
    "%E0%A4%A",  # a percent sign not followed by UTF-8: decodeURIComponent threw
    "namespace=%ZZ&q=%",
    "confidence=toString&order=sideways",  # hid every row
    "=&&=x&sort",
)
SHOWN = "document.getElementById('shown').textContent"
SAVINGS = (
    "Array.from(document.querySelectorAll('#workloads tbody tr'))"
    ".filter(r => !r.hidden).map(r => Number(r.dataset.savings))"
)
ERRORS = "window.__errors = []; window.addEventListener('error', e => __errors.push(e.message));"


def opened(page: Page, url: str) -> None:
    page.call("Page.navigate", url=url)
    eventually(
        lambda: page.evaluate("document.readyState") == "complete",
        30,
        f"{url} to load",
    )


def default_view(page: Page, rows: int) -> None:
    assert page.evaluate(SHOWN).startswith(f"{rows} of {rows} workloads, $")
    savings = page.evaluate(SAVINGS)
    assert len(savings) == rows
    assert savings == sorted(savings, reverse=True)


def test_a_malformed_fragment_opens_the_default_view(tmp_path: Path) -> None:
    report = sample_report()
    page_file = tmp_path / "report.html"
    page_file.write_text(FORMATTERS["html"](report, Output()), encoding="utf-8")
    base = page_file.as_uri()
    rows = len(report.rows)
    with browser(tmp_path) as page:
        for fragment in FRAGMENTS:
            opened(page, "about:blank")
            opened(page, f"{base}#{fragment}")
            default_view(page, rows)
        opened(page, base)
        page.evaluate(ERRORS)
        for fragment in FRAGMENTS:
            page.evaluate(f"location.hash = {json.dumps(fragment)}")
            eventually(lambda: page.evaluate(SHOWN).startswith(f"{rows} of {rows}"), 10, "the view")
            default_view(page, rows)
        assert page.evaluate("window.__errors") == []
        # A good fragment still works after the bad ones.
        page.evaluate("location.hash = 'sort=savings&order=asc'")
        eventually(
            lambda: page.evaluate(SAVINGS) == sorted(page.evaluate(SAVINGS)), 10, "ascending"
        )


def test_long_names_keep_the_table_within_a_1400_px_window(tmp_path: Path) -> None:
    """Names as long as Kubernetes allows (63 characters, no space to break at) in every
    cell that shows one, every patch and reason opened: the page is no wider than the window."""
    history = sample_history()
    long_named = tuple(
        replace(
            workload,
            name=f"{workload.name}-{'w' * 63}"[:63],
            namespace=f"{workload.namespace}-{'n' * 63}"[:63],
            cluster="cluster-" + "c" * 55,
        )
        for workload in history.workloads
    )
    report = build_report(
        replace(history, workloads=long_named, cluster_label="cluster"),
        strategy=STRATEGIES["simple"],
        hardware=hardware(),
        settings=StrategySettings(),
        source="http://prometheus.example:9090",
    )
    page_file = tmp_path / "report.html"
    page_file.write_text(FORMATTERS["html"](report, Output()), encoding="utf-8")
    with browser(tmp_path, width=1400) as page:
        opened(page, page_file.as_uri())
        page.evaluate(
            "document.querySelectorAll('#workloads details').forEach(d => { d.open = true; })"
        )
        window, document, table = page.evaluate(
            "[window.innerWidth, document.documentElement.scrollWidth,"
            " document.getElementById('workloads').scrollWidth]"
        )
        width, _ = page.whole_page_screenshot(tmp_path / "whole-page.png")
    assert window == 1400
    assert max(document, table, width) <= window, (document, table, width)
