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


EVALUATIONS: Final = "gpuscope:rule_evaluation:timestamp"
"""The time of each evaluation of the rules, recorded with them (deploy/prometheus/gpuscope.rules.yaml)."""
EVALUATION_INTERVAL: Final = (
    f"scalar(max((max_over_time({EVALUATIONS}[$__range]) - min_over_time({EVALUATIONS}[$__range]))"
    f" / (count_over_time({EVALUATIONS}[$__range]) - 1)))"
)
"""Seconds between the rules' evaluations over the dashboard's range: the spacing of their
recorded samples, whatever interval the rules run at."""


def range_hours(selector: str, by: str = "") -> str:
    """Hours accumulated over the dashboard's range by a recorded per-instant quantity (GPUs,
    $/h), summed by the labels `by` (over everything when empty).

    Each recorded sample stands for the evaluation interval before it, so the samples' sum times
    that interval is the integral, to one interval at a series' start: right for series that
    exist only part of the range, which avg_over_time(...) * range would overstate, and one pass
    over the samples, where a subquery at the panel's interval evaluates every series at every
    step."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (sum_over_time({selector}[$__range])) * {EVALUATION_INTERVAL} / 3600"


def selected_only(variable: str) -> str:
    """A matcher that keeps every series while `$variable` holds a selection and none while it is
    at All (`.*`): a GPU uuid (`GPU-…`, `MIG-…`) never fully matches a selection of Kubernetes
    names (lower case), and always matches `.*`. For a variable listing what would be thousands
    of values at All (every pod of the fleet), which is listed once its parent is narrowed."""
    return f'uuid!~"${variable}"'
