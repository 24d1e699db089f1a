"""Formatters, registered by name: Report -> text (table, json, yaml, csv, markdown, html).

`json` and `yaml` carry everything (`report_document`); `csv` is one row per workload;
`markdown` and `html` are for people, `html` being self-contained with two inline SVG plots.
`table` is rich's table, in colour on a terminal.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Final

import yaml

from exporter.durations import format_duration
from exporter.rightsize import svg
from exporter.rightsize.report import money_text
from exporter.rightsize.settings import STRATEGY_SETTINGS

if TYPE_CHECKING:
    from exporter.rightsize.hardware import Option
    from exporter.rightsize.report import Money, Report, WorkloadRow

GIB: Final = 1024**3


@dataclass(frozen=True, slots=True)
class Output:
    """Where the text goes: a terminal gets colour and its width."""

    terminal: bool = False
    width: int = 180


Formatter = Callable[["Report", Output], str]
FORMATTERS: dict[str, Formatter] = {}
EXTENSIONS: dict[str, str] = {}


def register(name: str, extension: str) -> Callable[[Formatter], Formatter]:
    def add(function: Formatter) -> Formatter:
        FORMATTERS[name] = function
        EXTENSIONS[name] = extension
        return function

    return add


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _option(option: Option | None) -> dict[str, Any] | None:
    if option is None:
        return None
    return {
        "label": option.label,
        "model": option.model.name,
        "model_key": option.model.key,
        "mig_profile": option.mig_profile.profile if option.mig_profile else None,
        "shared_by": option.shared_by,
        "compute_fraction": round(option.compute, 4),
        "memory_bytes": option.memory_bytes,
    }


def _settings(report: Report) -> dict[str, str]:
    return {
        setting.name: _setting_value(getattr(report.settings, setting.attribute), setting.metavar)
        for setting in STRATEGY_SETTINGS
    }


def _setting_value(value: Any, metavar: str) -> str:
    if metavar == "PERCENT":
        return f"{value * 100:g}%"
    if metavar == "DURATION":
        return format_duration(value)
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _money_document(money: Money) -> dict[str, Any]:
    return {
        "cost_current_usd_per_month": _money(money.current),
        "cost_recommended_usd_per_month": _money(money.recommended),
        "savings_usd_per_month": _money(money.savings),
        "unpriced_workloads": money.unpriced,
    }


def workload_document(row: WorkloadRow) -> dict[str, Any]:
    recommendation = row.recommendation
    demand = recommendation.demand
    history = row.history
    return {
        "namespace": history.namespace,
        "kind": history.kind,
        "workload": history.name,
        "pods": [pod.name for pod in history.pods],
        "gpus_held": round(row.gpus_held, 3),
        "current": _option(recommendation.current),
        "usage": {
            "utilization_mean": _ratio(row.utilization_mean),
            "utilization_quantile": _ratio(row.utilization_quantile),
            "sm_active_quantile": _ratio(row.sm_quantile),
            "memory_peak_bytes": row.memory_peak_bytes,
            "memory_p99_bytes": row.memory_quantile_bytes,
            "idle_ratio": _ratio(row.idle_ratio),
            "cpu_usage_over_limit": _ratio(row.cpu_ratio),
            "shared": row.shared,
        },
        "classification": recommendation.classification,
        "action": recommendation.action,
        "reason": recommendation.reason,
        "target": _option(recommendation.target) if recommendation.action == "move" else None,
        "recommended": row.target_label,
        "demand": None
        if demand is None
        else {
            "compute_fraction": round(demand.compute, 4),
            "compute_signal": demand.compute_signal,
            "memory_bytes": demand.memory_bytes,
            "roofline_side": demand.roofline_side,
        },
        "cpu_changes": [
            {
                "pod": change.pod,
                "container": change.container,
                "usage_cores": round(change.usage_cores, 3),
                "limit_cores": change.limit_cores,
                "recommended_limit_cores": change.recommended_cores,
            }
            for change in recommendation.cpu_changes
        ],
        "cost_current_usd_per_month": _money(row.cost_current),
        "cost_recommended_usd_per_month": _money(row.cost_recommended),
        "savings_usd_per_month": _money(row.savings),
    }


def report_document(report: Report) -> dict[str, Any]:
    """Everything in the report as plain data (the json and yaml formats)."""
    consolidation = report.consolidation
    return {
        "generated_at": _timestamp(report.end),
        "gpuscope_version": report.version,
        "source": report.source,
        "window": format_duration(report.window_seconds),
        "step": format_duration(report.step_seconds),
        "strategy": report.strategy,
        "settings": _settings(report),
        "summary": {
            "workloads": len(report.rows),
            "classifications": report.classification_counts,
            **_money_document(report.total),
            "savings_usd_per_year": _money(report.total.savings * 12),
            "business_case": report.business_case,
        },
        "namespaces": [
            {"namespace": namespace, **_money_document(money)}
            for namespace, money in report.namespaces
        ],
        "consolidation": {
            "gpus_before": consolidation.gpus_before,
            "gpus_after": consolidation.gpus_after,
            "utilization_before": _ratio(consolidation.utilization_before),
            "utilization_after": _ratio(consolidation.utilization_after),
            "models": [
                {
                    "model": change.model,
                    "gpus_before": change.gpus_before,
                    "gpus_after": change.gpus_after,
                    "utilization_before": _ratio(change.utilization_before),
                    "utilization_after": _ratio(change.utilization_after),
                }
                for change in consolidation.models
            ],
        },
        "workloads": [workload_document(row) for row in report.rows],
        "rooflines": [
            {
                "model": roofline.model,
                "dtype": roofline.dtype,
                "peak_flops": roofline.peak_flops.value,
                "peak_flops_source": roofline.peak_flops.source,
                "memory_bandwidth_bytes_per_second": roofline.bandwidth.value,
                "memory_bandwidth_source": roofline.bandwidth.source,
                "points": [
                    {
                        "workload": point.workload,
                        "classification": point.classification,
                        "intensity_flop_per_byte": round(point.intensity, 3),
                        "flops": point.flops,
                    }
                    for point in roofline.points
                ],
            }
            for roofline in report.rooflines
        ],
        "missing_signals": list(report.missing_signals),
    }


@register("json", "json")
def format_json(report: Report, _output: Output) -> str:
    return json.dumps(report_document(report), indent=2) + "\n"


@register("yaml", "yaml")
def format_yaml(report: Report, _output: Output) -> str:
    return yaml.safe_dump(report_document(report), sort_keys=False, allow_unicode=True)


CSV_COLUMNS: Final = (
    "namespace",
    "kind",
    "workload",
    "pods",
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
    "cost_current_usd_per_month",
    "cost_recommended_usd_per_month",
    "savings_usd_per_month",
    "reason",
)


def _cell(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{round(value, digits):g}"


@register("csv", "csv")
def format_csv(report: Report, _output: Output) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.rows:
        history, recommendation = row.history, row.recommendation
        peak = row.memory_peak_bytes
        writer.writerow(
            (
                history.namespace,
                history.kind,
                history.name,
                len(history.pods),
                _cell(row.gpus_held, 3),
                recommendation.current.label if recommendation.current else history.model,
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
                _cell(row.cost_current, 2),
                _cell(row.cost_recommended, 2),
                _cell(row.savings, 2),
                recommendation.reason,
            )
        )
    return buffer.getvalue()


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f} GiB"


def _usd(value: float | None) -> str:
    return "-" if value is None else money_text(value)


def _title(report: Report) -> str:
    return (
        f"GPU rightsizing: {format_duration(report.window_seconds)} to "
        f"{_timestamp(report.end)} ({report.strategy} strategy)"
    )


def _percentile(report: Report) -> str:
    return f"p{report.settings.percentile * 100:g}"


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@register("markdown", "md")
def format_markdown(report: Report, _output: Output) -> str:
    p = _percentile(report)
    total = report.total
    consolidation = report.consolidation
    lines = [
        f"# {_title(report)}",
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
        recommendation = row.recommendation
        current = recommendation.current.label if recommendation.current else row.history.model
        lines.append(
            "| "
            + " | ".join(
                _markdown_cell(cell)
                for cell in (
                    f"{row.history.namespace}/{row.history.name}",
                    f"{row.gpus_held:.2g} x {current}",
                    _percent(row.utilization_mean),
                    _percent(row.utilization_quantile),
                    _gib(row.memory_peak_bytes),
                    _percent(row.idle_ratio),
                    recommendation.classification,
                    row.target_label if recommendation.action != "keep" else "keep",
                    _usd(row.cost_current),
                    _usd(row.savings),
                    recommendation.reason,
                )
            )
            + " |"
        )
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
        f"{_percent(change.utilization_before)} | {_percent(change.utilization_after)} |"
        for change in consolidation.models
    )
    lines += ["", _footer(report), ""]
    return "\n".join(lines)


def _footer(report: Report) -> str:
    settings = ", ".join(f"{name}={value}" for name, value in _settings(report).items())
    text = (
        f"Source: {report.source}; window {format_duration(report.window_seconds)}, step "
        f"{format_duration(report.step_seconds)}; settings: {settings}; gpuscope {report.version}."
    )
    if report.missing_signals:
        text += f" Signals that could not be read: {', '.join(report.missing_signals)}."
    return text


STYLES: Final = {
    "idle": "bold red",
    "input-bound": "bold dark_orange",
    "underused": "bold yellow",
    "memory-bound": "bold blue",
    "compute-bound": "bold green",
    "right-sized": "cyan",
    "undefined": "dim",
}


@register("table", "txt")
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
    p = _percentile(report)
    table = Table(title=_title(report), show_lines=False, header_style="bold")
    for column, justify in (
        ("Workload", "left"),
        ("GPU now", "left"),
        (f"Util mean/{p}", "right"),
        ("Mem peak", "right"),
        ("Idle", "right"),
        ("Class", "left"),
        ("Recommendation", "left"),
        ("$/mo now", "right"),
        ("Savings/mo", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in report.rows:
        recommendation = row.recommendation
        current = recommendation.current.label if recommendation.current else row.history.model
        target = row.target_label if recommendation.action != "keep" else "keep"
        if recommendation.cpu_changes:
            change = recommendation.cpu_changes[0]
            target = f"CPU {change.limit_cores:g} -> {change.recommended_cores:g} cores, keep GPU"
        table.add_row(
            f"{row.history.namespace}/{row.history.name}",
            f"{row.gpus_held:.2g} x {current}",
            f"{_percent(row.utilization_mean)}/{_percent(row.utilization_quantile)}",
            _gib(row.memory_peak_bytes),
            _percent(row.idle_ratio),
            f"[{STYLES[recommendation.classification]}]{recommendation.classification}[/]",
            target,
            _usd(row.cost_current),
            _usd(row.savings),
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
    return buffer.getvalue()


HTML_STYLE: Final = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d1d1f;max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#666;font-size:13px}.case{font-size:15px;line-height:1.5;max-width:1000px}
.kpis{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0}
.kpi{border:1px solid #ddd;border-radius:8px;padding:10px 14px;min-width:150px}
.kpi b{display:block;font-size:20px}.kpi span{color:#666;font-size:12px}
.plots{display:flex;gap:16px;flex-wrap:wrap}.plots figure{margin:0;border:1px solid #eee;border-radius:8px;padding:8px}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border-bottom:1px solid #eee;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f7;position:sticky;top:0}td.n{text-align:right;white-space:nowrap}
.badge{border-radius:10px;padding:1px 8px;color:#fff;font-size:12px;white-space:nowrap}
.why{color:#444;max-width:460px}.legend span{margin-right:12px;font-size:12px}
"""


