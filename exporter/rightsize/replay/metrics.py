"""The replay as the report server's metrics: GPUs and utilization per policy replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.core import GaugeMetricFamily

from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from exporter.rightsize.replay.engine import PolicyResult

SIMULATION_GPUS: Final = Family(
    "gpuscope_simulation_gpus",
    "GPUs the policy would have needed over the window (`--simulate`): the most at any step "
    "(for current, the GPUs held; for the others, the GPUs their placement uses).",
    labels=("policy",),
    gpu=False,
)
SIMULATION_UTILIZATION: Final = Family(
    "gpuscope_simulation_utilization_ratio",
    "Busy GPU-time over GPUs x window under the policy (`--simulate`).",
    unit="ratio",
    labels=("policy",),
    gpu=False,
)
SIMULATION_FAMILIES: Final = (SIMULATION_GPUS, SIMULATION_UTILIZATION)


def simulation_metrics(results: Sequence[PolicyResult]) -> Iterator[GaugeMetricFamily]:
    """One sample per family and policy replayed; no family at all without `--simulate`."""
    if not results:
        return
    gpus = GaugeMetricFamily(SIMULATION_GPUS.name, SIMULATION_GPUS.help, labels=["policy"])
    utilization = GaugeMetricFamily(
        SIMULATION_UTILIZATION.name, SIMULATION_UTILIZATION.help, labels=["policy"]
    )
    for result in results:
        gpus.add_metric([result.policy], result.gpus.max)
        utilization.add_metric([result.policy], result.utilization_mean)
    yield gpus
    yield utilization
