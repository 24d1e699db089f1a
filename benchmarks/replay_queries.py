"""Benchmark the policy replay's per-step history fetch (`exporter/rightsize/replay/steps.py`)
against a real Prometheus or VictoriaMetrics holding N workloads x 14 days of history.

    .venv/bin/python benchmarks/replay_queries.py [--workloads 1000] [--days 14]
        [--interval 5m] [--step 10m] [--concurrency 4] [--store prometheus|victoria]
        [--report] [--keep DIR]

1. Builds the history of `benchmarks/rightsize.py`'s fleet (the same ten behaviours, written by
   tests/synthetic_history.py) into the store, once per --keep DIR (its `end` file the window's
   end): for `prometheus` as promtool blocks (`rightsize.build`); for `victoria` streamed into
   VictoriaMetrics' `/api/v1/import/prometheus` a 54-hour piece at a time, each piece sent in
   bounded batches while the next is written (never the whole history in memory; minutes
   where promtool takes hours at 10,000 workloads).
2. Serves it (loopback, default query limits), runs the report's own history fetch once
   (`fetch.fetch`: it sizes the replay's queries by the workload rows), then the replay's fetch
   alone, through the report's client at --concurrency.
3. Measures the replay fetch's queries, wall time, samples read, the process's CPU time for it
   (the client's cost: a microsecond figure per sample), its peak resident memory during it
   (VmHWM, reset just before), the bytes of JSON the client read for it, and for Prometheus the
   bytes it answered (its own `prometheus_http_response_size_bytes_sum`, gzipped).
4. With --report, runs `gpuscope rightsize --simulate current,exclusive,mig,timeslice,binpack
   --format json` against the store as a user would: wall time and peak resident memory.

Prints one JSON document, with the machine's load average at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rightsize import build, fleet, run_report  # noqa: E402 - after the path set-up
from dashboards.victoria import VictoriaMetrics  # noqa: E402
from exporter.durations import parse_duration  # noqa: E402
from exporter.rightsize import prometheus  # noqa: E402
from exporter.rightsize.fetch import fetch  # noqa: E402
from exporter.rightsize.options import load  # noqa: E402
from exporter.rightsize.prometheus import PrometheusClient  # noqa: E402
from exporter.rightsize.replay.steps import fetch_steps  # noqa: E402
from tests.prometheus_server import running_prometheus  # noqa: E402
from tests.synthetic_history import write_openmetrics  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

    from exporter.rightsize.matrix import Matrix


POLICIES: Final = "current,exclusive,mig,timeslice,binpack"
BATCH_BYTES: Final = 32 * 2**20
"""Text of one import request: the importer holds this and the one request in flight, no more."""
ANSWERED = re.compile(
    r'^prometheus_http_response_size_bytes_sum\{handler="/api/v1/query(?:_range)?"\} (\S+)$',
    re.MULTILINE,
)


def answered_bytes(url: str) -> float:
    """Bytes Prometheus has answered to instant and range queries since it started."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(found) for found in ANSWERED.findall(text))


class _BodiesRead:
    """Counts the bytes of every answer body the report's client reads (after gzip), by
    wrapping `prometheus._bounded_body` for the benchmark's process."""

    def __init__(self) -> None:
        self.bytes = 0
        self._read = prometheus._bounded_body

    def install(self) -> None:
        async def counted(response: Any, limit: int) -> bytearray | None:
            body = await self._read(response, limit)
            self.bytes += len(body) if body is not None else 0
            return body

        prometheus._bounded_body = counted  # type: ignore[assignment]


class _SamplesRead:
    """Counts the samples of every range answer `client` reads as columns (the replay's)."""

    def __init__(self, client: PrometheusClient) -> None:
        self.samples = 0
        asked = client.query_matrix

        async def counted(*args: Any, **kwargs: Any) -> Matrix:
            matrix = await asked(*args, **kwargs)
            self.samples += matrix.values.size
            return matrix

        client.query_matrix = counted  # type: ignore[method-assign]


