"""The strategy's settings: one table, from which come the flags, the bounds and the README.

Percentages are written as percent (`--percentile 95`, `--compute-headroom 20`, `20%` works too)
and held as ratios (0.95, 0.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from exporter.catalog import DTYPES
from exporter.durations import format_duration, parse_duration_between

if TYPE_CHECKING:
    from collections.abc import Callable


class SettingsError(ValueError):
    """A strategy setting out of bounds; `str()` names the flag."""


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


def percent_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        spelled = text.strip().removesuffix("%")
        try:
            percent = float(spelled)
        except ValueError:
            raise ValueError(f"{text!r} is not a percentage (e.g. 20 or 20%)") from None
        if not low <= percent <= high:
            raise ValueError(f"{percent:g}% is outside {low:g}..{high:g}%")
        return percent / 100

    return parse


def duration_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        return parse_duration_between(text, low, high)

    return parse


def parse_dtype(text: str) -> str:
    dtype = text.strip().lower()
    if dtype not in DTYPES:
        raise ValueError(f"{text!r} is not one of {', '.join(DTYPES)}")
    return dtype


def parse_models(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError("expected all, seen, or a comma-separated list of GPU models")
    if len(names) > 1 and {"all", "seen"} & set(names):
        raise ValueError("all and seen stand alone, not in a list")
    return names


@dataclass(frozen=True, slots=True)
class StrategySetting:
    name: str
    attribute: str
    parse: Callable[[str], Any]
    help: str
    metavar: str

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def shown_default(self) -> str:
        value = getattr(StrategySettings(), self.attribute)
        if self.metavar == "PERCENT":
            return f"{value * 100:g}"
        if self.metavar == "DURATION":
            return format_duration(value)
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value)


STRATEGY_SETTINGS: Final = (
    StrategySetting(
        "percentile",
        "percentile",
        percent_between(50, 100),
        "Percentile of per-step utilization that sizes compute (50 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "compute-headroom",
        "compute_headroom",
        percent_between(0, 100),
        "Compute added on top of that percentile before fitting a GPU or MIG profile (0 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "memory-headroom",
        "memory_headroom",
        percent_between(0, 100),
        "Memory added on top of the peak before fitting a GPU or MIG profile (0 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "idle-utilization",
        "idle_utilization",
        percent_between(0, 20),
        "A GPU whose p99 utilization stays at or below this is idle: release it (0 to 20).",
        "PERCENT",
    ),
    StrategySetting(
        "saturation",
        "saturation",
        percent_between(50, 100),
        "Compute use at the percentile from which a GPU counts as fully used (50 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "cpu-saturation",
        "cpu_saturation",
        percent_between(50, 100),
        "CPU use at the percentile, as a share of the limit, that marks an input-bound pod (50 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "min-history",
        "min_history",
        duration_between(3600, 90 * 86400),
        "Less GPU time observed than this is not enough data (1h to 90d).",
        "DURATION",
    ),
    StrategySetting(
        "min-coverage",
        "min_coverage",
        percent_between(1, 100),
        "Share of the held time with utilization data below which there is not enough data (1 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "min-savings",
        "min_savings",
        percent_between(0, 100),
        "Recommend a move only if it saves at least this share of the workload's cost (0 to 100).",
        "PERCENT",
    ),
    StrategySetting(
        "dtype",
        "dtype",
        parse_dtype,
        "Precision whose FLOP/s ceilings scale compute between GPU types and draw the rooflines.",
        "DTYPE",
    ),
    StrategySetting(
        "models",
        "models",
        parse_models,
        "GPU models a workload may move to: all (every priced model), seen (models in the "
        "history), or catalog keys (h100-sxm,l4).",
        "MODELS",
    ),
)


def load_settings(raw: dict[str, str]) -> StrategySettings:
    """Settings from raw flag strings keyed by attribute; missing ones keep their defaults."""
    values: dict[str, Any] = {}
    for setting in STRATEGY_SETTINGS:
        if setting.attribute in raw:
            try:
                values[setting.attribute] = setting.parse(raw[setting.attribute])
            except ValueError as error:
                raise SettingsError(f"invalid {setting.flag}: {error}") from error
    return StrategySettings(**values)


def settings_table() -> str:
    """The Markdown table of strategy settings for the README (a test keeps them equal)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    rows.extend(f"| `{s.flag}` | `{s.shown_default()}` | {s.help} |" for s in STRATEGY_SETTINGS)
    return "\n".join(rows)
