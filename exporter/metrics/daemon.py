"""The daemon itself: its build, each collector's health, and the sampling loop's progress."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.metrics.base import add, new_metric
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from exporter.model import Snapshot


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    python_version: str = platform.python_version()


BUILD_INFO: Final = Family(
    "gpuscope_build_info",
    "gpuscope's version and the Python it runs on; always 1.",
    labels=("version", "python_version"),
    gpu=False,
    doc="the daemon; always 1",
)
COLLECTOR_SUCCESS: Final = Family(
    "gpuscope_collector_success",
    "1 if the source answered in the last sampling cycle, 0 if it failed.",
    labels=("collector",),
    gpu=False,
    doc="1 if the collector's readings answered in the last cycle (on every GPU that answered): "
    "`nvml` (the library initialised) and each switched-on collector (see "
    "[Collectors](../guide/daemon.md#collectors)); `calibration` with `--calibration.path` (0 while a profile is "
    "rejected or the path is unreadable); with attribution also `kubernetes`, `podresources`, "
    "`cgroups`; and the background tasks, 0 from a crash until they are restarted: `events` "
    "(the XID/ECC event thread), `web_config` (the web-config watch, with `--web.config.file`), "
    "`node_condition` and `pod_events` (with `--kubernetes.node-condition`, `--kubernetes.events`)",
)
COLLECTOR_DURATION: Final = Family(
    "gpuscope_collector_duration_seconds",
    "Time the source took in the last sampling cycle.",
    unit="seconds",
    labels=("collector",),
    gpu=False,
    doc="time the collector took in the last cycle (for a per-GPU collector, the longest any "
    "GPU's readings of it took; background tasks have none)",
)
LAST_SAMPLE: Final = Family(
    "gpuscope_last_sample_timestamp_seconds",
    "Unix time at which the last sampling cycle finished.",
    unit="seconds",
    gpu=False,
    doc="when the last cycle finished (alert when it grows stale)",
)
CYCLES: Final = Family(
    "gpuscope_sample_cycles", "Sampling cycles completed.", kind="counter", gpu=False
)
OVERRUNS: Final = Family(
    "gpuscope_sample_overruns",
    "Sampling cycles that outlasted the collect interval, so the next one started late.",
    kind="counter",
    gpu=False,
    doc="cycles that outlasted `--collect.interval`",
)
ERRORS: Final = Family(
    "gpuscope_sample_errors",
    "Unexpected errors met while sampling: in one reading (its series is omitted), one GPU "
    "(gpu_down_reason error) or a whole cycle (skipped). The log says what, once per error.",
    kind="counter",
    gpu=False,
    doc="unexpected errors met while sampling — in one reading (its series is omitted that "
    "cycle), one GPU (`gpu_down_reason{reason='error'}`) or a whole cycle (skipped, the next "
    "runs on schedule); each distinct error is logged once, its traceback at debug level",
)
INTERVAL: Final = Family(
    "gpuscope_collect_interval_seconds",
    "The configured sampling interval (--collect.interval).",
    unit="seconds",
    gpu=False,
    doc="the configured `--collect.interval`: rules tell a stale sample by it",
)
FAMILIES: Final = (
    BUILD_INFO,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    LAST_SAMPLE,
    CYCLES,
    OVERRUNS,
    ERRORS,
    INTERVAL,
)


def daemon_families(snapshot: Snapshot, build: BuildInfo) -> Iterator[Metric]:
    info = new_metric(BUILD_INFO)
    add(info, {"version": build.version, "python_version": build.python_version}, 1)
    yield info
    success, duration = new_metric(COLLECTOR_SUCCESS), new_metric(COLLECTOR_DURATION)
    for status in snapshot.collectors:
        labels = {"collector": status.name}
        add(success, labels, 1 if status.success else 0)
        if status.duration_seconds is not None:
            add(duration, labels, status.duration_seconds)
    yield success
    yield duration
    last = new_metric(LAST_SAMPLE)
    add(last, {}, snapshot.timestamp)
    yield last
    cycles = new_metric(CYCLES)
    add(cycles, {}, snapshot.cycles_total)
    yield cycles
    overruns = new_metric(OVERRUNS)
    add(overruns, {}, snapshot.overruns_total)
    yield overruns
    errors = new_metric(ERRORS)
    add(errors, {}, snapshot.errors_total)
    yield errors
    interval = new_metric(INTERVAL)
    if snapshot.collect_interval_seconds is not None:
        add(interval, {}, snapshot.collect_interval_seconds)
    yield interval