def reset_peak_memory() -> None:
    """The process's VmHWM starts again from its resident memory now (Linux, /proc)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


_SAMPLE: Final = re.compile(r"^(\S+) (\d+)$", re.MULTILINE)
_LABEL: Final = re.compile(r'(\w+)="([^"]*)"')


class _Importer:
    """A text stream (what `write_openmetrics` writes to: each call one series' samples, every
    line with the same name and labels) sent to VictoriaMetrics' JSON-line import
    (`/api/v1/import`) in batches of about `BATCH_BYTES`, one in flight while the next is
    written. Each series becomes one line, its labels once: the server parses numbers, not a
    few hundred bytes of labels per sample. Comment lines (`# TYPE`, `# EOF`) are not sent."""

    def __init__(self, url: str, sender: ThreadPoolExecutor) -> None:
        self.url = f"{url}/api/v1/import"
        self.sender = sender
        self.parts: list[str] = []
        self.size = 0
        self.sent_bytes = 0
        self.samples = 0
        self.in_flight: Future[None] | None = None

    def write(self, text: str) -> None:
        if text.startswith("#") or not text:
            return
        name, _, rest = text.partition("{")
        labels = rest[: rest.index("} ")]
        metric = {"__name__": name, **dict(_LABEL.findall(labels))}
        # The samples: each line's value and unix seconds, after the labels.
        found = _SAMPLE.findall(text.replace(f"{name}{{{labels}}} ", ""))
        self.samples += len(found)
        line = (
            f'{{"metric":{json.dumps(metric)},"values":[{",".join(v for v, _ in found)}],'
            f'"timestamps":[{"000,".join(t for _, t in found)}000]}}\n'
        )
        self.parts.append(line)
        self.size += len(line)
        if self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        body = "".join(self.parts).encode()
        self.parts, self.size = [], 0
        self.wait()
        self.sent_bytes += len(body)
        self.in_flight = self.sender.submit(self._post, body)

    def wait(self) -> None:
        if self.in_flight is not None:
            self.in_flight.result()
            self.in_flight = None

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()


def _import_shard(
    url: str, count: int, shard: int, shards: int, end: float, duration: float, interval: float
) -> tuple[int, int]:
    """One process's part of the fleet (every `shards`-th block of 20 workloads: the workloads
    that time-slice a GPU are in one block) imported into `url`: (samples, bytes sent)."""
    workloads = [w for n, w in enumerate(fleet(count)) if (n // 20) % shards == shard]
    with ThreadPoolExecutor(max_workers=1) as sender:
        importer = _Importer(url, sender)
        write_openmetrics(
            importer,  # type: ignore[arg-type] # writes only
            workloads,
            end=end,
            duration=duration,
            interval=interval,
        )
        importer.flush()
        importer.wait()
    return importer.samples, importer.sent_bytes


def import_history(
    victoria: VictoriaMetrics,
    count: int,
    end: float,
    duration: float,
    interval: float,
    *,
    processes: int,
) -> dict[str, float]:
    """The history of `fleet(count)` streamed into `victoria` by `processes` processes (the
    generator's Python is the bottleneck, not the server); searchable on return."""
    began = time.monotonic()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        shards = [
            pool.submit(_import_shard, victoria.url, count, n, processes, end, duration, interval)
            for n in range(processes)
        ]
        done = [shard.result() for shard in shards]
    victoria.api.flush()
    return {
        "samples": sum(samples for samples, _ in done),
        "import_seconds": round(time.monotonic() - began, 1),
        "import_processes": processes,
        "import_mib_sent": round(sum(sent for _, sent in done) / 2**20, 1),
    }


async def measure(
    url: str, end: float, *, window: float, step: str, concurrency: int, prometheus_bytes: bool
) -> dict[str, Any]:
    config = load(
        [
            f"--prometheus={url}",
            f"--end={end:.0f}",
            f"--window={window:.0f}s",
            f"--step={step}",
            f"--prometheus.concurrency={concurrency}",
            f"--simulate={POLICIES}",
        ],
        {},
    )
    bodies = _BodiesRead()
    bodies.install()
    async with PrometheusClient(config.connection) as client:
        began = time.monotonic()
        history = await fetch(
            client,
            selection=config.selection,
            end=config.end,
            window=config.window,
            step=config.step,
            quantile=config.settings.percentile,
            cluster_label=config.cluster_label,
            source=config.source,
        )
        report_seconds = time.monotonic() - began
        report_queries = client.queries_sent
        before = answered_bytes(url) if prometheus_bytes else 0.0
        read_before = bodies.bytes
        samples = _SamplesRead(client)
        reset_peak_memory()
        began, cpu = time.monotonic(), time.process_time()
        steps = await fetch_steps(
            client,
            selection=config.selection,
            end=config.end,
            window=config.window,
            step=config.step,
            cluster_label=config.cluster_label,
            configurations=len(history.workloads),
        )
        seconds, cpu = time.monotonic() - began, time.process_time() - cpu
        peak = peak_memory_mib()
        queries = client.queries_sent - report_queries
    if steps is None:
        raise SystemExit("the replay's fetch was refused (see the warning above)")
    answered = {}
    if prometheus_bytes:
        answered["replay_fetch_mib_answered_gzipped"] = round(
            (answered_bytes(url) - before) / 2**20, 1
        )
    return {
        "step": step,
        "concurrency": concurrency,
        "workload_rows": len(history.workloads),
        "steps": steps.steps,
        "report_fetch_seconds": round(report_seconds, 1),
        "report_fetch_queries": report_queries,
        "replay_fetch_queries": queries,
        "replay_fetch_seconds": round(seconds, 1),
        "replay_fetch_samples": samples.samples,
        "replay_fetch_cpu_seconds": round(cpu, 1),
        "replay_fetch_client_us_per_sample": round(cpu / max(samples.samples, 1) * 1e6, 2),
        "replay_fetch_peak_mib": peak,
        "replay_fetch_mib_read": round((bodies.bytes - read_before) / 2**20, 1),
        **answered,
        "demand_vectors": len(steps.busy),
    }


def _served(
    store: str, root: Path, count: int, interval: float, days: float, *, processes: int
) -> Iterator[tuple[str, float, dict[str, float]]]:
    """(URL, the window's end, what building the history took) of the store serving the fleet's
    history, built in `root` unless it is there already."""
    end = float(int(time.time()) // 300 * 300 - 3600)
    duration = days * 86400 + 3600
    marker = root / "end"
    built: dict[str, float] = {}
    if store == "prometheus":
        data = root / "data"
        if marker.exists() and data.exists():
            end = float(marker.read_text())
        else:
            data.mkdir(exist_ok=True)
            built = build(data, fleet(count), end, duration, interval)
            marker.write_text(f"{end:.0f}")
        with running_prometheus(data, retention="15d", ready_timeout=600) as url:
            yield url, end, built
        return
    with VictoriaMetrics(root / "victoria", ready_timeout=600) as victoria:
        if marker.exists():
            end = float(marker.read_text())
        else:
            built = import_history(victoria, count, end, duration, interval, processes=processes)
            marker.write_text(f"{end:.0f}")
        yield victoria.url, end, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--interval", default="5m", help="scrape interval of the synthetic history")
    parser.add_argument("--step", default="10m")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--store",
        choices=("prometheus", "victoria"),
        default="prometheus",
        help="where the history is served from: promtool blocks in Prometheus, or streamed into"
        " VictoriaMetrics (minutes at 10,000 workloads, where promtool takes hours)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help=f"also run the whole report, gpuscope rightsize --simulate {POLICIES}",
    )
    parser.add_argument(
        "--import-processes",
        type=int,
        default=2,
        help="processes writing the history into VictoriaMetrics (--store victoria)",
    )
    parser.add_argument("--keep", type=Path, help="build the data here (and reuse it if present)")
    args = parser.parse_args()
    interval = parse_duration(args.interval)
    with tempfile.TemporaryDirectory(prefix="gpuscope-bench-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        served = _served(
            args.store, root, args.workloads, interval, args.days, processes=args.import_processes
        )
        url, end, built = next(served)
        try:
            measured = asyncio.run(
                measure(
                    url,
                    end,
                    window=args.days * 86400,
                    step=args.step,
                    concurrency=args.concurrency,
                    prometheus_bytes=args.store == "prometheus",
                )
            )
            if args.report:
                output = root / f"report-{args.store}.json"
                report = run_report(
                    url,
                    end,
                    output,
                    step=args.step,
                    concurrency=args.concurrency,
                    extra=(f"--window={args.days * 86400:.0f}s", f"--simulate={POLICIES}"),
                )
                simulation = json.loads(output.read_text()).get("simulation") or []
                measured["report"] = {
                    **report,
                    "gpus_max": {one["policy"]: one["gpus"]["max"] for one in simulation},
                }
        finally:
            served.close()
    print(
        json.dumps(
            {
                "store": args.store,
                "workloads": args.workloads,
                "days": args.days,
                "interval": args.interval,
                **built,
                **measured,
                "cpus": os.cpu_count(),
                "load_average": [round(load, 2) for load in os.getloadavg()],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
