"""PromQL the dashboards share: label selectors, clock-event reasons, hours over the range."""

from __future__ import annotations

from typing import Final

SLOWDOWN_REASONS: Final = (
    "hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown"
)
"""Clock-event reasons that mean the card protects itself (GpuSlowdownSustained alerts on them)."""
THROTTLE_REASONS: Final = f"sw_power_cap|sync_boost|{SLOWDOWN_REASONS}"
"""Clock-event reasons that hold a working GPU's clocks down (idle and settings excluded)."""


def sel(*matchers: str) -> str:
    """A label selector body from matchers, skipping empty ones: sel('a="1"', '') -> 'a="1"'."""
    return ", ".join(m for m in matchers if m)


def range_hours(expr: str) -> str:
    """Hours accumulated over the dashboard's range by a per-instant quantity (GPUs, $/h).

    A subquery at the panel's interval, summed and scaled: right for series that exist only part
    of the range, which avg_over_time(...) * range would overstate."""
    return f"sum_over_time(({expr})[$__range:$__interval]) * $__interval_ms / 3600000"
