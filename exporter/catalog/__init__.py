"""The GPU catalog: datasheet facts per GPU model, MIG profiles and prices.

This is the one module that reads `gpus.yaml` (or a user's catalog, `--catalog.file`); everything
else asks it. Models are found by the name NVML reports (`NVIDIA H100 80GB HBM3`) or by catalog key
(`h100-sxm`).

A user's catalog has the same format and is laid over the built-in one (`catalog_from_file`): an
entry whose `key` is a built-in model replaces only the fields it names (say, its `prices`); an
entry with a new key adds a model and must be complete; `default_price` and `source_date` replace
the built-in ones. `extend_builtin: false` makes the user's file the whole catalog.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml

if TYPE_CHECKING:
    from pathlib import Path

CATALOG_VERSION: Final = 1
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
    source_date: str = ""
    """When the price was read off the provider's list (the catalog's `source_date` unless given)."""


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


_TOP_LEVEL_FIELDS: Final = frozenset({"version", "source_date", "default_price", "models"})
_MODEL_FIELDS: Final = frozenset(
    {
        "key",
        "name",
        "nvml_names",
        "architecture",
        "memory_gib",
        "nvml_memory_mib",
        "memory_bandwidth_gbps",
        "tdp_watts",
        "idle_watts",
        "fans",
        "max_clocks_mhz",
        "peak_tflops",
        "mig",
        "prices",
    }
)
_MIG_FIELDS: Final = frozenset(
    {"profile", "compute_slices", "memory_slices", "memory_gib", "max_instances", "sms"}
)
_PRICE_FIELDS: Final = frozenset({"provider", "region", "instance", "usd_per_hour", "source_date"})


@cache
def builtin_catalog() -> Catalog:
    return parse_catalog(_builtin_document(), source="built-in catalog")


@cache
def _builtin_document() -> Mapping[str, Any]:
    text = resources.files(__package__).joinpath("gpus.yaml").read_text(encoding="utf-8")
    document: Mapping[str, Any] = yaml.safe_load(text)
    return document


def _read_document(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise CatalogError(f"{path}: cannot read catalog: {reason}") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "syntax error"
        raise CatalogError(
            f"{path}: cannot read catalog: not valid YAML{line}: {problem}"
        ) from error


def load_catalog(path: Path) -> Catalog:
    """A catalog file on its own, without the built-in models."""
    return parse_catalog(_read_document(path), source=str(path))


def catalog_from_file(path: Path | None) -> Catalog:
    """The catalog in force: the built-in one, with the user's file (if any) laid over it."""
    if path is None:
        return builtin_catalog()
    user = _read_document(path)
    if not isinstance(user, Mapping):
        raise CatalogError(f"{path}: expected a mapping with a `models` list")
    extend = user.get("extend_builtin", True)
    if not isinstance(extend, bool):
        raise CatalogError(f"{path}: extend_builtin must be true or false")
    if not extend:
        return parse_catalog(
            {k: v for k, v in user.items() if k != "extend_builtin"}, source=str(path)
        )
    return parse_catalog(
        merge_catalog_documents(_builtin_document(), user, source=str(path)), source=str(path)
    )


def merge_catalog_documents(
    base: Mapping[str, Any], user: Mapping[str, Any], *, source: str
) -> dict[str, Any]:
    """`user` laid over `base`: models matched by key, fields of a matched model replaced."""
    unknown = set(user) - {*_TOP_LEVEL_FIELDS, "extend_builtin"}
    if unknown:
        raise CatalogError(f"{source}: unknown field(s) {sorted(map(str, unknown))}")
    user_models = user.get("models", [])
    if not isinstance(user_models, list):
        raise CatalogError(f"{source}: `models` must be a list")
    merged_models = [_dated(model, base.get("source_date")) for model in base["models"]]
    by_key = {model["key"]: model for model in merged_models}
    for position, entry in enumerate(user_models):
        if not isinstance(entry, Mapping) or "key" not in entry:
            raise CatalogError(f"{source}: models[{position}]: each model needs a `key`")
        existing = by_key.get(str(entry["key"]))
        if existing is None:
            added = dict(entry)
            merged_models.append(added)
            by_key[str(entry["key"])] = added
        else:
            existing.update(entry)
    merged = {key: value for key, value in base.items() if key != "models"}
    merged.update(
        {key: value for key, value in user.items() if key not in {"models", "extend_builtin"}}
    )
    merged["models"] = merged_models
    return merged


def _dated(model: Mapping[str, Any], source_date: object) -> dict[str, Any]:
    """A copy of a model whose prices carry their catalog's date: the user's own `source_date`
    must not re-date the built-in prices."""
    copied = dict(model)
    if source_date is not None and isinstance(copied.get("prices"), list):
        copied["prices"] = [
            {"source_date": source_date, **price} if isinstance(price, Mapping) else price
            for price in copied["prices"]
        ]
    return copied


def parse_catalog(document: object, *, source: str) -> Catalog:
    if not isinstance(document, Mapping) or not isinstance(document.get("models"), list):
        raise CatalogError(f"{source}: expected a mapping with a `models` list")
    unknown = set(document) - _TOP_LEVEL_FIELDS
    if unknown:
        raise CatalogError(f"{source}: unknown field(s) {sorted(map(str, unknown))}")
    version = document.get("version", CATALOG_VERSION)
    if version != CATALOG_VERSION:
        raise CatalogError(f"{source}: version {version!r} is not {CATALOG_VERSION}")
    source_date = str(document.get("source_date", ""))
    models = []
    keys: set[str] = set()
    for position, entry in enumerate(document["models"]):
        key = entry.get("key") if isinstance(entry, Mapping) else None
        where = f"{source}: models[{position}]" + (f" ({key})" if key is not None else "")
        try:
            model = _parse_model(entry, source_date)
        except (KeyError, TypeError, ValueError) as error:
            raise CatalogError(f"{where}: {_describe(error)}") from error
        if model.key in keys:
            raise CatalogError(f"{where}: duplicate key {model.key!r}")
        keys.add(model.key)
        models.append(model)
    default = document.get("default_price") or {}
    if not isinstance(default, Mapping) or set(default) - {"provider", "region"}:
        raise CatalogError(f"{source}: default_price must be a mapping of provider and region")
    return Catalog(
        source_date=source_date,
        models=tuple(models),
        default_provider=str(default.get("provider", "aws")),
        default_region=str(default.get("region", "us-east-1")),
    )


def _describe(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    return str(error)


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{what} must be a finite number, not negative")
    return number


def _only(entry: Mapping[Any, Any], known: frozenset[str], what: str) -> None:
    unknown = set(entry) - known
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(map(str, unknown))} in {what}")


def _parse_model(entry: Any, source_date: str) -> GpuModel:
    if not isinstance(entry, Mapping):
        raise TypeError("each model must be a mapping")
    _only(entry, _MODEL_FIELDS, "the model")
    for mig in entry.get("mig") or ():
        _only(mig, _MIG_FIELDS, "a MIG profile")
    for price in entry.get("prices") or ():
        _only(price, _PRICE_FIELDS, "a price")
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
                source_date=str(price.get("source_date", source_date)),
            )
            for price in entry.get("prices") or ()
        ),
    )
