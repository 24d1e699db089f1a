"""The strategy's settings: their rows of `gpuscope rightsize`'s settings table, and how a report
shows them.

Percentages are written as percent (`--percentile 95`, `--compute-headroom 20`, `20%` works too)
and held as ratios (0.95, 0.2). The rows are part of the job's one `SettingsTable`
(`exporter/rightsize/options.py`), from which come the flags, the variables, the config file's
keys and the rightsizing guide's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from exporter.catalog import DTYPES
from exporter.durations import format_duration
from exporter.settings import Setting, duration_between, one_of, percent_between, text

GROUP: Final = "strategy"


@dataclass(frozen=True, slots=True)
class StrategySettings:
    """Settings of the `simple` strategy. Field docs are the flags' help (see STRATEGY_SETTINGS)."""

    percentile: float = 0.95
    compute_headroom: float = 0.20
    memory_headroom: float = 0.15
    idle_utilization: float = 0.02
    saturation: float = 0.80
    cpu_saturation: float = 0.90
    min_history: float = 6 * 3600.0
    min_coverage: float = 0.50
    min_savings: float = 0.10
    dtype: str = "bf16"
    models: tuple[str, ...] = field(default=("all",))


_DEFAULTS: Final = StrategySettings()


def listed(values: object) -> list[object]:
    """A repeated setting's values (the table hands its parser a list)."""
    return values if isinstance(values, list) else [values]


def parse_models(values: object) -> tuple[str, ...]:
    """`all`, `seen`, or GPU models (repeated or comma-separated)."""
    names = tuple(name for value in listed(values) if (name := text(value).strip()))
    if not names:
        raise ValueError("expected all, seen, or a comma-separated list of GPU models")
    if len(names) > 1 and {"all", "seen"} & set(names):
        raise ValueError("all and seen stand alone, not in a list")
    return names


def _percent(name: str, low: float, high: float, help_text: str) -> Setting:
    """A percentage row; its default is shown as percent, the way it is written."""
    attribute = name.replace("-", "_")
    return Setting(
        name,
        attribute,
        percent_between(low, high),
        f"{help_text} ({low:g} to {high:g}).",
        "PERCENT",
        group=GROUP,
        shown_default=f"{getattr(_DEFAULTS, attribute) * 100:g}",
    )


STRATEGY_SETTINGS: Final = (
    _percent("percentile", 50, 100, "Percentile of per-step utilization that sizes compute"),
    _percent(
        "compute-headroom",
        0,
        100,
        "Compute added on top of that percentile before fitting a GPU or MIG profile",
    ),
    _percent(
        "memory-headroom",
        0,
        100,
        "Memory added on top of the peak before fitting a GPU or MIG profile",
    ),
    _percent(
        "idle-utilization",
        0,
        20,
        "A GPU whose p99 utilization stays at or below this is idle: release it",
    ),
    _percent(
        "saturation",
        50,
        100,
        "Compute use at the percentile from which a GPU counts as fully used",
    ),
    _percent(
        "cpu-saturation",
        50,
        100,
        "CPU use at the percentile, as a share of the limit, that marks an input-bound pod",
    ),
    Setting(
        "min-history",
        "min_history",
        duration_between(3600, 90 * 86400),
        "Less GPU time observed than this is not enough data (1h to 90d).",
        "DURATION",
        group=GROUP,
    ),
    _percent(
        "min-coverage",
        1,
        100,
        "Share of the held time with utilization data below which there is not enough data",
    ),
    _percent(
        "min-savings",
        0,
        100,
        "Recommend a move only if it saves at least this share of the workload's cost",
    ),
    Setting(
        "dtype",
        "dtype",
        one_of(*DTYPES),
        "Precision whose FLOP/s ceilings scale compute between GPU types and draw the rooflines.",
        "DTYPE",
        group=GROUP,
    ),
    Setting(
        "models",
        "models",
        parse_models,
        "GPU models a workload may move to: all (every priced model), seen (models in the "
        "history), or catalog keys (h100-sxm,l4).",
        "MODELS",
        repeated=True,
        group=GROUP,
    ),
)
"""Every field of `StrategySettings`, as a row of the job's settings table."""


def settings_text(settings: StrategySettings) -> dict[str, str]:
    """Each strategy setting as a report shows it (`95%`, `6h`, `all`), by name."""
    return {
        setting.name: _value_text(getattr(settings, setting.attribute), setting.metavar)
        for setting in STRATEGY_SETTINGS
    }


def _value_text(value: object, metavar: str) -> str:
    if metavar == "PERCENT" and isinstance(value, float):
        return f"{value * 100:g}%"
    if metavar == "DURATION" and isinstance(value, float):
        return format_duration(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)
