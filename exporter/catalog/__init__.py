"""The GPU catalog: datasheet facts per GPU model, MIG profiles and prices.

This is the one module that reads `gpus.yaml` (or a user's catalog, `--catalog.file`); everything
else asks it. Models are found by the name NVML reports (`NVIDIA H100 80GB HBM3`) or by catalog key
(`h100-sxm`).

A user's catalog has the same format and is laid over the built-in one (`catalog_from_file`): an
entry whose `key` is a built-in model replaces only the fields it names (say, its `prices`); an
entry with a new key adds a model and must be complete; `default_price` and `source_date` replace
the built-in ones. `extend_builtin: false` makes the user's file the whole catalog.
`carbon_intensity_grams_per_kwh` (top level, optional) is the grid's carbon intensity of the
cluster the catalog is deployed to; `--carbon.intensity` overrides it.

Both files are read through `exporter.documents` (bounded, strict, one line per error) and checked
with its checks; a bad one raises `CatalogError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from exporter import documents
from exporter.documents import Invalid, join, quote
from exporter.settings import MAX_CARBON_INTENSITY

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

CATALOG_VERSION: Final = 1
GIB: Final = 1024**3
MIB: Final = 1024**2
DTYPES: Final = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
"""Precisions with a peak figure; int8 is in TOP/s, the rest in TFLOP/s."""
ARCHITECTURES: Final = (
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
)
"""NVIDIA's GPU architectures, oldest first: what a model's `architecture` may be."""


class CatalogError(ValueError):
    """A catalog that cannot be used. `str()` is one line: the file, the key path
    (`models[2].memory_gib`) and what was wrong."""


MIG_COMPUTE_SLICES: Final = 7
"""A MIG-capable GPU's compute, in slices."""
MIG_MEMORY_SLICES: Final = 8
"""A MIG-capable GPU's memory, in slices."""


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

    @property
    def gpu_share(self) -> float:
        """The part of its GPU an instance blocks, and so of the GPU's price: the larger of its
        compute and memory parts (no other instance can use either)."""
        return max(self.compute_slices / MIG_COMPUTE_SLICES, self.memory_slices / MIG_MEMORY_SLICES)


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
    carbon_intensity: float | None = None
    """The grid's carbon intensity where the cluster runs, gCO2e/kWh; None when not given."""

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


_TOP_FIELDS: Final = (
    "version",
    "source_date",
    "default_price",
    "models",
    "carbon_intensity_grams_per_kwh",
)
_MODEL_REQUIRED: Final = (
    "key",
    "name",
    "nvml_names",
    "architecture",
    "memory_gib",
    "memory_bandwidth_gbps",
    "tdp_watts",
)
_MODEL_FIELDS: Final = (
    *_MODEL_REQUIRED,
    "nvml_memory_mib",
    "idle_watts",
    "fans",
    "max_clocks_mhz",
    "peak_tflops",
    "mig",
    "prices",
)
_CLOCKS: Final = ("sm", "memory", "graphics")
_MIG_REQUIRED: Final = ("profile", "compute_slices", "memory_slices", "memory_gib", "max_instances")
_PRICE_REQUIRED: Final = ("provider", "region", "usd_per_hour")
_KEY: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,62}[a-z0-9])?")
MAX_MODELS: Final = 1000
BUILTIN: Final = "built-in catalog"

_Entry = tuple[str, dict[str, Any], str]
"""A model's fields as written, where they were written, and its prices' default date."""


def builtin_catalog() -> Catalog:
    return _builtin()[1]


@cache
def _builtin() -> tuple[dict[str, Any], Catalog]:
    """`gpus.yaml` as written (a user's catalog is laid over it) and as a checked `Catalog`."""
    data = resources.files(__package__).joinpath("gpus.yaml").read_bytes()

    def both(document: object) -> tuple[dict[str, Any], Catalog]:
        return documents.mapping(document, ""), _whole(document)

    return documents.load_text(data, both, CatalogError, source=BUILTIN)


def load_catalog(path: Path) -> Catalog:
    """A catalog file on its own, without the built-in models."""
    return documents.load_file(path, _whole, CatalogError)


