"""Render metric families into bytes off the event loop, each snapshot at most once per format.

Each snapshot becomes an `Exposition`: its families and the formats rendered from them
(Prometheus text 0.0.4 and/or OpenMetrics 1.0, each also gzipped). When scrapes come at least as
often as cycles, the sampler's worker thread renders every snapshot right away in the formats
the previous one was scraped in, and a scrape costs a dictionary lookup and a write. When they
come less often (Prometheus every 15 s, samples every second), rendering every snapshot would be
wasted: the first scrape of a snapshot renders it, in a worker thread, once, for everyone.
"""

from __future__ import annotations

import gzip
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from exporter.metrics.labels import LabelSet, escape_label_value, render_labels

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from prometheus_client.samples import Sample

TEXT: Final = "text"
# The classic text format, which every Prometheus-compatible scraper parses (prometheus_client's
# "latest" now announces 1.0.0, which older scrapers do not know; the bytes are the same).
TEXT_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS: Final = "openmetrics"
_GZIP_LEVEL: Final = 3
"""Nearly level 6's size (16% larger) at under half its CPU."""


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


class _LabelCache:
    """Rendered label text for samples whose labels are a plain dict (the exporter's own few
    series): kept across renders, keyed by the labels in the family's order. Label sets made by
    the families (`LabelSet`) carry their text already."""

    def __init__(self) -> None:
        self._rendered: dict[tuple[tuple[str, str], ...], str] = {}

    def __call__(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        rendered = self._rendered.get(key)
        if rendered is None:
            if len(self._rendered) >= _CACHE_LIMIT:
                self._rendered.clear()
            rendered = self._rendered[key] = render_labels(key)
        return rendered


_LABELS: Final = _LabelCache()


class PlainCounter(Metric):
    """A counter named as another exporter names it, its samples without `_total`
    (dcgm-exporter's `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`): the text format declares it a
    counter under that very name; OpenMetrics, whose counter samples must end in `_total`,
    declares it `unknown`, so that its samples keep the name consumers query."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")


def _write_series(samples: list[Sample], out: list[str]) -> None:
    """A line per series, `name{labels} value`, as both formats write them. The hot loop of a
    render: label text comes ready-made with the label set, numbers from the cache."""
    numbers = _numbers
    plain_labels = _LABELS
    for name, labels, value, _timestamp, _exemplar, _histogram in samples:
        text = numbers.get(value) if value else None
        if text is None:
            text = _number(value)
        label_text = labels.rendered if type(labels) is LabelSet else plain_labels(labels)
        out.append(f"{name}{label_text} {text}\n")


def _text(families: list[Metric]) -> bytes:
    """Prometheus text format 0.0.4, byte-identical to prometheus_client's `generate_latest` for
    the gauges and counters gpuscope exports (a test holds the two equal), several times faster
    because names are known to be valid and label sets repeat."""
    out: list[str] = []
    for family in families:
        counter = family.type == "counter" and type(family) is not PlainCounter
        name = f"{family.name}_total" if counter else family.name
        documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {documentation}\n# TYPE {name} {family.type}\n")
        _write_series(family.samples, out)
    return "".join(out).encode()


def _openmetrics(families: list[Metric]) -> bytes:
    """OpenMetrics 1.0, byte-identical to prometheus_client's for gpuscope's families."""
    out: list[str] = []
    for family in families:
        name = family.name
        kind = "unknown" if type(family) is PlainCounter else family.type
        out.append(
            f"# HELP {name} {escape_label_value(family.documentation)}\n# TYPE {name} {kind}\n"
        )
        if family.unit:
            out.append(f"# UNIT {name} {family.unit}\n")
        _write_series(family.samples, out)
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
    """One snapshot's families, made on first need, and the formats rendered from them."""

    def __init__(
        self, families: Callable[[], Iterable[Metric]], *, formats: Iterable[str] = ()
    ) -> None:
        self._make_families = families
        self._families: list[Metric] | None = None
        self._rendered: dict[str, Rendered] = {}
        self._lock = threading.Lock()
        self._served: frozenset[str] = frozenset()
        for name in formats:
            self.render(name)

    @property
    def served(self) -> frozenset[str]:
        """Formats a scrape took from this exposition. Immutable: the sampler's worker thread
        iterates it while scrapes on the event loop record more (`mark_served`)."""
        return self._served

    def mark_served(self, name: str) -> None:
        """Record that a scrape took this format. On the event loop only: it replaces the set,
        so a reader in another thread keeps the one it has."""
        if name not in self._served:
            self._served = self._served | {name}

    @property
    def families(self) -> list[Metric]:
        """The metric families (blocking the first time: call from a worker thread)."""
        with self._lock:
            return self._made_families()

    def _made_families(self) -> list[Metric]:
        if self._families is None:
            self._families = list(self._make_families())
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
                body = generate(self._made_families())
                done = Rendered(body, content_type, gzip.compress(body, _GZIP_LEVEL, mtime=0))
                self._rendered[name] = done
            return done


def negotiate(accept: str) -> str:
    """OpenMetrics when the scraper's Accept header names it, otherwise the text format."""
    for part in accept.split(","):
        if part.split(";", 1)[0].strip() == "application/openmetrics-text":
            return OPENMETRICS
    return TEXT
