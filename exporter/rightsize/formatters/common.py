"""What the formats share: where the text goes, and numbers, times and captions as people read them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.report import money_text
from exporter.rightsize.settings import settings_text

if TYPE_CHECKING:
    from exporter.rightsize.report import Report
    from exporter.rightsize.row import WorkloadRow

GIB: Final = 1024**3


@dataclass(frozen=True, slots=True)
class Look:
    """How the formats mark a classification: its colour (HTML, SVG) and its rich style."""

    color: str
    style: str


LOOKS: Final = {
    "idle": Look("#d62728", "bold red"),
    "input-bound": Look("#ff7f0e", "bold dark_orange"),
    "underused": Look("#e6b800", "bold yellow"),
    "memory-bound": Look("#1f77b4", "bold blue"),
    "compute-bound": Look("#2ca02c", "bold green"),
    "right-sized": Look("#17becf", "cyan"),
    "undefined": Look("#7f7f7f", "dim"),
}
"""Every classification, in the order the legends list them."""
COLORS: Final = {name: look.color for name, look in LOOKS.items()}


@dataclass(frozen=True, slots=True)
class Output:
    """Where the text goes: a terminal gets colour and its width; a served page its links and
    status line."""

    terminal: bool = False
    width: int = 180
    links: tuple[tuple[str, str], ...] = ()
    """(label, href) of pages beside the report (the server's JSON and metrics)."""
    status: str = ""
    """A line on how current the report is (the server's refresh)."""


Render = Callable[["Report", Output], str]


@dataclass(frozen=True, slots=True)
class Format:
    """A report format: its name (`--format`), the file extension of its output, its renderer."""

    name: str
    extension: str
    render: Render


def timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f} GiB"


def usd(value: float | None) -> str:
    return "-" if value is None else money_text(value)


PRICE_NOTES: Final = {
    "opencost": "OpenCost",
    "opencost+catalog": "OpenCost+catalog",
}
"""What a row's current cost says of who priced its GPUs; nothing for the catalog's alone."""


def price_label(row: WorkloadRow) -> str:
    """`OpenCost` for a current cost its nodes' OpenCost prices made, else nothing."""
    return PRICE_NOTES.get(row.price_source or "", "")


def price_note(row: WorkloadRow) -> str:
    """` (OpenCost)` after such a cost in a table, else nothing."""
    label = price_label(row)
    return f" ({label})" if label else ""


TOKENS_NOTE: Final = (
    "Cost per million tokens, for workloads whose inference servers Prometheus scrapes: the GPU "
    "cost over the tokens (prompt + output) they served in the window; after the recommendation "
    "it assumes unchanged throughput (the same tokens on the recommended GPUs)."
)


def per_million_tokens(row: WorkloadRow) -> str:
    """GPU cost per million tokens now and after the recommendation ("-" for no serving)."""
    now = row.cost_per_million_tokens_current
    if now is None:
        return "-"
    after = row.cost_per_million_tokens_recommended
    return f"${now:,.3f} → " + ("-" if after is None else f"${after:,.3f}")


def title(report: Report) -> str:
    return (
        f"GPU rightsizing: {format_duration(report.window_seconds)} to "
        f"{timestamp(report.end)} ({report.strategy} strategy)"
    )


def percentile(report: Report) -> str:
    """`p95`: the strategy's percentile, as column headings name it."""
    return f"p{report.settings.percentile * 100:g}"


def current_label(row: WorkloadRow) -> str:
    """What the workload runs on now."""
    current = row.recommendation.current
    return current.label if current else row.history.model


def workload_label(row: WorkloadRow) -> str:
    """`namespace/name`, behind its cluster when there is one."""
    history = row.history
    name = f"{history.namespace}/{history.name}"
    return f"{history.cluster}: {name}" if history.cluster else name


def recommendation_label(row: WorkloadRow) -> str:
    """What to do: keep, release, or the option to move to."""
    return row.target_label if row.recommendation.action != "keep" else "keep"


def footer(report: Report) -> str:
    settings = ", ".join(
        f"{name}={value}" for name, value in settings_text(report.settings).items()
    )
    text = (
        f"Source: {report.source} ({report.history_source}'s series); window {format_duration(report.window_seconds)}, step "
        f"{format_duration(report.step_seconds)}; settings: {settings}; gpuscope {report.version}."
    )
    if report.cluster_label:
        text += f" Clusters told apart by the label {report.cluster_label}."
    if report.missing_signals:
        text += f" Missing signals: {'; '.join(report.missing_signals)}."
    return text
