"""What GPUs exist, what each costs and what each really achieves, as the strategy sees them.

`Hardware` joins three sources: the catalog (datasheet peaks, MIG profiles), a price book (the
catalog's on-demand prices, overridden by a YAML price file) and the calibrated ceilings found
in Prometheus (`gpu_calibrated_flops{dtype}`, `gpu_calibrated_memory_bandwidth_bytes_per_second`),
which win over the datasheet wherever they exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter import documents
from exporter.catalog import MIG_COMPUTE_SLICES

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from exporter.catalog import Catalog, GpuModel, MigProfile
    from exporter.rightsize.history import Ceilings

HOURS_PER_MONTH: Final = 730.0
"""24 x 365 / 12: the month cloud price sheets use."""
DTYPE_FALLBACKS: Final[Mapping[str, tuple[str, ...]]] = {
    "fp64": ("fp64",),
    "fp32": ("fp32",),
    "tf32": ("tf32", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp8": ("fp8", "int8", "bf16", "fp16"),
    "int8": ("int8", "fp8"),
}
"""When a model has no figure for the chosen precision, the nearest one both models share."""
PRICE_FILE_LIMIT: Final = 256 * 1024
"""A price per GPU model: the catalog has a few dozen, a price file a few KiB."""


class PriceFileError(ValueError):
    """A price file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a workload's GPU: a whole GPU, a MIG instance, or a time-sliced share."""

    model: GpuModel
    mig_profile: MigProfile | None = None
    shared_by: int = 1
    """Holders of a time-sliced GPU (1 when exclusive)."""

    @property
    def compute(self) -> float:
        """Fraction of the whole GPU's compute this option offers."""
        if self.mig_profile is None:
            return 1.0
        return mig_compute_fraction(self.model, self.mig_profile)

    @property
    def memory_bytes(self) -> int:
        """Memory a workload can use on it (MIG: the profile's usable memory, not its name)."""
        if self.mig_profile is None:
            return self.model.nvml_memory_bytes
        return self.mig_profile.memory_bytes

    @property
    def share(self) -> float:
        """Fraction of the GPU's price it costs: a MIG instance blocks its compute and memory
        slices, whichever is the larger part of the GPU; a time-sliced GPU splits evenly."""
        part = 1.0 if self.mig_profile is None else self.mig_profile.gpu_share
        return part / self.shared_by

    @property
    def label(self) -> str:
        text = self.model.name
        if self.mig_profile is not None:
            text += f" MIG {self.mig_profile.profile}"
        if self.shared_by > 1:
            text += f" (shared by {self.shared_by})"
        return text

    def same_slot(self, other: Option) -> bool:
        return self.model.key == other.model.key and self.mig_profile == other.mig_profile


def mig_compute_fraction(model: GpuModel, profile: MigProfile) -> float:
    """SMs of the profile over the SMs of the full-GPU profile when the catalog knows them
    (a 1g.10gb on an H100 has 16 of 132 SMs, less than 1/7), else compute slices over 7."""
    largest = max(model.mig_profiles, key=lambda p: p.compute_slices)
    if profile.sms is not None and largest.sms:
        return profile.sms / largest.sms
    return profile.compute_slices / MIG_COMPUTE_SLICES


@dataclass(frozen=True, slots=True)
class Ceiling:
    value: float
    source: str
    """`calibrated` or `datasheet`."""