def _badge(classification: str) -> str:
    color = svg.COLORS.get(classification, "#555")
    text_color = "#222" if classification == "underused" else "#fff"
    return (
        f"<span class='badge' style='background:{color};color:{text_color}'>"
        f"{escape(classification)}</span>"
    )


@register("html", "html")
def format_html(report: Report, _output: Output) -> str:
    total, consolidation = report.total, report.consolidation
    p = _percentile(report)
    kpis = (
        (money_text(total.current), "GPU cost per month now"),
        (money_text(total.recommended), "recommended per month"),
        (money_text(total.savings), "saved per month"),
        (f"{consolidation.gpus_before} → {consolidation.gpus_after}", "GPUs now → after"),
        (
            f"{consolidation.utilization_before:.0%} → {consolidation.utilization_after:.0%}",
            "utilization now → after",
        ),
    )
    rows = []
    for row in report.rows:
        recommendation = row.recommendation
        current = recommendation.current.label if recommendation.current else row.history.model
        target = row.target_label if recommendation.action != "keep" else "keep"
        rows.append(
            "<tr>"
            f"<td>{escape(row.history.namespace)}/<b>{escape(row.history.name)}</b>"
            f"<br><span class='meta'>{escape(row.history.kind)}, {len(row.history.pods)} pod(s)</span></td>"
            f"<td>{row.gpus_held:.2g} &times; {escape(current)}</td>"
            f"<td class='n'>{_percent(row.utilization_mean)}</td>"
            f"<td class='n'>{_percent(row.utilization_quantile)}</td>"
            f"<td class='n'>{_percent(row.sm_quantile)}</td>"
            f"<td class='n'>{_gib(row.memory_peak_bytes)}</td>"
            f"<td class='n'>{_percent(row.idle_ratio)}</td>"
            f"<td class='n'>{_percent(row.cpu_ratio)}</td>"
            f"<td>{_badge(recommendation.classification)}</td>"
            f"<td>{escape(target)}</td>"
            f"<td class='n'>{_usd(row.cost_current)}</td>"
            f"<td class='n'>{_usd(row.cost_recommended)}</td>"
            f"<td class='n'><b>{_usd(row.savings)}</b></td>"
            f"<td class='why'>{escape(recommendation.reason)}</td>"
            "</tr>"
        )
    namespaces = "".join(
        f"<tr><td>{escape(namespace)}</td><td class='n'>{money_text(money.current)}</td>"
        f"<td class='n'>{money_text(money.recommended)}</td><td class='n'><b>{money_text(money.savings)}</b></td></tr>"
        for namespace, money in report.namespaces
    )
    plots = [svg.roofline(roofline) for roofline in report.rooflines]
    plots.append(svg.consolidation(consolidation))
    legend = "".join(
        f"<span><svg width='10' height='10'><circle cx='5' cy='5' r='5' fill='{color}'/></svg> "
        f"{escape(name)}</span>"
        for name, color in svg.COLORS.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(_title(report))}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{HTML_STYLE}</style></head>
<body>
<h1>GPU rightsizing report</h1>
<div class="meta">{escape(format_duration(report.window_seconds))} of history to {_timestamp(report.end)},
from {escape(report.source)}; strategy {escape(report.strategy)}</div>
<div class="kpis">{"".join(f"<div class='kpi'><b>{escape(value)}</b><span>{escape(label)}</span></div>" for value, label in kpis)}</div>
<p class="case">{escape(report.business_case)}</p>
<h2>Where each workload sits</h2>
<div class="legend">{legend}</div>
<div class="plots">{"".join(f"<figure>{plot}</figure>" for plot in plots)}</div>
<h2>Workloads</h2>
<table><thead><tr><th>workload</th><th>GPU now</th><th>util mean</th><th>util {p}</th>
<th>SM {p}</th><th>memory peak</th><th>idle</th><th>CPU/limit</th><th>class</th><th>recommendation</th>
<th>$/month now</th><th>$/month after</th><th>savings</th><th>why</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
<h2>Namespaces</h2>
<table><thead><tr><th>namespace</th><th>$/month now</th><th>recommended</th><th>savings</th></tr></thead>
<tbody>{namespaces}</tbody></table>
<p class="meta">{escape(_footer(report))}</p>
</body></html>
"""
