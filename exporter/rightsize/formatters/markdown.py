"""The `markdown` format: the report for people, in a ConfigMap, a merge request or a wiki."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters import common
from exporter.rightsize.formatters.common import Format, Output
from exporter.rightsize.report import money_text

if TYPE_CHECKING:
    from exporter.rightsize.report import Report


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(report: Report, _output: Output) -> str:
    p = common.percentile(report)
    total = report.total
    consolidation = report.consolidation
    lines = [
        f"# {common.title(report)}",
        "",
        report.business_case,
        "",
        "| | now | recommended | savings |",
        "|---|---|---|---|",
        (
            f"| cost per month | {money_text(total.current)} | {money_text(total.recommended)} | "
            f"{money_text(total.savings)} |"
        ),
        (
            f"| GPUs | {consolidation.gpus_before} | {consolidation.gpus_after} | "
            f"{consolidation.gpus_before - consolidation.gpus_after} |"
        ),
        (
            f"| utilization | {consolidation.utilization_before:.0%} | "
            f"{consolidation.utilization_after:.0%} | |"
        ),
        "",
        "## Workloads",
        "",
        (
            f"| workload | GPU now | util mean | util {p} | memory peak | idle | class | recommendation "
            "| $/month now | savings/month | why |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        cells = (
            f"{row.history.namespace}/{row.history.name}",
            f"{row.gpus_held:.2g} x {common.current_label(row)}",
            common.percent(row.utilization_mean),
            common.percent(row.utilization_quantile),
            common.gib(row.memory_peak_bytes),
            common.percent(row.idle_ratio),
            row.recommendation.classification,
            common.recommendation_label(row),
            common.usd(row.cost_current),
            common.usd(row.savings),
            row.recommendation.reason,
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    lines += [
        "",
        "## Namespaces",
        "",
        "| namespace | $/month now | recommended | savings |",
        "|---|---|---|---|",
    ]
    lines.extend(
        f"| {namespace} | {money_text(money.current)} | {money_text(money.recommended)} | "
        f"{money_text(money.savings)} |"
        for namespace, money in report.namespaces
    )
    lines += [
        "",
        "## Consolidation",
        "",
        "| GPU model | GPUs now | GPUs after | utilization now | utilization after |",
        "|---|---|---|---|---|",
    ]
    lines.extend(
        f"| {change.model} | {change.gpus_before} | {change.gpus_after} | "
        f"{common.percent(change.utilization_before)} | {common.percent(change.utilization_after)} |"
        for change in consolidation.models
    )
    lines += ["", common.footer(report), ""]
    return "\n".join(lines)


MARKDOWN: Final = Format("markdown", "md", format_markdown)
