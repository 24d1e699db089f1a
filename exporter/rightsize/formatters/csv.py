"""The `csv` format: one row per workload, for a spreadsheet."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Final

from exporter.rightsize.formatters.common import GIB, Format, Output, current_label

if TYPE_CHECKING:
    from exporter.rightsize.report import Report

CSV_COLUMNS: Final = (
    "cluster",
    "namespace",
    "kind",
    "workload",
    "pods",
    "replicas",
    "gpus_held",
    "current",
    "shared",
    "utilization_mean",
    "utilization_quantile",
    "sm_active_quantile",
    "memory_peak_gib",
    "idle_ratio",
    "cpu_usage_over_limit",
    "classification",
    "action",
    "recommended",
    "confidence",
    "trend",
    "cost_current_usd_per_month",
    "cost_recommended_usd_per_month",
    "savings_usd_per_month",
    "cost_current_usd_per_million_tokens",
    "cost_recommended_usd_per_million_tokens",
    "reason",
)


def _cell(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{round(value, digits):g}"


def format_csv(report: Report, _output: Output) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        history, recommendation = row.history, row.recommendation
        peak = row.memory_peak_bytes
        writer.writerow(
            (
                history.cluster,
                history.namespace,
                history.kind,
                history.name,
                len(history.pods),
                row.replicas,
                _cell(row.gpus_held, 3),
                current_label(row),
                str(row.shared).lower(),
                _cell(row.utilization_mean),
                _cell(row.utilization_quantile),
                _cell(row.sm_quantile),
                _cell(None if peak is None else peak / GIB, 2),
                _cell(row.idle_ratio),
                _cell(row.cpu_ratio),
                recommendation.classification,
                recommendation.action,
                row.target_label,
                row.confidence_level,
                row.trend.direction if row.trend else "",
                _cell(row.cost_current, 2),
                _cell(row.cost_recommended, 2),
                _cell(row.savings, 2),
                _cell(row.cost_per_million_tokens_current),
                _cell(row.cost_per_million_tokens_recommended),
                recommendation.reason,
            )
        )
    return buffer.getvalue()


CSV: Final = Format("csv", "csv", format_csv)
