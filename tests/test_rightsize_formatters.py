"""Every formatter on one report built from plain data."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest
import yaml

from exporter.rightsize.formatters import (
    CSV_COLUMNS,
    EXTENSIONS,
    FORMATTERS,
    Output,
    report_document,
)
from tests.rightsize_data import sample_report, sample_simulation

pytestmark = pytest.mark.timeout(30)

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def report():  # type: ignore[no-untyped-def]
    return sample_report()


def test_every_format_is_registered_with_an_extension() -> None:
    assert list(FORMATTERS) == ["json", "yaml", "csv", "markdown", "table", "html"]
    assert EXTENSIONS == {
        "json": "json",
        "yaml": "yaml",
        "csv": "csv",
        "markdown": "md",
        "table": "txt",
        "html": "html",
    }


def test_json_carries_everything_and_adds_up(report) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(FORMATTERS["json"](report, Output()))
    assert document["window"] == "14d"
    assert document["step"] == "5m"
    assert document["strategy"] == "simple"
    assert document["settings"]["percentile"] == "95%"
    assert document["generated_at"] == "2026-09-21T14:13:20Z"
    summary = document["summary"]
    assert summary["workloads"] == 7
    assert summary["classifications"] == {
        "idle": 1,
        "input-bound": 1,
        "underused": 1,
        "memory-bound": 1,
        "compute-bound": 1,
        "right-sized": 1,
        "undefined": 1,
    }
    workloads = {w["workload"]: w for w in document["workloads"]}
    assert summary["savings_usd_per_month"] == pytest.approx(
        sum(w["savings_usd_per_month"] for w in workloads.values()), abs=0.05
    )
    small = workloads["chat|small"]
    assert small["target"]["label"] == "A100 80GB SXM MIG 1g.10gb"
    assert small["target"]["mig_profile"] == "1g.10gb"
    assert small["usage"]["sm_active_quantile"] == 0.07
    assert small["demand"]["roofline_side"] == "memory"
    assert workloads["notebook"]["recommended"] == "release"
    assert workloads["notebook"]["target"] is None
    assert workloads["resnet"]["cpu_changes"] == [
        {
            "pod": "resnet-0",
            "container": "main",
            "usage_cores": 3.95,
            "limit_cores": 4.0,
            "recommended_limit_cores": 9.5,
        }
    ]
    assert workloads["<new>"]["recommended"] == "-"
    consolidation = document["consolidation"]
    assert consolidation["gpus_before"] == sum(m["gpus_before"] for m in consolidation["models"])
    (h100,) = [r for r in document["rooflines"] if r["model"] == "H100 SXM"]
    assert h100["peak_flops_source"] == "calibrated"
    assert [p["workload"] for p in h100["points"]] == ["training/Job/llm"]


def test_yaml_is_the_same_document(report) -> None:  # type: ignore[no-untyped-def]
    assert yaml.safe_load(FORMATTERS["yaml"](report, Output())) == json.loads(
        json.dumps(report_document(report))
    )


def test_csv_has_one_row_per_workload(report) -> None:  # type: ignore[no-untyped-def]
    rows = list(csv.DictReader(io.StringIO(FORMATTERS["csv"](report, Output()))))
    assert len(rows) == 7
    assert tuple(rows[0]) == CSV_COLUMNS
    by_name = {row["workload"]: row for row in rows}
    assert by_name["chat|small"]["recommended"] == "A100 80GB SXM MIG 1g.10gb"
    assert by_name["notebook"]["classification"] == "idle"
    assert float(by_name["notebook"]["savings_usd_per_month"]) == pytest.approx(
        6.88 * 730, abs=0.01
    )
    assert by_name["embed"]["memory_peak_gib"] == "72"
    assert by_name["<new>"]["savings_usd_per_month"] == "0"


def test_markdown_escapes_cells_and_has_every_section(report) -> None:  # type: ignore[no-untyped-def]
    text = FORMATTERS["markdown"](report, Output())
    assert text.startswith("# GPU rightsizing: 14d to 2026-09-21T14:13:20Z (simple strategy)\n")
    for heading in ("## Workloads", "## Namespaces", "## Consolidation"):
        assert heading in text
    assert "serving/chat\\|small" in text
    table = [
        line for line in text.splitlines() if line.startswith("| ") and "/" in line.split("|")[1]
    ]
    assert len(table) == 7
    assert all(line.count(" | ") == 13 for line in table)  # escaped pipes do not split cells


class _Checker(HTMLParser):
    """Balanced tags, no external resources."""

    VOID = frozenset(
        {"meta", "br", "img", "link", "input", "hr", "circle", "line", "rect", "polyline"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in {"src", "href"} and value and not value.startswith("#"):
                self.external.append(value)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.stack, f"</{tag}> closes nothing"
        opened = self.stack.pop()
        assert opened == tag, f"<{opened}> closed by </{tag}>"

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_self_contained_balanced_and_escaped(report) -> None:  # type: ignore[no-untyped-def]
    page = FORMATTERS["html"](report, Output())
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == ["html"] or checker.stack == []
    assert checker.external == []
    assert page.count("<script") == 1  # the sorting and filtering, inline
    assert "fetch(" not in page
    assert "XMLHttpRequest" not in page
    assert page.count("<svg xmlns") == 3  # two rooflines (A100 80GB, H100), the consolidation
    assert "&lt;new&gt;" in page
    assert "<new>" not in page
    text = " ".join(checker.text)
    assert report.business_case.split(":")[0] in text
    assert "Roofline of H100 SXM" in page
    assert "GPUs and utilization before and after consolidation" in page


def test_html_with_a_policy_replay_stays_self_contained_balanced_and_escaped(report) -> None:  # type: ignore[no-untyped-def]
    page = FORMATTERS["html"](replace(report, simulation=sample_simulation()), Output())
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert checker.stack == ["html"] or checker.stack == []
    assert checker.external == []
    assert page.count("<script") == 1
    assert page.count("<svg xmlns") == 4  # the rooflines, the consolidation, the replay
    assert "&lt;new&gt;" in page
    assert "<new>" not in page
    assert "GPUs needed at each step under each policy replayed" in page


def test_table_is_plain_off_a_terminal_and_coloured_on_one(report) -> None:  # type: ignore[no-untyped-def]
    plain = FORMATTERS["table"](report, Output(terminal=False, width=200))
    assert not ANSI.search(plain)
    for name in ("research/notebook", "serving/chat|small", "training/resnet", "serving/<new>"):
        assert name in plain
    assert "CPU 4 -> 9.5 cores, keep GPU" in plain
    assert f"${report.total.savings:,.0f} saved per month" in plain
    coloured = FORMATTERS["table"](report, Output(terminal=True, width=200))
    assert ANSI.search(coloured)
    assert ANSI.sub("", coloured).replace(" ", "") == plain.replace(" ", "")


def test_every_format_says_which_rows_opencost_priced(report) -> None:  # type: ignore[no-untyped-def]
    first, *others = report.rows
    priced = replace(
        report,
        rows=(replace(first, price_source="opencost", option_price_scale=0.5), *others),
    )
    document = json.loads(FORMATTERS["json"](priced, Output()))
    sources = [row["price_source"] for row in document["workloads"]]
    assert sources[0] == "opencost"
    assert document["workloads"][0]["option_price_scale"] == 0.5
    assert "opencost" not in sources[1:]
    name = first.history.name
    for form in ("markdown", "table"):
        lines = FORMATTERS[form](priced, Output(width=250)).splitlines()
        noted = [line for line in lines if "(OpenCost)" in line]
        assert len(noted) == 1, form
        assert name in noted[0], form
    assert FORMATTERS["html"](priced, Output()).count("priced by OpenCost") == 1
    assert "priced by OpenCost" not in FORMATTERS["html"](report, Output())
