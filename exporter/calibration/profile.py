"""The calibration profile: one versioned document per GPU model, in JSON or YAML.

`gpuscope calibrate` writes one; the daemon reads them. This module is the schema: the
dataclasses and the document form (`profile_document`, `dump_profile`). Reading and checking a
document is `exporter.calibration.parse` (`parse_profile`, `parse_profile_text`, `load_profile`),
which takes *any* input and either returns a `Profile` or raises `ProfileError`, never anything
else.

The document (version 1):

    kind: gpuscope/calibration-profile
    version: 1
    model: NVIDIA H100 80GB HBM3        # the name NVML (and torch) report; `cpu` runs name the CPU
    catalog_key: h100-sxm               # the catalog model it matched, or null
    device: cuda                        # cuda | cpu
    measured_at: "2026-11-22T02:30:00Z"
    quick: false
    duration_seconds: 74.2
    software: {gpuscope: 0.1.0, torch: 2.13.0, python: 3.11.7, cuda: "12.8", driver: 570.133.20}
    method: {timer: cuda_events, warmup_seconds: 1.0, trials: 7, unstable_spread: 0.1}
    conditions:                         # NVML readings around the run, or {skipped: reason}
      before: {temperature_celsius: 41, sm_clock_hertz: 1.98e9, memory_clock_hertz: 2.619e9,
               power_watts: 80.5, clock_event_reasons: [gpu_idle]}
      after: {...}
    matmul:                             # every dtype: a figure, or {skipped: reason}
      bf16: {value: 7.9e14, unit: FLOP/s, min: 7.8e14, max: 7.95e14, spread: 0.019, trials: 7,
             unstable: false, size: 8192x8192x8192, datasheet: 9.894e14, achieved_ratio: 0.798}
      int8: {...unit: OP/s...}
    memory_bandwidth: {copy: <figure, B/s>, read: <figure, B/s>}
    host_to_device: <figure, B/s>
    device_to_host: <figure, B/s>
    launch_latency: {eager: <figure, s>, cuda_graph: <figure, s>}

`value` is the median over trials, `min`/`max` the extremes, `spread` = (max - min) / value, and
`unstable` says the spread exceeded the method's bound. `spread` and `achieved_ratio` are written
for people and recomputed on reading.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import yaml

from exporter.catalog import DTYPES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.documents import Format

PROFILE_KIND: Final = "gpuscope/calibration-profile"
PROFILE_VERSION: Final = 1

FLOPS_UNIT: Final = "FLOP/s"
OPS_UNIT: Final = "OP/s"
"""int8 matmul counts integer operations."""
BYTES_UNIT: Final = "B/s"
SECONDS_UNIT: Final = "s"
TIMERS: Final = ("cuda_events", "monotonic_clock")
DEVICES: Final = ("cuda", "cpu")


class ProfileError(ValueError):
    """A profile that cannot be used. `str()` is one line naming the source and the field."""


def matmul_unit(dtype: str) -> str:
    return OPS_UNIT if dtype == "int8" else FLOPS_UNIT


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured quantity: the median over trials, with the extremes and the datasheet."""

    value: float
    unit: str
    minimum: float
    maximum: float
    trials: int
    unstable: bool
    size: str = ""
    """What was measured, e.g. `8192x8192x8192` or `1.0 GiB`."""
    datasheet: float | None = None

    @property
    def spread(self) -> float:
        return (self.maximum - self.minimum) / self.value

    @property
    def achieved_ratio(self) -> float | None:
        return self.value / self.datasheet if self.datasheet else None


@dataclass(frozen=True, slots=True)
class Skipped:
    """A quantity not measured on this device, and why."""

    reason: str


Result = Figure | Skipped


@dataclass(frozen=True, slots=True)
class Reading:
    """The device's state at one moment (NVML), each value None when it could not be read."""

    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    power_watts: float | None = None
    clock_event_reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Conditions:
    before: Reading
    after: Reading


@dataclass(frozen=True, slots=True)
class Software:
    gpuscope: str
    torch: str
    python: str
    cuda: str | None = None
    driver: str | None = None


@dataclass(frozen=True, slots=True)
class Method:
    timer: str
    warmup_seconds: float
    trials: int
    unstable_spread: float
    """A figure whose spread exceeds this is marked unstable."""


