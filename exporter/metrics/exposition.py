"""Render metric families into bytes off the event loop; scrapes only pick bytes to send.

Each snapshot becomes an `Exposition`. The sampler's worker thread renders it right away in
every format scraped recently (Prometheus text 0.0.4 and/or OpenMetrics 1.0, each also gzipped),
so a scrape costs a dictionary lookup and a write, whatever the number of GPUs, processes and
pods. The first scrape in a format, or one after nobody asked for it in `FORMAT_IDLE_SECONDS`,
renders that snapshot in a worker thread, once, for everyone; later cycles render it eagerly.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client.core import Metric

TEXT: Final = "text"
# The classic text format, which every Prometheus-compatible scraper parses (prometheus_client's
# "latest" now announces 1.0.0, which older scrapers do not know; the bytes are the same).
TEXT_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS: Final = "openmetrics"
FORMAT_IDLE_SECONDS: Final = 300.0
_GZIP_LEVEL: Final = 6


_CACHE_LIMIT: Final = 4096
"""Entries kept by the number and label caches below (each well under 1 MiB); past that they
start again, so values and series that come and go never pile up."""
_numbers: dict[float, str] = {}


def _number(value: float) -> str:
    """prometheus_client's Go-style number, cached: most values recur from one cycle to the next,
    and formatting them was over half of a render's time."""
    if value == 0:  # 0.0 and -0.0 are equal keys but print differently
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = _numbers.get(value)
    if text is None:
        if len(_numbers) >= _CACHE_LIMIT:
            _numbers.clear()
        text = _numbers[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape_label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _LabelCache:
    """Rendered `{a="1",b="2"}` strings, computed once per distinct label set and kept across
    renders: the same GPU labels recur in every family, the same pod labels in every cycle, and
    escaping them dominates rendering. Keyed by the labels in the family's own order (sorting
    only on a miss); safe to share between threads (plain dict reads and writes)."""

    def __init__(self) -> None:
        self._rendered: dict[tuple[tuple[str, str], ...], str] = {}

    def __call__(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        rendered = self._rendered.get(key)
        if rendered is None:
            if len(self._rendered) >= _CACHE_LIMIT:
                self._rendered.clear()
            inner = ",".join(
                f'{name}="{_escape_label_value(value)}"' for name, value in sorted(key)
            )
            rendered = self._rendered[key] = f"{{{inner}}}" if inner else ""
        return rendered


_LABELS: Final = _LabelCache()


def _text(families: list[Metric]) -> bytes:
    """Prometheus text format 0.0.4, byte-identical to prometheus_client's `generate_latest` for
    the gauges and counters gpuscope exports (a test holds the two equal), several times faster
    because names are known to be valid and label sets repeat."""
    labels = _LABELS
    out: list[str] = []
    for family in families:
        name = f"{family.name}_total" if family.type == "counter" else family.name
        documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {documentation}\n# TYPE {name} {family.type}\n")
        out.extend(
            f"{sample.name}{labels(sample.labels)} {_number(sample.value)}\n"
            for sample in family.samples
        )
    return "".join(out).encode()


def _openmetrics(families: list[Metric]) -> bytes:
    """OpenMetrics 1.0, byte-identical to prometheus_client's for gpuscope's families."""
    labels = _LABELS
    out: list[str] = []
    for family in families:
        name = family.name
        out.append(
            f"# HELP {name} {_escape_label_value(family.documentation)}\n# TYPE {name} {family.type}\n"
        )
        if family.unit:
            out.append(f"# UNIT {name} {family.unit}\n")
        out.extend(
            f"{sample.name}{labels(sample.labels)} {_number(sample.value)}\n"
            for sample in family.samples
        )
    out.append("# EOF\n")
    return "".join(out).encode()


_FORMATS: Final[dict[str, tuple[str, Callable[[list[Metric]], bytes]]]] = {
    TEXT: (TEXT_CONTENT_TYPE, _text),
    OPENMETRICS: (OPENMETRICS_CONTENT_TYPE, _openmetrics),
}


@dataclass(frozen=True, slots=True)
class Rendered:
    body: bytes
    content_type: str
    gzipped: bytes


class Exposition:
    """One snapshot's families and the formats rendered from them so far."""

    def __init__(self, families: Iterable[Metric], *, formats: Iterable[str] = ()) -> None:
        self._families = list(families)
        self._rendered: dict[str, Rendered] = {}
        self._lock = threading.Lock()
        for name in formats:
            self.render(name)

    @property
    def families(self) -> list[Metric]:
        return self._families

    def rendered(self, name: str) -> Rendered | None:
        """The bytes for a format if already rendered (safe to call on the event loop)."""
        return self._rendered.get(name)

    def render(self, name: str) -> Rendered:
        """Render one format, at most once per snapshot. Blocking: call from a worker thread."""
        with self._lock:
            done = self._rendered.get(name)
            if done is None:
                content_type, generate = _FORMATS[name]
                body = generate(self._families)
                done = Rendered(body, content_type, gzip.compress(body, _GZIP_LEVEL, mtime=0))
                self._rendered[name] = done
            return done


class FormatDemand:
    """Which formats scrapers asked for lately, so only those are rendered every cycle."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_asked: dict[str, float] = {}

    def asked(self, name: str) -> None:
        self._last_asked[name] = self._clock()

    def wanted(self) -> list[str]:
        horizon = self._clock() - FORMAT_IDLE_SECONDS
        return [name for name, when in self._last_asked.items() if when >= horizon]


def negotiate(accept: str) -> str:
    """OpenMetrics when the scraper's Accept header names it, otherwise the text format."""
    for part in accept.split(","):
        if part.split(";", 1)[0].strip() == "application/openmetrics-text":
            return OPENMETRICS
    return TEXT


def accepts_gzip(accept_encoding: str) -> bool:
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in {"gzip", "*"}:
            quality = params.replace(" ", "").lower().removeprefix("q=")
            try:
                return not params or float(quality) > 0
            except ValueError:
                return True
    return False
