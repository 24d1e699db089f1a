"""The same fixed history in a real Prometheus and a real VictoriaMetrics, for the tests that
compare the two stores (tests/test_victoria*.py).

`demo_history` takes what the dashboard tests' demo nodes (tests/demo_node.py) serve — each
daemon's /metrics once, and `up` 0 for the node nothing listens on — and makes two hours of it
on a 15-second grid: counters rise at a steady rate each (a histogram's series in proportion, so
its buckets stay ordered), gauges swing a little around what was served (0/1 states, `_info` and
timestamps stay as they are). promtool backfills it; `stores` serves those blocks from Prometheus
(accepting remote write) and, through vmctl, from VictoriaMetrics.

The comparisons evaluate between samples (`SAMPLE_PHASE`, `QUERY_PHASE`), as real evaluations
do: Prometheus 2's ranges include a sample exactly at their start and MetricsQL's do not (nor do
Prometheus 3's), a difference only a grid shared by samples and evaluations would show. Over a
steady counter, PromQL's extrapolation to a range's edges and MetricsQL's use of the sample
before the range give the same rate.
"""

from __future__ import annotations

import contextlib
import math
import time
import urllib.request
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client.parser import text_string_to_metric_families

from dashboards.live import LiveStack, Prometheus
from dashboards.victoria import VictoriaMetrics
from tests.demo_node import DEMO_NODES
from tests.helpers import eventually, require_tool
from tests.prometheus_server import running_prometheus
from tests.synthetic_history import backfill

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path
    from typing import TextIO

GRID: Final = 15
"""Seconds between samples, and between the instants the comparisons evaluate at."""
SAMPLE_PHASE: Final = 7
"""Samples sit 7 s past a multiple of GRID; vmalert evaluates rules on the multiples, so the
rules' results sit on them; dashboard queries run 3 s past them (`query_phase`). No range whose
length is a multiple of GRID then starts or ends on a sample."""
QUERY_PHASE: Final = 3
POINTS: Final = 481
"""Two hours of samples: longer than any range a rule or panel reads over the replayed time."""
JOB: Final = "gpuscope"
COUNTER_TYPES: Final = frozenset({"counter", "histogram", "summary"})


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float
    kind: str
    """The family's type: counter, gauge, histogram, ..."""


@dataclass(frozen=True, slots=True)
class History:
    data: Path
    """Prometheus' TSDB directory holding it."""
    start: float
    end: float
    """Unix seconds of the first and last samples, both on the grid."""
    series: int


FIRST: Final = ("gpuscope_collector_success",)
READINGS: Final = {
    # Pods attributed; rates, GPM and the link counters read over a second cycle.
    "sim-a": (
        "gpu_pod_busy_seconds_total{",
        "gpu_sm_active_seconds_total{",
        "gpu_sm_occupancy_ratio{",
        "gpu_pcie_receive_bytes_per_second{",
        "gpu_nvlink_receive_bytes_per_second{",
    ),
}
"""Series a node's /metrics must hold before it is taken: every reading the dashboards show."""