@dataclass(frozen=True, slots=True)
class Profile:
    model: str
    device: str
    measured_at: str
    quick: bool
    duration_seconds: float
    software: Software
    method: Method
    conditions: Conditions | Skipped
    matmul: Mapping[str, Result]
    """Per dtype of `DTYPES`, every one present."""
    memory_copy: Result
    memory_read: Result
    host_to_device: Result
    device_to_host: Result
    launch_eager: Result
    launch_cuda_graph: Result
    catalog_key: str | None = None

    @property
    def calibrated_flops(self) -> dict[str, float]:
        return {
            dtype: result.value
            for dtype, result in self.matmul.items()
            if isinstance(result, Figure)
        }

    @property
    def memory_bandwidth(self) -> float | None:
        """The better of the streaming copy and the read-only reduction."""
        rates = [r.value for r in (self.memory_copy, self.memory_read) if isinstance(r, Figure)]
        return max(rates) if rates else None

    @property
    def figures(self) -> dict[str, Result]:
        """Every result by a flat name (`matmul_bf16`, `memory_copy`, ...), in document order."""
        return {
            **{f"matmul_{dtype}": result for dtype, result in self.matmul.items()},
            "memory_copy": self.memory_copy,
            "memory_read": self.memory_read,
            "host_to_device": self.host_to_device,
            "device_to_host": self.device_to_host,
            "launch_eager": self.launch_eager,
            "launch_cuda_graph": self.launch_cuda_graph,
        }


def configmap_key(model: str) -> str:
    """The ConfigMap key (and file name) of a model's profile: `nvidia-h100-80gb-hbm3.json`."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"{slug or 'unknown'}.json"


# -- document form ----------------------------------------------------------------------------


def _result_document(result: Result) -> dict[str, Any]:
    if isinstance(result, Skipped):
        return {"skipped": result.reason}
    return {
        "value": result.value,
        "unit": result.unit,
        "min": result.minimum,
        "max": result.maximum,
        "spread": result.spread,
        "trials": result.trials,
        "unstable": result.unstable,
        "size": result.size,
        "datasheet": result.datasheet,
        "achieved_ratio": result.achieved_ratio,
    }


def _reading_document(reading: Reading) -> dict[str, Any]:
    return {
        "temperature_celsius": reading.temperature_celsius,
        "sm_clock_hertz": reading.sm_clock_hertz,
        "memory_clock_hertz": reading.memory_clock_hertz,
        "power_watts": reading.power_watts,
        "clock_event_reasons": list(reading.clock_event_reasons),
    }


def profile_document(profile: Profile) -> dict[str, Any]:
    """The profile as plain data (dicts, lists, strings, numbers), ready for JSON or YAML."""
    conditions = profile.conditions
    return {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        "model": profile.model,
        "catalog_key": profile.catalog_key,
        "device": profile.device,
        "measured_at": profile.measured_at,
        "quick": profile.quick,
        "duration_seconds": profile.duration_seconds,
        "software": {
            "gpuscope": profile.software.gpuscope,
            "torch": profile.software.torch,
            "python": profile.software.python,
            "cuda": profile.software.cuda,
            "driver": profile.software.driver,
        },
        "method": {
            "timer": profile.method.timer,
            "warmup_seconds": profile.method.warmup_seconds,
            "trials": profile.method.trials,
            "unstable_spread": profile.method.unstable_spread,
        },
        "conditions": (
            {"skipped": conditions.reason}
            if isinstance(conditions, Skipped)
            else {
                "before": _reading_document(conditions.before),
                "after": _reading_document(conditions.after),
            }
        ),
        "matmul": {dtype: _result_document(profile.matmul[dtype]) for dtype in DTYPES},
        "memory_bandwidth": {
            "copy": _result_document(profile.memory_copy),
            "read": _result_document(profile.memory_read),
        },
        "host_to_device": _result_document(profile.host_to_device),
        "device_to_host": _result_document(profile.device_to_host),
        "launch_latency": {
            "eager": _result_document(profile.launch_eager),
            "cuda_graph": _result_document(profile.launch_cuda_graph),
        },
    }


def dump_profile(profile: Profile, fmt: Format = "json") -> str:
    document = profile_document(profile)
    if fmt == "yaml":
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return json.dumps(document, indent=2) + "\n"


def format_for(name: str) -> Format | None:
    """The format a file name implies: `.json`, `.yaml`/`.yml`; None for anything else."""
    lowered = name.lower()
    if lowered.endswith(".json"):
        return "json"
    if lowered.endswith((".yaml", ".yml")):
        return "yaml"
    return None
