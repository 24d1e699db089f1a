"""The daemon's own footprint, as prometheus_client reports it for any Python process:
`process_*` (resident memory, CPU seconds, open and maximum fds, start time), `python_gc_*` and
`python_info`.

They are read once per sampling cycle, in the worker thread, and served from the snapshot like
every other series: a scrape does no new work for them (about 60 µs per cycle to read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.core import Metric


def own_families() -> Callable[[], list[Metric]]:
    """A function that reads the daemon's own families now."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)

    def read() -> list[Metric]:
        return list(registry.collect())

    return read
