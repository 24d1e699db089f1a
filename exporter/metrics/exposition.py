"""Render metric families into bytes off the event loop; scrapes only pick bytes to send.

Each snapshot becomes an `Exposition`. The sampler's worker thread renders it right away in
every format scraped recently (Prometheus text 0.0.4 and/or OpenMetrics 1.0, each also gzipped),
so a scrape costs a dictionary lookup and a write, whatever the number of GPUs, processes and
pods. A format nobody has asked for in `FORMAT_IDLE_SECONDS` stops being rendered; if it is
asked for again, that one scrape renders it in a worker thread, once, for everyone.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.exposition import generate_latest as generate_text
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from prometheus_client.core import Metric

TEXT: Final = "text"
OPENMETRICS: Final = "openmetrics"
FORMAT_IDLE_SECONDS: Final = 300.0
_GZIP_LEVEL: Final = 6


class _Families:
    """Adapts a list of families to the `collect()` interface prometheus_client renders from."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _text(families: _Families) -> bytes:
    return generate_text(families)  # type: ignore[arg-type,unused-ignore]  # duck-typed registry


def _openmetrics(families: _Families) -> bytes:
    body: bytes = generate_openmetrics(families)  # type: ignore[no-untyped-call]  # untyped upstream
    return body


_FORMATS: Final[dict[str, tuple[str, Callable[[_Families], bytes]]]] = {
    TEXT: (CONTENT_TYPE_LATEST, _text),
    OPENMETRICS: (CONTENT_TYPE_OPENMETRICS, _openmetrics),
}


@dataclass(frozen=True, slots=True)
class Rendered:
    body: bytes
    content_type: str
    gzipped: bytes


class Exposition:
    """One snapshot's families and the formats rendered from them so far."""

    def __init__(self, families: Iterable[Metric], *, formats: Iterable[str] = ()) -> None:
        self._families = _Families(families)
        self._rendered: dict[str, Rendered] = {}
        self._lock = threading.Lock()
        for name in formats:
            self.render(name)

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
        now = clock()
        # Until the first scrape, expect either format: a new daemon serves its first scrape
        # from ready bytes, and an unused format stops costing CPU after FORMAT_IDLE_SECONDS.
        self._last_asked = dict.fromkeys(_FORMATS, now)

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
