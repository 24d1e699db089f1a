"""The GPU catalog: datasheet facts per GPU model, MIG profiles and prices.

This is the one module that reads `gpus.yaml` (or a user's replacement); everything else asks it.
Models are found by the name NVML reports (`NVIDIA H100 80GB HBM3`) or by catalog key (`h100-sxm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml

if TYPE_CHECKING:
    from pathlib import Path

GIB: Final = 1024**3
MIB: Final = 1024**2
DTYPES: Final = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
"""Precisions with a peak figure; int8 is in TOP/s, the rest in TFLOP/s."""


class CatalogError(ValueError):
    """A catalog file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    profile: str
    """NVIDIA's name, e.g. `3g.40gb`."""
    compute_slices: int
    """Sevenths of the GPU's compute."""
    memory_slices: int
    """Eighths of the GPU's memory."""
    memory_bytes: int
    """Usable memory, which is less than the name says."""
    max_instances: int
    sms: int | None = None


@dataclass(frozen=True, slots=True)
class Price:
    provider: str
    region: str
    instance: str
    usd_per_hour: float


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str
    nvml_names: tuple[str, ...]
    architecture: str
    memory_bytes: int
    nvml_memory_bytes: int
    memory_bandwidth_bytes_per_second: float
    tdp_watts: float
    idle_watts: float
    max_clocks_hz: Mapping[str, float]
    """Keys `sm`, `memory`, `graphics`."""
    peak_flops: Mapping[str, float]
    """Per dtype of `DTYPES`, in operations per second (dense)."""
    fans: int = 0
    mig_profiles: tuple[MigProfile, ...] = ()
    prices: tuple[Price, ...] = ()

    @property
    def supports_gpm(self) -> bool:
        """GPU Performance Monitoring (SM/tensor/DRAM activity without DCGM): Hopper and newer."""
        return self.architecture in {"hopper", "blackwell"}

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.profile == name), None)


@dataclass(frozen=True, slots=True)
class Catalog:
    source_date: str
    models: tuple[GpuModel, ...]
    default_provider: str
    default_region: str

    def by_key(self, key: str) -> GpuModel | None:
        return next((model for model in self.models if model.key == key), None)

    def by_nvml_name(self, nvml_name: str) -> GpuModel | None:
        return next((model for model in self.models if nvml_name in model.nvml_names), None)

    def find(self, name: str) -> GpuModel | None:
        """A model by catalog key, NVML name or display name, case-insensitively."""
        wanted = name.strip().lower()
        for model in self.models:
            names = {model.key, model.name, *model.nvml_names}
            if wanted in {candidate.lower() for candidate in names}:
                return model
        return None

    def price(self, model: GpuModel) -> Price | None:
        """The default provider's on-demand price for one GPU of this model, else the first."""
        for price in model.prices:
            if (price.provider, price.region) == (self.default_provider, self.default_region):
                return price
        return model.prices[0] if model.prices else None


@cache
def builtin_catalog() -> Catalog:
    text = resources.files(__package__).joinpath("gpus.yaml").read_text(encoding="utf-8")
    return parse_catalog(yaml.safe_load(text), source="built-in catalog")


def load_catalog(path: Path) -> Catalog:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise CatalogError(f"{path}: cannot read catalog: {error}") from error
    return parse_catalog(document, source=str(path))


def parse_catalog(document: object, *, source: str) -> Catalog:
    if not isinstance(document, Mapping) or not isinstance(document.get("models"), list):
        raise CatalogError(f"{source}: expected a mapping with a `models` list")
    models = []
    keys: set[str] = set()
    for position, entry in enumerate(document["models"]):
        where = f"{source}: models[{position}]"
        try:
            model = _parse_model(entry)
        except (KeyError, TypeError, ValueError) as error:
            raise CatalogError(f"{where}: {_describe(error)}") from error
        if model.key in keys:
            raise CatalogError(f"{where}: duplicate key {model.key!r}")
        keys.add(model.key)
        models.append(model)
    default = document.get("default_price") or {}
    return Catalog(
        source_date=str(document.get("source_date", "")),
        models=tuple(models),
        default_provider=str(default.get("provider", "aws")),
        default_region=str(default.get("region", "us-east-1")),
    )


def _describe(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    return str(error)


def _positive(value: Any, what: str) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(f"{what} must not be negative")
    return number


def _parse_model(entry: Any) -> GpuModel:
    if not isinstance(entry, Mapping):
        raise TypeError("each model must be a mapping")
    peaks = entry.get("peak_tflops") or {}
    unknown = set(peaks) - set(DTYPES)
    if unknown:
        raise ValueError(f"unknown dtype(s) {sorted(unknown)} in peak_tflops")
    clocks = entry.get("max_clocks_mhz") or {}
    return GpuModel(
        key=str(entry["key"]),
        name=str(entry["name"]),
        nvml_names=tuple(str(name) for name in entry["nvml_names"]),
        architecture=str(entry["architecture"]),
        memory_bytes=round(_positive(entry["memory_gib"], "memory_gib") * GIB),
        nvml_memory_bytes=round(
            _positive(entry.get("nvml_memory_mib", entry["memory_gib"] * 1024), "nvml_memory_mib")
            * MIB
        ),
        memory_bandwidth_bytes_per_second=_positive(entry["memory_bandwidth_gbps"], "bandwidth")
        * 1e9,
        tdp_watts=_positive(entry["tdp_watts"], "tdp_watts"),
        idle_watts=_positive(entry.get("idle_watts", entry["tdp_watts"] * 0.1), "idle_watts"),
        max_clocks_hz={name: _positive(mhz, name) * 1e6 for name, mhz in clocks.items()},
        peak_flops={dtype: _positive(tflops, dtype) * 1e12 for dtype, tflops in peaks.items()},
        fans=int(entry.get("fans", 0)),
        mig_profiles=tuple(
            MigProfile(
                profile=str(mig["profile"]),
                compute_slices=int(mig["compute_slices"]),
                memory_slices=int(mig["memory_slices"]),
                memory_bytes=round(_positive(mig["memory_gib"], "memory_gib") * GIB),
                max_instances=int(mig["max_instances"]),
                sms=int(mig["sms"]) if "sms" in mig else None,
            )
            for mig in entry.get("mig") or ()
        ),
        prices=tuple(
            Price(
                provider=str(price["provider"]),
                region=str(price["region"]),
                instance=str(price.get("instance", "")),
                usd_per_hour=_positive(price["usd_per_hour"], "usd_per_hour"),
            )
            for price in entry.get("prices") or ()
        ),
    )
