"""What every family builder shares: a declared `Family` made into an empty metric, one sample
added without rebuilding its labels, and each GPU's label set made once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from exporter.metrics.labels import LabelCache
from exporter.series import GPU_LABELS

if TYPE_CHECKING:
    from exporter.metrics.labels import LabelSet
    from exporter.model import GpuIdentity
    from exporter.series import Family


def new_metric(family: Family) -> Metric:
    """An empty metric for the family, with its name, type, help, unit and label names."""
    labels = [*GPU_LABELS, *family.labels] if family.gpu else list(family.labels)
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    return kind(family.name, family.help, labels=labels, unit=family.unit)


def add(metric: Metric, labels: LabelSet | dict[str, str], value: float) -> None:
    """One series (prometheus_client's add_metric, without rebuilding the label dict)."""
    name = f"{metric.name}_total" if metric.type == "counter" else metric.name
    metric.samples.append(Sample(name, labels, value))


def identity_pairs(identity: GpuIdentity) -> list[tuple[str, str]]:
    """`gpu`, `uuid`, `model`; a MIG instance adds `mig_profile` and `gpu_instance`."""
    pairs = [("gpu", str(identity.index)), ("uuid", identity.uuid), ("model", identity.model)]
    if identity.is_mig_instance:
        pairs += [
            ("mig_profile", identity.mig_profile),
            ("gpu_instance", str(identity.gpu_instance)),
        ]
    return pairs


gpu_labels: Final[LabelCache[GpuIdentity]] = LabelCache(identity_pairs)
"""The labels of a GPU's series: `.base`, and `.with_pairs(("clock", "sm"))` variants, made once."""
