"""How far to trust a recommendation, and where demand is going. Pure.

Confidence is the weakest of three factors, each `high`, `medium` or `low`, and its reason says
all three in words:

- **evidence**: GPU time observed per replica's set of GPUs, over the window (3 replicas for a
  day in a 14-day window are 3 days of evidence: 21%). High from half the window, medium from
  `EVIDENCE_MEDIUM`.
- **variability**: the 99th percentile of utilization over its mean. Steady use (a p99 under
  twice the mean) is high; bursts (4 times or more) are low: a percentile of bursty use moves
  with every burst.
- **margin**: how far the evidence was from the threshold that decided, as the strategy measured
  it (`Recommendation.margin`): how much of the target's compute and memory the demand with
  headroom takes, how far the p99 is under the idle threshold, ... High from 25% clear,
  medium from 10%.

Terms, as Kruize has them: the strategy runs again on the last day (`short_term`) and the last
week (`medium_term`) beside the whole window (`long_term`). Demand at the percentile rising by
more than `TREND_RATIO` (and at least `TREND_MIN` of a GPU) from the window to the shorter term
is a rising trend: it shows before it hurts. When a shorter term would recommend something else,
confidence is at most medium, and the reason says what that term would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.durations import format_duration
from exporter.rightsize.strategy import IDLE, UNDEFINED, gpus_per_pod

if TYPE_CHECKING:
    from collections.abc import Sequence

    from exporter.rightsize.history import WorkloadHistory
    from exporter.rightsize.strategy import Recommendation

HIGH: Final = "high"
MEDIUM: Final = "medium"
LOW: Final = "low"
LEVELS: Final = (LOW, MEDIUM, HIGH)
"""From least to most trusted: `--min-confidence` keeps a level and those after it."""
EVIDENCE_HIGH: Final = 0.5
EVIDENCE_MEDIUM: Final = 0.15
BURST_MEDIUM: Final = 2.0
"""p99 over mean from which use counts as variable (medium)."""
BURST_LOW: Final = 4.0
"""p99 over mean from which use counts as bursty (low)."""
MARGIN_HIGH: Final = 0.25
MARGIN_MEDIUM: Final = 0.10
TREND_RATIO: Final = 0.15
TREND_MIN: Final = 0.02
RISING: Final = "rising"
FALLING: Final = "falling"
STEADY: Final = "steady"
UNKNOWN: Final = "unknown"


@dataclass(frozen=True, slots=True)
class TermAnswer:
    """What the strategy answers over one term."""

    name: str
    """`short_term`, `medium_term` or `long_term`."""
    window_seconds: float
    recommendation: Recommendation | None
    """None when the workload held no GPU of this configuration in that term."""
    label: str = "-"
    """What the term recommends, as the report shows it (`keep`, `release`, an option)."""

    @property
    def demand(self) -> float | None:
        """Compute at the percentile as a share of the current GPU option."""
        recommendation = self.recommendation
        if (
            recommendation is None
            or recommendation.demand is None
            or recommendation.current is None
        ):
            return None
        return recommendation.demand.compute / recommendation.current.compute


@dataclass(frozen=True, slots=True)
class Confidence:
    level: str
    reason: str
    evidence: float
    """GPU time observed per replica's GPUs over the window (0..1)."""
    burstiness: float | None
    """p99 utilization over its mean (None: no utilization)."""
    margin: float | None


@dataclass(frozen=True, slots=True)
class Trend:
    direction: str
    """`rising`, `falling`, `steady` or `unknown`."""
    reason: str


def _level(value: float, high: float, medium: float) -> str:
    return HIGH if value >= high else MEDIUM if value >= medium else LOW


def _lowest(levels: Sequence[str]) -> str:
    return min(levels, key=LEVELS.index)


