"""The calibration profile: one versioned document per GPU model, in JSON or YAML.

`gpuscope calibrate` writes one; the daemon reads them. This module is the whole schema: the
dataclasses, the document form (`profile_document`, `dump_profile`) and the loader
(`parse_profile`, `parse_profile_text`). The loader takes *any* input — wrong types, missing or
unknown fields, NaN, huge numbers, deep nesting, bytes that are not UTF-8 — and either returns a
`Profile` or raises `ProfileError`, never anything else.

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
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

import yaml

from exporter.catalog import DTYPES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

PROFILE_KIND: Final = "gpuscope/calibration-profile"
PROFILE_VERSION: Final = 1
MAX_PROFILE_BYTES: Final = 1024 * 1024
"""A ConfigMap holds at most 1 MiB; a profile is a few KiB."""
MAX_TEXT: Final = 256

FLOPS_UNIT: Final = "FLOP/s"
OPS_UNIT: Final = "OP/s"
"""int8 matmul counts integer operations."""
BYTES_UNIT: Final = "B/s"
SECONDS_UNIT: Final = "s"
TIMERS: Final = ("cuda_events", "monotonic_clock")
DEVICES: Final = ("cuda", "cpu")

Format = Literal["json", "yaml"]


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


# -- loading ----------------------------------------------------------------------------------


def parse_profile_text(text: str | bytes, *, source: str, fmt: Format | None = None) -> Profile:
    """Decode and validate one profile. `fmt` None: JSON if it starts with `{`, else YAML."""
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{source}: larger than {MAX_PROFILE_BYTES} bytes")
    try:
        decoded = text.decode("utf-8") if isinstance(text, bytes) else text
        if fmt is None:
            fmt = "json" if decoded.lstrip().startswith("{") else "yaml"
        document = json.loads(decoded) if fmt == "json" else yaml.safe_load(decoded)
    except UnicodeDecodeError as error:
        raise ProfileError(f"{source}: not UTF-8 text") from error
    except (ValueError, yaml.YAMLError) as error:  # json.JSONDecodeError is a ValueError
        raise ProfileError(
            f"{source}: not valid {fmt.upper() if fmt else 'text'}: {_first_line(error)}"
        ) from error
    except RecursionError as error:
        raise ProfileError(f"{source}: nested too deeply") from error
    return parse_profile(document, source=source)


def parse_profile(document: object, *, source: str = "profile") -> Profile:
    """Validate a decoded document (whatever it holds) into a `Profile`."""
    try:
        return _profile(document)
    except _Invalid as error:
        raise ProfileError(
            f"{source}: {error.where}: {error.problem}"
            if error.where
            else f"{source}: {error.problem}"
        ) from None
    except RecursionError as error:
        raise ProfileError(f"{source}: nested too deeply") from error


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return " ".join(line.strip() for line in lines[:3]) if lines else type(error).__name__


class _Invalid(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def _mapping(
    value: object,
    where: str,
    *,
    required: frozenset[str],
    optional: frozenset[str] = frozenset(),
) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _Invalid(where, f"expected a mapping, got {_kind(value)}")
    keys = set(value)
    if not all(isinstance(key, str) for key in keys):
        raise _Invalid(where, "field names must be strings")
    unknown = keys - required - optional
    if unknown:
        raise _Invalid(where, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    missing = required - keys
    if missing:
        raise _Invalid(where, f"missing field(s) {', '.join(sorted(missing))}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _text(value: object, where: str, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(where, f"expected a non-empty string, got {_kind(value)}")
    if len(value) > MAX_TEXT or any(not char.isprintable() for char in value):
        raise _Invalid(where, f"expected printable text of at most {MAX_TEXT} characters")
    return value


def _required_text(value: object, where: str) -> str:
    text = _text(value, where)
    assert text is not None  # not nullable
    return text


def _number(
    value: object, where: str, *, positive: bool = False, nullable: bool = False
) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(where, f"expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _Invalid(where, "must be a finite number")
    if positive and number <= 0:
        raise _Invalid(where, "must be greater than 0")
    if not positive and number < 0:
        raise _Invalid(where, "must not be negative")
    return number


def _required_number(value: object, where: str, *, positive: bool = False) -> float:
    number = _number(value, where, positive=positive)
    assert number is not None  # not nullable
    return number


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(where, f"expected true or false, got {_kind(value)}")
    return value


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise _Invalid(where, "expected a whole number from 1 to 1000000")
    return value


def _choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _Invalid(where, f"expected one of {', '.join(choices)}")
    return value


def _timestamp(value: object, where: str) -> str:
    if isinstance(value, datetime):  # an unquoted YAML timestamp
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise _Invalid(where, f"{value[:40]!r} is not an ISO 8601 time") from None
    else:
        raise _Invalid(where, f"expected an ISO 8601 time, got {_kind(value)}")
    if parsed.tzinfo is None:
        raise _Invalid(where, "the time needs a UTC offset (e.g. 2026-11-22T02:30:00Z)")
    return value if isinstance(value, str) else parsed.isoformat()


_FIGURE_REQUIRED: Final = frozenset({"value", "unit", "min", "max", "trials", "unstable"})
_FIGURE_OPTIONAL: Final = frozenset({"spread", "size", "datasheet", "achieved_ratio"})
_RELATIVE_SLACK: Final = 1e-9
"""min <= value <= max allowing for the last bits of float rounding."""


def _result(value: object, where: str, unit: str) -> Result:
    if isinstance(value, dict) and "skipped" in value:
        fields = _mapping(value, where, required=frozenset({"skipped"}))
        return Skipped(_required_text(fields["skipped"], _join(where, "skipped")))
    fields = _mapping(value, where, required=_FIGURE_REQUIRED, optional=_FIGURE_OPTIONAL)
    median = _required_number(fields["value"], _join(where, "value"), positive=True)
    minimum = _required_number(fields["min"], _join(where, "min"), positive=True)
    maximum = _required_number(fields["max"], _join(where, "max"), positive=True)
    slack = median * _RELATIVE_SLACK
    if not minimum - slack <= median <= maximum + slack:
        raise _Invalid(where, "expected min <= value <= max")
    found_unit = fields["unit"]
    if found_unit != unit:
        raise _Invalid(_join(where, "unit"), f"expected {unit!r}, got {_short(found_unit)}")
    for derived in ("spread", "achieved_ratio"):
        if derived in fields:
            _number(fields[derived], _join(where, derived), nullable=True)
    size = fields.get("size", "")
    return Figure(
        value=median,
        unit=unit,
        minimum=minimum,
        maximum=maximum,
        trials=_count(fields["trials"], _join(where, "trials")),
        unstable=_boolean(fields["unstable"], _join(where, "unstable")),
        size="" if size == "" else _required_text(size, _join(where, "size")),
        datasheet=_number(
            fields.get("datasheet"), _join(where, "datasheet"), positive=True, nullable=True
        ),
    )


def _short(value: object) -> str:
    return repr(value)[:40] if isinstance(value, str | int | float) else _kind(value)


_READING_FIELDS: Final = frozenset(
    {
        "temperature_celsius",
        "sm_clock_hertz",
        "memory_clock_hertz",
        "power_watts",
        "clock_event_reasons",
    }
)


def _reading(value: object, where: str) -> Reading:
    fields = _mapping(value, where, required=frozenset(), optional=_READING_FIELDS)
    reasons = fields.get("clock_event_reasons", [])
    if not isinstance(reasons, list) or len(reasons) > 32:
        raise _Invalid(_join(where, "clock_event_reasons"), "expected a list of reason names")
    return Reading(
        temperature_celsius=_number(
            fields.get("temperature_celsius"), _join(where, "temperature_celsius"), nullable=True
        ),
        sm_clock_hertz=_number(
            fields.get("sm_clock_hertz"), _join(where, "sm_clock_hertz"), nullable=True
        ),
        memory_clock_hertz=_number(
            fields.get("memory_clock_hertz"), _join(where, "memory_clock_hertz"), nullable=True
        ),
        power_watts=_number(fields.get("power_watts"), _join(where, "power_watts"), nullable=True),
        clock_event_reasons=tuple(
            _required_text(reason, _join(where, f"clock_event_reasons[{n}]"))
            for n, reason in enumerate(reasons)
        ),
    )


def _conditions(value: object, where: str) -> Conditions | Skipped:
    if isinstance(value, dict) and "skipped" in value:
        fields = _mapping(value, where, required=frozenset({"skipped"}))
        return Skipped(_required_text(fields["skipped"], _join(where, "skipped")))
    fields = _mapping(value, where, required=frozenset({"before", "after"}))
    return Conditions(
        before=_reading(fields["before"], _join(where, "before")),
        after=_reading(fields["after"], _join(where, "after")),
    )


def _section(
    value: object, where: str, names: tuple[str, ...], unit: Callable[[str], str]
) -> dict[str, Result]:
    fields = _mapping(value, where, required=frozenset(names))
    return {name: _result(fields[name], _join(where, name), unit(name)) for name in names}


_TOP_REQUIRED: Final = frozenset(
    {
        "kind",
        "version",
        "model",
        "device",
        "measured_at",
        "quick",
        "duration_seconds",
        "software",
        "method",
        "conditions",
        "matmul",
        "memory_bandwidth",
        "host_to_device",
        "device_to_host",
        "launch_latency",
    }
)


def _profile(document: object) -> Profile:
    if not isinstance(document, dict):
        raise _Invalid("", f"expected a mapping at the top level, got {_kind(document)}")
    if document.get("kind") != PROFILE_KIND:
        raise _Invalid("kind", f"expected {PROFILE_KIND!r}: this is not a calibration profile")
    version = document.get("version")
    if version != PROFILE_VERSION or isinstance(version, bool):
        raise _Invalid(
            "version",
            f"{_short(version)} is not {PROFILE_VERSION}, the version this gpuscope reads",
        )
    fields = _mapping(document, "", required=_TOP_REQUIRED, optional=frozenset({"catalog_key"}))
    software = _mapping(
        fields["software"],
        "software",
        required=frozenset({"gpuscope", "torch", "python"}),
        optional=frozenset({"cuda", "driver"}),
    )
    method = _mapping(
        fields["method"],
        "method",
        required=frozenset({"timer", "warmup_seconds", "trials", "unstable_spread"}),
    )
    memory = _section(fields["memory_bandwidth"], "memory_bandwidth", ("copy", "read"), _bytes)
    latency = _section(
        fields["launch_latency"], "launch_latency", ("eager", "cuda_graph"), _seconds
    )
    return Profile(
        model=_required_text(fields["model"], "model"),
        catalog_key=_text(fields.get("catalog_key"), "catalog_key", nullable=True),
        device=_choice(fields["device"], "device", DEVICES),
        measured_at=_timestamp(fields["measured_at"], "measured_at"),
        quick=_boolean(fields["quick"], "quick"),
        duration_seconds=_required_number(fields["duration_seconds"], "duration_seconds"),
        software=Software(
            gpuscope=_required_text(software["gpuscope"], "software.gpuscope"),
            torch=_required_text(software["torch"], "software.torch"),
            python=_required_text(software["python"], "software.python"),
            cuda=_text(software.get("cuda"), "software.cuda", nullable=True),
            driver=_text(software.get("driver"), "software.driver", nullable=True),
        ),
        method=Method(
            timer=_choice(method["timer"], "method.timer", TIMERS),
            warmup_seconds=_required_number(method["warmup_seconds"], "method.warmup_seconds"),
            trials=_count(method["trials"], "method.trials"),
            unstable_spread=_required_number(
                method["unstable_spread"], "method.unstable_spread", positive=True
            ),
        ),
        conditions=_conditions(fields["conditions"], "conditions"),
        matmul=_section(fields["matmul"], "matmul", DTYPES, matmul_unit),
        memory_copy=memory["copy"],
        memory_read=memory["read"],
        host_to_device=_result(fields["host_to_device"], "host_to_device", BYTES_UNIT),
        device_to_host=_result(fields["device_to_host"], "device_to_host", BYTES_UNIT),
        launch_eager=latency["eager"],
        launch_cuda_graph=latency["cuda_graph"],
    )


def _bytes(_name: str) -> str:
    return BYTES_UNIT


def _seconds(_name: str) -> str:
    return SECONDS_UNIT
