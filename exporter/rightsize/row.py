"""One workload's row of the report: its history, recommendation and money, and what the
report's formats read off it (replicas, per-replica money, utilization over its devices, the
target in words)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.rightsize.confidence import LOW, gpu_count_label
from exporter.rightsize.strategy import IDLE, UNDEFINED, gpus_per_pod

if TYPE_CHECKING:
    from exporter.rightsize.confidence import Confidence, TermAnswer, Trend
    from exporter.rightsize.history import Autoscaler, DeviceHistory, WorkloadHistory
    from exporter.rightsize.patches import Patch
    from exporter.rightsize.strategy import Recommendation


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    history: WorkloadHistory
    recommendation: Recommendation
    gpus_held: float
    """Average number of devices held over the window."""
    cost_current: float | None
    """USD per month."""
    cost_recommended: float | None
    confidence: Confidence | None = None
    trend: Trend | None = None
    terms: tuple[TermAnswer, ...] = ()
    """Every term's answer, the shortest first, the window's (`long_term`) last."""
    autoscaler: Autoscaler | None = None
    patch: Patch | None = None
    tokens_per_month: float | None = None
    """Tokens (prompt + output) its inference servers serve, scaled to a month like the cost;
    None for a workload that serves none."""
    price_source: str | None = None
    """Who priced its current GPUs (`opencost.CurrentCost.source`)."""
    option_price_scale: float = 1.0
    """The factor its catalog-priced options were scaled by (OpenCost's over the catalog's)."""

    @property
    def cluster(self) -> str:
        return self.history.cluster

    @property
    def confidence_level(self) -> str:
        return self.confidence.level if self.confidence else LOW

    @property
    def replicas(self) -> int:
        """Pods holding its GPUs at the end of the window."""
        return sum(1 for pod in self.history.pods if pod.present)

    @property
    def replicas_mean(self) -> float:
        """Pods holding its GPUs at a time, on average over the window."""
        return self.gpus_held / max(gpus_per_pod(self.history), 1)

    @property
    def gpus_per_replica(self) -> int:
        return gpus_per_pod(self.history)

    @property
    def cost_current_per_replica(self) -> float | None:
        replicas = self.replicas_mean
        return None if self.cost_current is None or replicas <= 0 else self.cost_current / replicas

    @property
    def savings_per_replica(self) -> float | None:
        replicas = self.replicas_mean
        return None if self.savings is None or replicas <= 0 else self.savings / replicas

    @property
    def savings(self) -> float | None:
        if self.cost_current is None or self.cost_recommended is None:
            return None
        return self.cost_current - self.cost_recommended

    @property
    def cost_per_million_tokens_current(self) -> float | None:
        """GPU cost per million tokens served now."""
        return per_million_tokens(self.cost_current, self.tokens_per_month)

    @property
    def cost_per_million_tokens_recommended(self) -> float | None:
        """The same after the recommendation, assuming the workload serves as many tokens
        (unchanged throughput); None when it releases its GPUs."""
        if not self.cost_recommended:
            return None
        return per_million_tokens(self.cost_recommended, self.tokens_per_month)

    @property
    def devices(self) -> tuple[DeviceHistory, ...]:
        return self.history.devices

    @property
    def utilization_mean(self) -> float | None:
        return weighted(self.devices, "busy_mean")

    @property
    def utilization_quantile(self) -> float | None:
        return maximum(self.devices, "busy_quantile")

    @property
    def sm_quantile(self) -> float | None:
        return maximum(self.devices, "sm_quantile")

    @property
    def memory_peak_bytes(self) -> float | None:
        return maximum(self.devices, "memory_peak_bytes")

    @property
    def memory_quantile_bytes(self) -> float | None:
        return maximum(self.devices, "memory_quantile_bytes")

    @property
    def idle_ratio(self) -> float | None:
        in_use = weighted(self.devices, "in_use_ratio")
        return None if in_use is None else 1 - in_use

    @property
    def shared(self) -> bool:
        return any(device.shared for device in self.devices)

    @property
    def cpu_ratio(self) -> float | None:
        """The highest CPU use at the percentile over its limit, among the pods' containers."""
        ratios = [
            cpu.usage_cores / cpu.limit_cores
            for pod in self.history.pods
            for cpu in pod.cpu
            if cpu.usage_cores is not None and cpu.limit_cores
        ]
        return max(ratios) if ratios else None

    @property
    def target_label(self) -> str:
        recommendation = self.recommendation
        if recommendation.classification == IDLE:
            return "release"
        if recommendation.target is None or recommendation.classification == UNDEFINED:
            return "-"
        if recommendation.recommended_gpus is not None:
            return gpu_count_label(recommendation.target.label, recommendation.recommended_gpus)
        return recommendation.target.label

    @property
    def recommended_gpus(self) -> int:
        """GPUs (or MIG instances) per replica once the recommendation is applied: none when
        released, fewer when some are never used, else as many as today."""
        recommendation = self.recommendation
        if recommendation.classification == IDLE:
            return 0
        if recommendation.recommended_gpus is not None:
            return recommendation.recommended_gpus
        return self.gpus_per_replica


def per_million_tokens(
    cost_per_month: float | None, tokens_per_month: float | None
) -> float | None:
    """Cost per million tokens served, from both per month; None without either."""
    if cost_per_month is None or not tokens_per_month:
        return None
    return cost_per_month / tokens_per_month * 1e6


def weighted(devices: tuple[DeviceHistory, ...], name: str) -> float | None:
    """The devices' `name`, weighted by how long each was held; None where none has it."""
    pairs = [(value, d.held_seconds) for d in devices if (value := getattr(d, name)) is not None]
    total = sum(weight for _, weight in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total > 0 else None


def maximum(devices: tuple[DeviceHistory, ...], name: str) -> float | None:
    """The largest of the devices' `name`; None where none has it."""
    values = [value for d in devices if (value := getattr(d, name)) is not None]
    return max(values) if values else None
