"""Benchmark the policy replay's per-step history fetch (`exporter/rightsize/replay/steps.py`)
against a real Prometheus holding N workloads x 14 days of backfilled history.

    .venv/bin/python benchmarks/replay_queries.py [--workloads 1000] [--days 14]
        [--interval 5m] [--step 10m] [--concurrency 4] [--keep DIR]

1. Builds the history as `benchmarks/rightsize.py` does (the same fleet of ten behaviours,
   promtool blocks; reused from --keep DIR when it holds them, its `end` file the window's end).
2. Serves it from Prometheus (loopback, default query limits), runs the report's own history
   fetch once (`fetch.fetch`: it sizes the replay's queries by the workload rows), then the
   replay's fetch alone, through the report's client at --concurrency.
3. Measures the replay fetch's queries, wall time, the process's peak resident memory during it
   (VmHWM, reset just before), and the bytes Prometheus answered to those queries (its own
   `prometheus_http_response_size_bytes_sum` for the query handler, before and after).

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rightsize import build, fleet  # noqa: E402 - after the path set-up above
from exporter.durations import parse_duration  # noqa: E402
from exporter.rightsize.fetch import fetch  # noqa: E402
from exporter.rightsize.options import load  # noqa: E402
from exporter.rightsize.prometheus import PrometheusClient  # noqa: E402
from exporter.rightsize.replay.steps import fetch_steps  # noqa: E402
from tests.prometheus_server import running_prometheus  # noqa: E402

ANSWERED = re.compile(
    r'^prometheus_http_response_size_bytes_sum\{handler="/api/v1/query(?:_range)?"\} (\S+)$',
    re.MULTILINE,
)


def answered_bytes(url: str) -> float:
    """Bytes Prometheus has answered to instant and range queries since it started."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(found) for found in ANSWERED.findall(text))


def reset_peak_memory() -> None:
    """The process's VmHWM starts again from its resident memory now (Linux, /proc)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def measure(
    url: str, end: float, *, window: float, step: str, concurrency: int
) -> dict[str, Any]:
    config = load(
        [
            f"--prometheus={url}",
            f"--end={end:.0f}",
            f"--window={window:.0f}s",
            f"--step={step}",
            f"--prometheus.concurrency={concurrency}",
            "--simulate=current,exclusive,mig,timeslice,binpack",
        ],
        {},
    )
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
        before = answered_bytes(url)
        reset_peak_memory()
        began = time.monotonic()
        steps = await fetch_steps(
            client,
            selection=config.selection,
            end=config.end,
            window=config.window,
            step=config.step,
            cluster_label=config.cluster_label,
            configurations=len(history.workloads),
        )
        seconds = time.monotonic() - began
        peak = peak_memory_mib()
        queries = client.queries_sent - report_queries
    if steps is None:
        raise SystemExit("the replay's fetch was refused (see the warning above)")
    answered = answered_bytes(url) - before
    return {
        "step": step,
        "concurrency": concurrency,
        "workload_rows": len(history.workloads),
        "steps": steps.steps,
        "report_fetch_seconds": round(report_seconds, 1),
        "report_fetch_queries": report_queries,
        "replay_fetch_queries": queries,
        "replay_fetch_seconds": round(seconds, 1),
        "replay_fetch_peak_mib": peak,
        "replay_fetch_bytes_read": round(answered),
        "replay_fetch_mib_read": round(answered / 2**20, 1),
        "demand_vectors": len(steps.busy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--interval", default="5m", help="scrape interval of the synthetic history")
    parser.add_argument("--step", default="10m")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="build the data here (and reuse it if present)")
    args = parser.parse_args()
    interval = parse_duration(args.interval)
    end = float(int(time.time()) // 300 * 300 - 3600)
    duration = args.days * 86400 + 3600
    with tempfile.TemporaryDirectory(prefix="gpuscope-bench-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        data, marker = root / "data", root / "end"
        built: dict[str, float] = {}
        if marker.exists() and data.exists():
            end = float(marker.read_text())
        else:
            data.mkdir(exist_ok=True)
            built = build(data, fleet(args.workloads), end, duration, interval)
            marker.write_text(f"{end:.0f}")
        with running_prometheus(data, retention="15d", ready_timeout=600) as url:
            measured = asyncio.run(
                measure(
                    url,
                    end,
                    window=args.days * 86400,
                    step=args.step,
                    concurrency=args.concurrency,
                )
            )
    print(
        json.dumps(
            {
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
