"""The `table` format: rich's table, in colour on a terminal (rich is imported only here, and
only when the format is used)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters import common
from exporter.rightsize.formatters.common import Format, Output
from exporter.rightsize.replay.summary import COLUMNS, policy_rows, sentence
from exporter.rightsize.report import money_text

if TYPE_CHECKING:
    from exporter.rightsize.report import Report


def format_table(report: Report, output: Output) -> str:
    from rich.console import Console  # noqa: PLC0415 - rich is only needed for this format
    from rich.table import Table  # noqa: PLC0415 - as above

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=output.width,
        force_terminal=output.terminal,
        no_color=not output.terminal,
        highlight=False,
        emoji=False,
    )
    p = common.percentile(report)
    table = Table(title=common.title(report), show_lines=False, header_style="bold")
    for column, justify in (
        ("Workload", "left"),
        ("GPU now", "left"),
        (f"Util mean/{p}", "right"),
        ("Mem peak", "right"),
        ("Idle", "right"),
        ("Class", "left"),
        ("Recommendation", "left"),
        ("Confidence", "left"),
        ("$/mo now", "right"),
        ("Savings/mo", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in report.rows:
        recommendation = row.recommendation
        target = common.recommendation_label(row)
        if recommendation.cpu_changes:
            change = recommendation.cpu_changes[0]
            target = f"CPU {change.limit_cores:g} -> {change.recommended_cores:g} cores, keep GPU"
        table.add_row(
            common.workload_label(row),
            f"{row.gpus_held:.2g} x {common.current_label(row)}",
            f"{common.percent(row.utilization_mean)}/{common.percent(row.utilization_quantile)}",
            common.gib(row.memory_peak_bytes),
            common.percent(row.idle_ratio),
            f"[{common.LOOKS[recommendation.classification].style}]{recommendation.classification}[/]",
            target,
            row.confidence_level
            + (f", {row.trend.direction}" if row.trend and row.trend.direction != "steady" else ""),
            common.usd(row.cost_current) + common.price_note(row),
            common.usd(row.savings),
        )
    console.print(table)
    total, consolidation = report.total, report.consolidation
    console.print(
        f"Total: {money_text(total.current)}/month now, {money_text(total.recommended)} recommended, "
        f"[bold]{money_text(total.savings)}[/] saved per month. GPUs {consolidation.gpus_before} -> "
        f"{consolidation.gpus_after}, utilization {consolidation.utilization_before:.0%} -> "
        f"{consolidation.utilization_after:.0%}."
    )
    console.print(report.business_case)
    if report.missing_signals:
        # Words from the history, not markup: a bracket in them is text.
        console.print(f"Missing signals: {'; '.join(report.missing_signals)}.", markup=False)
    if report.simulation:
        replayed = Table(title="Policy replay", header_style="bold")
        for number, column in enumerate(COLUMNS):
            replayed.add_column(column, justify="left" if number == 0 else "right")
        for cells in policy_rows(report.simulation):
            replayed.add_row(*cells)
        console.print(replayed)
        console.print(sentence(report.simulation, saturation=report.settings.saturation))
    return buffer.getvalue()


TABLE: Final = Format("table", "txt", format_table)
