"""The `markdown` format: the report for people, in a ConfigMap, a merge request or a wiki."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters import common
from exporter.rightsize.formatters.common import Format, Output
from exporter.rightsize.replay.summary import COLUMNS, policy_rows, sentence
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
            "| confidence | trend | $/month now | savings/month | $/M tokens now → after | why |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        cells = (
            common.workload_label(row),
            f"{row.gpus_held:.2g} x {common.current_label(row)}",
            common.percent(row.utilization_mean),
            common.percent(row.utilization_quantile),
            common.gib(row.memory_peak_bytes),
            common.percent(row.idle_ratio),
            row.recommendation.classification,
            common.recommendation_label(row),
            row.confidence_level,
            row.trend.direction if row.trend else "-",
            common.usd(row.cost_current) + common.price_note(row),
            common.usd(row.savings),
            common.per_million_tokens(row),
            row.recommendation.reason,
        )
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    if any(row.tokens_per_month for row in report.rows):
        lines += ["", common.TOKENS_NOTE]
    if report.clusters:
        lines += [
            "",
            "## Clusters",
            "",
            "| cluster | $/month now | recommended | savings |",
            "|---|---|---|---|",
        ]
        lines.extend(
            f"| {_cell(cluster)} | {money_text(money.current)} | "
            f"{money_text(money.recommended)} | {money_text(money.savings)} |"
            for cluster, money in report.clusters
        )
    lines += [
        "",
        "## Namespaces",
        "",
        "| namespace | $/month now | recommended | savings |",
        "|---|---|---|---|",
    ]
    lines.extend(
        f"| {_cell(f'{entry.cluster}: ' if entry.cluster else '')}{_cell(entry.namespace)} | "
        f"{money_text(entry.money.current)} | {money_text(entry.money.recommended)} | "
        f"{money_text(entry.money.savings)} |"
        for entry in report.namespaces
    )
    if report.queues:
        lines += [
            "",
            "## Queues",
            "",
            "| queue | scheduler | $/month now | recommended | savings |",
            "|---|---|---|---|---|",
        ]
        lines.extend(
            f"| {_cell(f'{entry.cluster}: ' if entry.cluster else '')}"
            f"{_cell(entry.queue or '(no queue)')} | {entry.queue_kind or 'none'} | "
            f"{money_text(entry.money.current)} | {money_text(entry.money.recommended)} | "
            f"{money_text(entry.money.savings)} |"
            for entry in report.queues
        )
    changes = [(row, patch) for row in report.rows if (patch := row.patch) is not None]
    if changes:
        lines += ["", "## Changes to apply", ""]
        for row, patch in changes:
            lines.append(
                f"- **{_cell(common.workload_label(row))}** ({patch.kind}, container "
                f"{_cell(patch.container or '?')}): {_cell('; '.join(patch.changes))}"
                + (f". {_cell(patch.note)}" if patch.note else "")
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
    if report.simulation:
        lines += [
            "",
            "## Policy replay",
            "",
            sentence(report.simulation, saturation=report.settings.saturation),
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|---" * len(COLUMNS) + "|",
        ]
        lines.extend(
            "| " + " | ".join(_cell(cell) for cell in cells) + " |"
            for cells in policy_rows(report.simulation)
        )
    lines += ["", common.footer(report), ""]
    return "\n".join(lines)


MARKDOWN: Final = Format("markdown", "md", format_markdown)