def assess(
    workload: WorkloadHistory,
    recommendation: Recommendation,
    window: float,
    terms: Sequence[TermAnswer] = (),
) -> Confidence:
    """The recommendation's confidence; `terms` are the shorter terms' answers."""
    devices = workload.devices
    observed = sum(min(d.observed_seconds, d.held_seconds) for d in devices)
    evidence = min(observed / max(gpus_per_pod(workload), 1) / window, 1.0) if window else 0.0
    factors = [
        (
            _level(evidence, EVIDENCE_HIGH, EVIDENCE_MEDIUM),
            (
                f"{format_duration(_minutes(evidence * window))} of GPU time per replica in the "
                f"{format_duration(window)} window"
            ),
        )
    ]
    if recommendation.classification == UNDEFINED:
        return Confidence(LOW, f"no answer: {recommendation.reason}", evidence, None, None)
    burstiness = _burstiness(workload)
    if recommendation.classification == IDLE:
        factors.append((HIGH, "use under the idle threshold: nothing to vary"))
    elif burstiness is None:
        factors.append((LOW, "no utilization to judge its variability"))
    elif burstiness == 0:
        factors.append((HIGH, "no use to vary"))
    else:
        level = HIGH if burstiness < BURST_MEDIUM else MEDIUM if burstiness < BURST_LOW else LOW
        kind = {HIGH: "steady", MEDIUM: "variable", LOW: "bursty"}[level]
        factors.append((level, f"{kind} use: p99 {burstiness:.1f}x the mean"))
    margin = recommendation.margin
    if margin is not None:
        factors.append(
            (_level(margin, MARGIN_HIGH, MARGIN_MEDIUM), recommendation.margin_text or "margin")
        )
    words = [f"{text} ({level})" for level, text in factors]
    levels = [level for level, _ in factors]
    for term in terms:
        if term.recommendation is None or term.recommendation.classification == UNDEFINED:
            continue
        if term.label != _label(recommendation):
            levels.append(MEDIUM)
            words.append(
                f"the last {format_duration(term.window_seconds)} alone would recommend "
                f"{term.label} (at most medium)"
            )
    level = _lowest(levels)
    return Confidence(level, f"{level}: {'; '.join(words)}", evidence, burstiness, margin)


def trend(long_term: TermAnswer, shorter: Sequence[TermAnswer], percentile: str) -> Trend:
    """Where compute demand at the percentile goes, from the window to the shortest term."""
    base = long_term.demand
    known = [term for term in shorter if term.demand is not None]
    if base is None or not known:
        return Trend(UNKNOWN, "no shorter term to compare with")
    recommendation = long_term.recommendation
    signal = (
        recommendation.demand.compute_signal if recommendation and recommendation.demand else ""
    )
    figures = ", ".join(
        f"{term.demand:.0%} over the last {format_duration(term.window_seconds)}"
        for term in sorted(known, key=lambda t: t.window_seconds)
    )
    latest = min(known, key=lambda t: t.window_seconds).demand or 0.0
    difference = latest - base
    if difference > max(base * TREND_RATIO, TREND_MIN):
        direction = RISING
    elif -difference > max(base * TREND_RATIO, TREND_MIN):
        direction = FALLING
    else:
        direction = STEADY
    return Trend(
        direction,
        f"{signal} {percentile} {figures}, {base:.0%} over "
        f"{format_duration(long_term.window_seconds)}: {direction}",
    )


def _label(recommendation: Recommendation) -> str:
    """What a recommendation says to do, comparable between terms."""
    if recommendation.action == "release":
        return "release"
    if recommendation.recommended_gpus is not None and recommendation.target is not None:
        return gpu_count_label(recommendation.target.label, recommendation.recommended_gpus)
    if recommendation.action == "move" and recommendation.target is not None:
        return recommendation.target.label
    if recommendation.action == "add CPU":
        return "add CPU"
    return "keep"


def gpu_count_label(option: str, count: int) -> str:
    """An option asked for `count` times per replica (`H100 SXM x1`)."""
    return f"{option} x{count}"


def term_label(recommendation: Recommendation | None) -> str:
    """What a term recommends, as the report shows it."""
    if recommendation is None:
        return "-"
    if recommendation.classification == UNDEFINED:
        return "-"
    return _label(recommendation)


def _burstiness(workload: WorkloadHistory) -> float | None:
    """p99 utilization over the mean, weighted by held time; 0 when it never ran."""
    pairs = [
        (d.busy_idle_quantile, d.busy_mean, d.held_seconds)
        for d in workload.devices
        if d.busy_idle_quantile is not None and d.busy_mean is not None
    ]
    if not pairs:
        return None
    held = sum(weight for _, _, weight in pairs) or 1.0
    p99 = max(p for p, _, _ in pairs)
    mean = sum(m * weight for _, m, weight in pairs) / held
    if p99 <= 0:
        return 0.0
    return p99 / mean if mean > 0 else BURST_LOW


def _minutes(seconds: float) -> float:
    return round(seconds / 60) * 60
