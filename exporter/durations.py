"""Prometheus-style durations (`500ms`, `1s`, `5m`, `1h30m`, `14d`).

Shared by the daemon's settings and the rightsizing job's `--window`/`--step`, so the two
accept exactly the same spellings.
"""

from __future__ import annotations

import re

from exporter.documents import quote

_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
    "y": 365 * 86400.0,
}
_TERM = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


class DurationError(ValueError):
    """A string that is not a duration; the message says why."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `500ms`, `1s`, `1.5m` or `1h30m`.

    Units run from largest to smallest and each appears once, as in Prometheus. A bare number
    is refused: `1` could mean a second or a millisecond, and guessing hides mistakes.
    """
    spelled = text.strip()
    if not spelled:
        raise DurationError("empty duration")
    position = 0
    total = 0.0
    last_rank = -1
    ranks = list(_UNIT_SECONDS)
    ranks.sort(key=lambda unit: -_UNIT_SECONDS[unit])
    while position < len(spelled):
        match = _TERM.match(spelled, position)
        if match is None:
            hint = " (missing unit?)" if spelled[position:].replace(".", "", 1).isdigit() else ""
            raise DurationError(
                f"{quote(text)} is not a duration{hint}; use e.g. 500ms, 1s, 5m, 1h30m"
            )
        number, unit = match.groups()
        rank = ranks.index(unit)
        if rank <= last_rank:
            raise DurationError(f"{quote(text)}: units must go from largest to smallest, each once")
        last_rank = rank
        total += float(number) * _UNIT_SECONDS[unit]
        position = match.end()
    return total


def format_duration(seconds: float) -> str:
    """The shortest spelling `parse_duration` reads back as the same number of seconds."""
    if seconds < 0:
        raise DurationError(f"negative duration {seconds}")
    milliseconds = round(seconds * 1000)
    if milliseconds == 0:
        return "0s"
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        size = round(_UNIT_SECONDS[unit] * 1000)
        count, milliseconds = divmod(milliseconds, size)
        if count:
            parts.append(f"{count}{unit}")
    if milliseconds:
        parts.append(f"{milliseconds}ms")
    return "".join(parts)


def parse_duration_between(text: str, low: float, high: float) -> float:
    """`parse_duration`, refusing a duration outside `low`..`high` seconds."""
    seconds = parse_duration(text)
    if not low <= seconds <= high:
        raise DurationError(
            f"{format_duration(seconds)} is outside {format_duration(low)}..{format_duration(high)}"
        )
    return seconds
