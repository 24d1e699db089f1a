"""What the daemon exports, each metric family declared once: its name, type, unit, help and labels.

A `Family` is one metric as Prometheus sees it; a `Series` is one value a GPU gives for a family
(the family and the label values that set it apart, such as `clock="sm"`). NVML readings
(`exporter.readings`) and the other sources name the series they fill; exposition
(`exporter.metrics`) turns them into samples, and the metrics reference (docs/reference/metrics.md) is generated from
the same declarations. Both are compared by identity: each is declared once, as a constant.

Names follow Prometheus' rules: base units, `_ratio` for 0..1, counters named without `_total`
(the exposition adds it), and every GPU series carries `gpu`, `uuid` and `model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

GPU_LABELS: Final = ("gpu", "uuid", "model")
"""Every GPU series carries these; a MIG instance adds `mig_profile` and `gpu_instance`."""

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True, slots=True, eq=False)
class Family:
    """One metric family: `name` as exposed (a counter without its `_total`)."""

    name: str
    help: str
    kind: Kind = "gauge"
    unit: str = ""
    """The OpenMetrics unit, the suffix of `name` (`bytes`, `seconds`, `ratio`, …), or ""."""
    labels: tuple[str, ...] = ()
    """Labels beyond the GPU labels (or all of them for a family that is not per GPU)."""
    gpu: bool = True
    """Whether its series carry the GPU labels."""
    doc: str = ""
    """The metrics reference's longer meaning, where the help text is not enough."""
    labels_doc: str = ""
    """The metrics reference's description of the labels (their values), where the names are not enough."""
    collector: str = ""
    """The collector (`--collector.<name>`) whose readings fill it; "" for the daemon's own."""
    while_down: bool = False
    """Still exported for a GPU that is down (what the event thread counted, say)."""

    @property
    def exposed_name(self) -> str:
        """The name samples carry: counters end in `_total`."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    @property
    def meaning(self) -> str:
        """For the metrics reference: the doc, else the help as a phrase ("Share of …." -> "share of …")."""
        if self.doc:
            return self.doc
        text = self.help.rstrip(".")
        return text[0].lower() + text[1:] if text[1:2].islower() else text


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    """One value of a family on a GPU: the family and this series' own label values."""

    family: Family
    labels: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        inner = ",".join(f'{name}="{value}"' for name, value in self.labels)
        return f"{self.family.name}{{{inner}}}" if inner else self.family.name
