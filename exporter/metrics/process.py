"""The daemon's own footprint, as prometheus_client reports it for any Python process:
`process_*` (resident memory, CPU seconds, open and maximum fds, start time), `python_gc_*` and
`python_info`.

They are read when a cycle's snapshot is first rendered, by the thread that renders it, and
served with it like every other series: a second scrape of the same snapshot does no new work
for them, and a cycle nobody scrapes reads none of it (`/proc/self`, the fd directory: most of
what the sampler thread would otherwise do besides assembling the GPUs).
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