def catalog_from_file(path: Path | None) -> Catalog:
    """The catalog in force: the built-in one, with the user's file (if any) laid over it."""
    if path is None:
        return builtin_catalog()
    return documents.load_file(path, _over_builtin, CatalogError)


def _whole(document: object) -> Catalog:
    top = documents.mapping(document, "", required=("models",), optional=_TOP_FIELDS)
    date = _date(top.get("source_date", ""), "source_date")
    return _catalog(top, [(where, fields, date) for where, fields in _entries(top["models"])])


def _over_builtin(document: object) -> Catalog:
    """A user's catalog laid over the built-in one: a model whose key is built in has the fields
    the user names replaced; a new key adds a model, which must then be complete."""
    top = documents.mapping(document, "", optional=(*_TOP_FIELDS, "extend_builtin"))
    if not documents.boolean(top.pop("extend_builtin", True), "extend_builtin"):
        return _whole(top)
    base = _builtin()[0]
    base_date = _date(base.get("source_date", ""), "source_date")
    merged = {**base, **top}
    date = _date(merged.get("source_date", ""), "source_date")
    models: dict[str, _Entry] = {
        fields["key"]: (where, fields, base_date) for where, fields in _entries(base["models"])
    }
    for where, fields in _entries(top.get("models", [])):
        known = models.get(fields["key"])
        if known is None:
            models[fields["key"]] = (where, fields, date)
        else:
            # the built-in prices keep their own date unless the user replaces them
            own_date = date if "prices" in fields else known[2]
            models[fields["key"]] = (where, {**known[1], **fields}, own_date)
    return _catalog(merged, list(models.values()))


def _entries(value: object) -> list[tuple[str, dict[str, Any]]]:
    """The `models` list: each a mapping of known fields with a `key` given once in the list."""
    seen: dict[str, str] = {}
    entries = []
    for index, entry in enumerate(documents.sequence(value, "models", max_items=MAX_MODELS)):
        where = join("models", index)
        fields = documents.mapping(entry, where, required=("key",), optional=_MODEL_FIELDS)
        key = documents.text(
            fields["key"],
            join(where, "key"),
            max_length=64,
            pattern=_KEY,
            describe="a catalog key (lower-case letters, digits, - and .)",
        )
        if key in seen:
            raise Invalid(join(where, "key"), f"{quote(key)} is already the key of {seen[key]}")
        seen[key] = where
        entries.append((where, fields))
    return entries


def _catalog(top: dict[str, Any], models: list[_Entry]) -> Catalog:
    version = top.get("version", CATALOG_VERSION)
    if isinstance(version, bool) or version != CATALOG_VERSION:
        raise Invalid(
            "version", f"{quote(version)} is not {CATALOG_VERSION}, the version this gpuscope reads"
        )
    default = documents.mapping(
        top.get("default_price"),
        "default_price",
        optional=("provider", "region"),
        null_is_empty=True,
    )
    return Catalog(
        source_date=_date(top.get("source_date", ""), "source_date"),
        models=tuple(_model(fields, where, date) for where, fields, date in models),
        default_provider=documents.text(
            default.get("provider", "aws"), "default_price.provider", max_length=64
        ),
        default_region=documents.text(
            default.get("region", "us-east-1"), "default_price.region", max_length=64
        ),
        carbon_intensity=_carbon(top.get("carbon_intensity_grams_per_kwh")),
    )


def _carbon(value: object) -> float | None:
    if value is None:
        return None
    return documents.number(
        value,
        "carbon_intensity_grams_per_kwh",
        low=0.0,
        high=MAX_CARBON_INTENSITY,
        unit="gCO2e/kWh",
    )


def _date(value: object, path: str) -> str:
    """When figures were read: text such as `2026-06`, or a YAML date (`2026-06-01`)."""
    if isinstance(value, date):
        return value.isoformat()
    return documents.text(value, path, max_length=32, allow_empty=True)


def _listed(value: object, path: str) -> list[Any]:
    """An optional list: absent or null is empty."""
    return documents.sequence([] if value is None else value, path, max_items=64)