@dataclass(frozen=True, slots=True)
class Hardware:
    catalog: Catalog
    prices: Mapping[str, float]
    """Catalog key -> USD per GPU-hour."""
    ceilings_flops: Mapping[tuple[str, str], float]
    """(NVML model name, dtype) -> calibrated FLOP/s."""
    ceilings_bandwidth: Mapping[str, float]
    seen: tuple[str, ...] = ()
    """Models the cluster already has (from the history), for `--models seen`."""

    @classmethod
    def build(
        cls,
        catalog: Catalog,
        ceilings: Ceilings,
        price_overrides: Mapping[str, float] | None = None,
        *,
        seen: Iterable[str] = (),
    ) -> Hardware:
        prices = {}
        for model in catalog.models:
            price = catalog.price(model)
            if price is not None:
                prices[model.key] = price.usd_per_hour
        prices.update(price_overrides or {})
        return cls(
            catalog,
            prices,
            dict(ceilings.flops),
            dict(ceilings.memory_bandwidth),
            tuple(sorted(set(seen))),
        )

    def model(self, name: str) -> GpuModel | None:
        return self.catalog.find(name)

    def price(self, model: GpuModel) -> float | None:
        return self.prices.get(model.key)

    def flops(self, model: GpuModel, dtype: str) -> Ceiling | None:
        for name in model.nvml_names:
            measured = self.ceilings_flops.get((name, dtype))
            if measured:
                return Ceiling(measured, "calibrated")
        peak = model.peak_flops.get(dtype)
        return Ceiling(peak, "datasheet") if peak else None

    def bandwidth(self, model: GpuModel) -> Ceiling:
        for name in model.nvml_names:
            measured = self.ceilings_bandwidth.get(name)
            if measured:
                return Ceiling(measured, "calibrated")
        return Ceiling(model.memory_bandwidth_bytes_per_second, "datasheet")

    def compute_dtype(self, first: GpuModel, second: GpuModel, dtype: str) -> str | None:
        """The precision closest to `dtype` with a ceiling on both models."""
        for candidate in DTYPE_FALLBACKS[dtype]:
            if self.flops(first, candidate) and self.flops(second, candidate):
                return candidate
        return None

    def scale(
        self, source: GpuModel, target: GpuModel, dtype: str, side: str | None
    ) -> float | None:
        """How many `target` GPUs one `source` GPU's worth of work needs.

        The roofline side decides which ceiling scales: FLOP/s for compute-bound work, bytes/s
        for memory-bound work; unknown side takes the larger (the safer) of the two.
        None when the two models share no precision with a known ceiling.
        """
        if source.key == target.key:
            return 1.0
        bandwidth = self.bandwidth(source).value / self.bandwidth(target).value
        if side == "memory":
            return bandwidth
        common = self.compute_dtype(source, target, dtype)
        if common is None:
            return None
        source_flops, target_flops = self.flops(source, common), self.flops(target, common)
        if source_flops is None or target_flops is None:  # compute_dtype found both
            return None
        compute = source_flops.value / target_flops.value
        return compute if side == "compute" else max(compute, bandwidth)

    def options(self, model: GpuModel, *, allow_mig: bool) -> list[Option]:
        options = [Option(model)]
        if allow_mig:
            options.extend(Option(model, profile) for profile in model.mig_profiles)
        return options

    def target_models(self, wanted: Iterable[str]) -> list[GpuModel]:
        """Models a workload may move to: every priced model (`all`), the models already in the
        cluster (`seen`), or the listed ones."""
        names = list(wanted)
        if names in ([], ["all"]):
            return [model for model in self.catalog.models if model.key in self.prices]
        if names == ["seen"]:
            names = list(self.seen)
        found = {m.key: m for name in names if (m := self.model(name)) is not None}
        return list(found.values())


def load_price_file(path: Path, catalog: Catalog) -> dict[str, float]:
    """A YAML file `prices: {MODEL: USD_PER_GPU_HOUR}`, models by catalog key or NVML name; read
    bounded and strict (`exporter.documents`), anything wrong a `PriceFileError` of one line
    naming the file and the entry."""

    def prices_in(document: object) -> dict[str, float]:
        top = documents.mapping(document, "", required=("prices",), optional=())
        prices: dict[str, float] = {}
        for name, value in documents.mapping(top["prices"], "prices").items():
            where = documents.join("prices", name)
            model = catalog.find(name)
            if model is None:
                raise documents.Invalid(where, "no such GPU model in the catalog")
            prices[model.key] = documents.number(value, where, low=0, unit="USD per GPU-hour")
        return prices

    return documents.load_file(path, prices_in, PriceFileError, limit=PRICE_FILE_LIMIT)