def _exposition(port: int, needles: tuple[str, ...]) -> str | None:
    """The daemon's /metrics once it holds every one of `needles`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text: str = response.read().decode()
    return text if all(needle in text for needle in needles) else None


def served(workdir: Path) -> list[Series]:
    """Every series the demo nodes serve once their pods are attributed, with the labels the
    scrape adds (`job`, `instance`, `node`), and `up` per node."""
    found: list[Series] = []
    with LiveStack(DEMO_NODES, workdir, rule_files=()) as stack:
        for node in DEMO_NODES:
            target = {"job": JOB, "instance": f"{node.name}:9455", "node": node.name}
            if node.fleet is None:
                found.append(Series("up", target, 0.0, "gauge"))
                continue
            port = stack.ports[node.name]
            text = eventually(
                lambda port=port, node=node.name: _exposition(port, READINGS.get(node, FIRST)),
                60,
                f"{node.name}'s readings",
            )
            samples = len([line for line in text.splitlines() if not line.startswith("#")])
            found += [
                Series("up", target, 1.0, "gauge"),
                # What the scrape adds beside `up` (the exporter-health dashboard shows them).
                Series("scrape_duration_seconds", target, 0.012, "gauge"),
                Series("scrape_samples_scraped", target, float(samples), "gauge"),
            ]
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    found.append(
                        Series(sample.name, {**sample.labels, **target}, sample.value, family.type)
                    )
    for node in DEMO_NODES:
        if node.opencost is not None:
            # What the stack's OpenCost stand-in serves, with its own labels (honor_labels).
            price, spot = node.opencost
            labels = {"node": node.name, "instance": node.name, "job": "opencost"}
            found += [
                Series("node_gpu_hourly_cost", labels, price, "gauge"),
                Series("kubecost_node_is_spot", labels, float(spot), "gauge"),
            ]
    return found


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _values(series: Series) -> list[float]:
    """The series' value at each grid point, ending with what was served."""
    seed = zlib.crc32(f"{series.name}{sorted(series.labels.items())}".encode())
    v0 = series.value
    if series.kind in COUNTER_TYPES and math.isfinite(v0):
        # Counters rise at a steady rate of their own (a histogram's series at one rate, so its
        # buckets stay ordered), ending at the served value.
        share = 0.001 if series.kind != "counter" else 0.0003 * (1 + seed % 5)
        return [v0 * (1 - share * (POINTS - 1 - k)) for k in range(POINTS)]
    constant = (
        not math.isfinite(v0)
        or v0 in (0.0, 1.0)
        or series.name.endswith(("_info", "_timestamp_seconds", "_time_seconds"))
    )
    if constant:
        return [v0] * POINTS
    high = 1.0 if series.name.endswith("_ratio") else math.inf
    return [
        min(v0 * (1 + 0.03 * math.sin(k * 0.7 + seed)), high) if v0 > 0 else v0
        for k in range(POINTS)
    ]


def write_history(out: TextIO, found: list[Series], end: float) -> None:
    """OpenMetrics for promtool: each name's series together, in time order, then `# EOF`."""
    by_name: dict[str, list[Series]] = {}
    for series in found:
        by_name.setdefault(series.name, []).append(series)
    times = [end - (POINTS - 1 - k) * GRID for k in range(POINTS)]
    for name, family in by_name.items():
        out.write(f"# TYPE {name} unknown\n")
        for series in family:
            labels = ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(series.labels.items()))
            prefix = f"{name}{{{labels}}} "
            out.write(
                "".join(
                    f"{prefix}{value!r} {t:.0f}\n"
                    for t, value in zip(times, _values(series), strict=True)
                )
            )
    out.write("# EOF\n")


def demo_history(workdir: Path) -> History:
    """Two hours of the demo nodes' series, ending about a minute before now, backfilled into
    `workdir/data`."""
    promtool = require_tool("promtool")
    found = served(workdir / "live")
    end = float(int(time.time()) // GRID * GRID - 4 * GRID + SAMPLE_PHASE)
    openmetrics = workdir / "history.om"
    with openmetrics.open("w") as out:
        write_history(out, found, end)
    backfill(promtool, openmetrics, workdir / "data")
    openmetrics.unlink()
    return History(workdir / "data", end - (POINTS - 1) * GRID, end, len(found))


@contextlib.contextmanager
def stores(workdir: Path, history: History) -> Iterator[tuple[str, VictoriaMetrics]]:
    """Prometheus serving the history's blocks (remote write accepted) and VictoriaMetrics
    holding the same samples, copied from it; yields Prometheus' URL and the VictoriaMetrics."""
    require_tool("victoria-metrics")
    with (
        VictoriaMetrics(workdir / "victoria") as victoria,
        running_prometheus(history.data, receive=True) as prometheus,
    ):
        victoria.copy_from(Prometheus(prometheus), start=history.start, end=history.end)
        yield prometheus, victoria
