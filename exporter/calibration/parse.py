"""Reading a calibration profile: any input in, a `Profile` or one `ProfileError` out.

Documents come in through `exporter.documents` (at most `MAX_PROFILE_BYTES`, bounded expansion
and depth, UTF-8, no key given twice) and are checked with its checks, so every error is one line:
the source, the key path (`matmul.bf16.value`) and what was wrong. The schema itself — the
dataclasses and the document form — is `exporter.calibration.profile`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING, Final, TypeVar

from exporter import documents
from exporter.calibration.profile import (
    BYTES_UNIT,
    DEVICES,
    PROFILE_KIND,
    PROFILE_VERSION,
    SECONDS_UNIT,
    TIMERS,
    Conditions,
    Figure,
    Method,
    Profile,
    ProfileError,
    Reading,
    Result,
    Skipped,
    Software,
    format_for,
    matmul_unit,
)
from exporter.catalog import DTYPES
from exporter.documents import Invalid, join, one_line, quote

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from exporter.documents import Format

MAX_PROFILE_BYTES: Final = 1024 * 1024
"""A ConfigMap holds at most 1 MiB (all its keys together); a profile is a few KiB."""
MAX_TEXT: Final = 256
MAX_TRIALS: Final = 1_000_000
MAX_REASONS: Final = 32

T = TypeVar("T")


def load_profile(path: Path, *, source: str | None = None) -> Profile:
    """The profile in a file (JSON or YAML by its name, else by its first character); anything
    wrong, reading included, raises `ProfileError` naming `source` (default: the path)."""
    where = str(path) if source is None else source
    try:
        data = documents.read_bounded(path, MAX_PROFILE_BYTES)
    except Invalid as problem:
        raise ProfileError(one_line(f"{where}: {problem}")) from None
    return parse_profile_text(data, source=where, fmt=format_for(path.name))


def parse_profile_text(text: str | bytes, *, source: str, fmt: Format | None = None) -> Profile:
    """Decode and check one profile. `fmt` None: JSON if it starts with `{`, else YAML."""
    if fmt is None:
        fmt = "json" if text.lstrip()[:1] in {"{", b"{"} else "yaml"
    return documents.load_text(
        text, _profile, ProfileError, source=source, fmt=fmt, limit=MAX_PROFILE_BYTES
    )


def parse_profile(document: object, *, source: str = "profile") -> Profile:
    """Check a decoded document (whatever it holds) into a `Profile`."""
    try:
        return _profile(document)
    except Invalid as problem:
        raise ProfileError(one_line(f"{source}: {problem}")) from None
    except RecursionError:
        # only a document built in Python nests this deep: a parsed one is bounded
        raise ProfileError(f"{source}: nested too deeply") from None


def _optional(value: object, path: str, check: Callable[[object, str], T]) -> T | None:
    """`check(value, path)`, or None for a null (or absent) value."""
    return None if value is None else check(value, path)


_NOT_BLANK: Final = re.compile(r".*\S.*")


def _text(value: object, path: str) -> str:
    return documents.text(
        value, path, max_length=MAX_TEXT, pattern=_NOT_BLANK, describe="non-blank text"
    )


def _amount(value: object, path: str) -> float:
    """A finite number, not negative."""
    return documents.number(value, path, low=0)


def _rate(value: object, path: str) -> float:
    """A finite number above 0."""
    return documents.number(value, path, positive=True)


def _trials(value: object, path: str) -> int:
    return documents.integer(value, path, low=1, high=MAX_TRIALS)


def _timestamp(value: object, path: str) -> str:
    """An ISO 8601 time with a UTC offset; YAML's unquoted timestamps come as `datetime`."""
    if isinstance(value, datetime):
        parsed = value
    else:
        spelled = documents.text(value, path, max_length=64)
        try:
            parsed = datetime.fromisoformat(spelled)
        except ValueError:
            raise Invalid(path, f"{quote(spelled)} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise Invalid(path, "the time needs a UTC offset (e.g. 2026-11-22T02:30:00Z)")
    return value if isinstance(value, str) else parsed.isoformat()


_FIGURE_REQUIRED: Final = ("value", "unit", "min", "max", "trials", "unstable")
_FIGURE_OPTIONAL: Final = ("spread", "size", "datasheet", "achieved_ratio")
_RELATIVE_SLACK: Final = 1e-9
"""min <= value <= max allowing for the last bits of float rounding."""


def _skipped(value: object) -> bool:
    """A `{skipped: reason}` in place of a figure or of the conditions."""
    return isinstance(value, dict) and "skipped" in value


def _skip(value: object, path: str) -> Skipped:
    fields = documents.mapping(value, path, required=("skipped",), optional=())
    return Skipped(_text(fields["skipped"], join(path, "skipped")))


def _result(value: object, path: str, unit: str) -> Result:
    if _skipped(value):
        return _skip(value, path)
    fields = documents.mapping(value, path, required=_FIGURE_REQUIRED, optional=_FIGURE_OPTIONAL)
    median = _rate(fields["value"], join(path, "value"))
    minimum = _rate(fields["min"], join(path, "min"))
    maximum = _rate(fields["max"], join(path, "max"))
    slack = median * _RELATIVE_SLACK
    if not minimum - slack <= median <= maximum + slack:
        raise Invalid(path, "expected min <= value <= max")
    if fields["unit"] != unit:
        raise Invalid(join(path, "unit"), f"expected {unit!r}, got {quote(fields['unit'])}")
    for derived in ("spread", "achieved_ratio"):  # written for people, recomputed
        _optional(fields.get(derived), join(path, derived), _amount)
    size = fields.get("size", "")
    return Figure(
        value=median,
        unit=unit,
        minimum=minimum,
        maximum=maximum,
        trials=_trials(fields["trials"], join(path, "trials")),
        unstable=documents.boolean(fields["unstable"], join(path, "unstable")),
        size="" if size == "" else _text(size, join(path, "size")),
        datasheet=_optional(fields.get("datasheet"), join(path, "datasheet"), _rate),
    )


_READING_FIELDS: Final = (
    "temperature_celsius",
    "sm_clock_hertz",
    "memory_clock_hertz",
    "power_watts",
    "clock_event_reasons",
)


def _reading(value: object, path: str) -> Reading:
    fields = documents.mapping(value, path, optional=_READING_FIELDS)

    def number(name: str) -> float | None:
        return _optional(fields.get(name), join(path, name), _amount)

    reasons = join(path, "clock_event_reasons")
    return Reading(
        temperature_celsius=number("temperature_celsius"),
        sm_clock_hertz=number("sm_clock_hertz"),
        memory_clock_hertz=number("memory_clock_hertz"),
        power_watts=number("power_watts"),
        clock_event_reasons=documents.strings(
            fields.get("clock_event_reasons", []),
            reasons,
            max_items=MAX_REASONS,
            max_length=MAX_TEXT,
        ),
    )


def _conditions(value: object, path: str) -> Conditions | Skipped:
    if _skipped(value):
        return _skip(value, path)
    fields = documents.mapping(value, path, required=("before", "after"), optional=())
    return Conditions(
        before=_reading(fields["before"], join(path, "before")),
        after=_reading(fields["after"], join(path, "after")),
    )


def _section(
    value: object, path: str, names: tuple[str, ...], unit: Callable[[str], str]
) -> dict[str, Result]:
    fields = documents.mapping(value, path, required=names, optional=())
    return {name: _result(fields[name], join(path, name), unit(name)) for name in names}


_TOP_REQUIRED: Final = (
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
)


def _profile(document: object) -> Profile:
    if not isinstance(document, dict):
        raise Invalid("", f"expected a mapping at the top level, got {documents.kind(document)}")
    if document.get("kind") != PROFILE_KIND:
        raise Invalid("kind", f"expected {PROFILE_KIND!r}: this is not a calibration profile")
    version = document.get("version")
    if version != PROFILE_VERSION or isinstance(version, bool):
        raise Invalid(
            "version", f"{quote(version)} is not {PROFILE_VERSION}, the version this gpuscope reads"
        )
    fields = documents.mapping(document, "", required=_TOP_REQUIRED, optional=("catalog_key",))
    software = documents.mapping(
        fields["software"],
        "software",
        required=("gpuscope", "torch", "python"),
        optional=("cuda", "driver"),
    )
    method = documents.mapping(
        fields["method"],
        "method",
        required=("timer", "warmup_seconds", "trials", "unstable_spread"),
        optional=(),
    )
    memory = _section(fields["memory_bandwidth"], "memory_bandwidth", ("copy", "read"), _bytes)
    latency = _section(
        fields["launch_latency"], "launch_latency", ("eager", "cuda_graph"), _seconds
    )
    return Profile(
        model=_text(fields["model"], "model"),
        catalog_key=_optional(fields.get("catalog_key"), "catalog_key", _text),
        device=documents.choice(fields["device"], "device", DEVICES),
        measured_at=_timestamp(fields["measured_at"], "measured_at"),
        quick=documents.boolean(fields["quick"], "quick"),
        duration_seconds=_amount(fields["duration_seconds"], "duration_seconds"),
        software=Software(
            gpuscope=_text(software["gpuscope"], "software.gpuscope"),
            torch=_text(software["torch"], "software.torch"),
            python=_text(software["python"], "software.python"),
            cuda=_optional(software.get("cuda"), "software.cuda", _text),
            driver=_optional(software.get("driver"), "software.driver", _text),
        ),
        method=Method(
            timer=documents.choice(method["timer"], "method.timer", TIMERS),
            warmup_seconds=_amount(method["warmup_seconds"], "method.warmup_seconds"),
            trials=_trials(method["trials"], "method.trials"),
            unstable_spread=_rate(method["unstable_spread"], "method.unstable_spread"),
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