def _model(fields: dict[str, Any], where: str, price_date: str) -> GpuModel:
    documents.mapping(fields, where, required=_MODEL_REQUIRED, optional=_MODEL_FIELDS)

    def at(name: str) -> str:
        return join(where, name)

    memory_gib = documents.number(fields["memory_gib"], at("memory_gib"), positive=True)
    tdp = documents.number(fields["tdp_watts"], at("tdp_watts"), positive=True)
    nvml_mib = fields.get("nvml_memory_mib", memory_gib * 1024)
    clocks = documents.mapping(
        fields.get("max_clocks_mhz"), at("max_clocks_mhz"), optional=_CLOCKS, null_is_empty=True
    )
    peaks = documents.mapping(
        fields.get("peak_tflops"), at("peak_tflops"), optional=DTYPES, null_is_empty=True
    )
    names = documents.sequence(fields["nvml_names"], at("nvml_names"), max_items=32, min_items=1)
    return GpuModel(
        key=fields["key"],
        name=documents.text(fields["name"], at("name")),
        nvml_names=documents.strings(names, at("nvml_names")),
        architecture=documents.choice(fields["architecture"], at("architecture"), ARCHITECTURES),
        memory_bytes=round(memory_gib * GIB),
        nvml_memory_bytes=round(
            documents.number(nvml_mib, at("nvml_memory_mib"), positive=True) * MIB
        ),
        memory_bandwidth_bytes_per_second=documents.number(
            fields["memory_bandwidth_gbps"], at("memory_bandwidth_gbps"), positive=True
        )
        * 1e9,
        tdp_watts=tdp,
        idle_watts=documents.number(fields.get("idle_watts", tdp * 0.1), at("idle_watts"), low=0),
        max_clocks_hz={
            name: documents.number(mhz, join(at("max_clocks_mhz"), name), positive=True) * 1e6
            for name, mhz in clocks.items()
        },
        peak_flops={
            dtype: documents.number(tflops, join(at("peak_tflops"), dtype), low=0) * 1e12
            for dtype, tflops in peaks.items()
        },
        fans=documents.integer(fields.get("fans", 0), at("fans"), low=0, high=64),
        mig_profiles=tuple(
            _mig(entry, join(at("mig"), index))
            for index, entry in enumerate(_listed(fields.get("mig"), at("mig")))
        ),
        prices=tuple(
            _price(entry, join(at("prices"), index), price_date)
            for index, entry in enumerate(_listed(fields.get("prices"), at("prices")))
        ),
    )


def _mig(value: object, where: str) -> MigProfile:
    fields = documents.mapping(value, where, required=_MIG_REQUIRED, optional=("sms",))
    sms = fields.get("sms")
    return MigProfile(
        profile=documents.text(fields["profile"], join(where, "profile"), max_length=32),
        compute_slices=documents.integer(
            fields["compute_slices"], join(where, "compute_slices"), low=1, high=7
        ),
        memory_slices=documents.integer(
            fields["memory_slices"], join(where, "memory_slices"), low=1, high=8
        ),
        memory_bytes=round(
            documents.number(fields["memory_gib"], join(where, "memory_gib"), positive=True) * GIB
        ),
        max_instances=documents.integer(
            fields["max_instances"], join(where, "max_instances"), low=1, high=7
        ),
        sms=None if sms is None else documents.integer(sms, join(where, "sms"), low=1),
    )


def _price(value: object, where: str, default_date: str) -> Price:
    fields = documents.mapping(
        value, where, required=_PRICE_REQUIRED, optional=("instance", "source_date")
    )
    return Price(
        provider=documents.text(fields["provider"], join(where, "provider"), max_length=64),
        region=documents.text(fields["region"], join(where, "region"), max_length=64),
        instance=documents.text(
            fields.get("instance", ""), join(where, "instance"), max_length=64, allow_empty=True
        ),
        usd_per_hour=documents.number(fields["usd_per_hour"], join(where, "usd_per_hour"), low=0),
        source_date=_date(fields.get("source_date", default_date), join(where, "source_date")),
    )
