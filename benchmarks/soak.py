"""Soak the daemon: a simulated node with pod attribution, sampled fast and scraped continuously
for a long time, with resident memory read every `--every`; prints one JSON document.

    .venv/bin/python benchmarks/soak.py                      # 30 minutes at 100 ms: ~18,000 cycles
    .venv/bin/python benchmarks/soak.py --minutes 3 --warmup 1   # a smoke run

The node is the one of `benchmarks/daemon.py --pods`: 8 simulated H100s, 64 processes, each in a
pod of its own (time-sliced, 8 per GPU), more pods beside them, and `--pod-changes` pod updates
per second through the stand-in API server's watch (one in ten a delete and re-create), with a
real gRPC pod-resources server and a generated procfs tree; both stand-ins run in a process of
their own. One client scrapes `--scrapes` times a second, asking for OpenMetrics as Prometheus
does. Pass: resident memory at the end is within 5% of what it was when the warm-up ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import (  # noqa: E402
    Connections,
    attributed_node,
    cpu_seconds,
    cycles,
    fleet,
    rss_bytes,
)
from benchmarks.runtime import serving  # noqa: E402
from exporter.durations import parse_duration  # noqa: E402

MIB = 2**20
GROWTH_LIMIT = 0.05


async def soak(pid: int, port: int, args: argparse.Namespace) -> dict[str, object]:
    seconds = args.minutes * 60
    warmup = args.warmup * 60
    samples: list[tuple[float, float]] = []  # (minutes since start, RSS MiB)
    scrapes = errors = 0
    async with Connections(port, 4) as client:
        started = time.monotonic()
        cpu_start, cycles_start = cpu_seconds(pid), await cycles(client)
        next_sample = started
        next_scrape = started
        while (now := time.monotonic()) < started + seconds:
            if now >= next_sample:
                samples.append((round((now - started) / 60, 2), round(rss_bytes(pid) / MIB, 2)))
                print(f"soak: {samples[-1][0]:6.2f} min  RSS {samples[-1][1]} MiB", file=sys.stderr)
                next_sample += args.every
            try:
                status, _ = await client.get()
                errors += status != 200
            except (OSError, asyncio.IncompleteReadError):
                errors += 1
            scrapes += 1
            next_scrape += 1 / args.scrapes
            await asyncio.sleep(max(0.0, next_scrape - time.monotonic()))
        samples.append((round(seconds / 60, 2), round(rss_bytes(pid) / MIB, 2)))
        cycles_end, cpu_end = await cycles(client), cpu_seconds(pid)
    after_warmup = [rss for minute, rss in samples if minute >= args.warmup]
    at_warmup, at_end = after_warmup[0], after_warmup[-1]
    growth = (at_end - at_warmup) / at_warmup
    cycle_count = cycles_end - cycles_start
    return {
        "rss_mib_at_start": samples[0][1],
        "rss_mib_at_warmup": at_warmup,
        "rss_mib_at_end": at_end,
        "rss_mib_max_after_warmup": max(after_warmup),
        "growth_after_warmup_percent": round(100 * growth, 2),
        "cycles": int(cycle_count),
        "cycles_expected": int(seconds / args.interval_seconds),
        "cpu_seconds_per_cycle": round((cpu_end - cpu_start) / max(cycle_count, 1), 5),
        "scrapes": scrapes,
        "scrape_errors": errors,
        "rss_mib_over_time": samples,
        "pass": growth <= GROWTH_LIMIT and errors == 0,
        "warmup_seconds": warmup,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before the baseline")
    parser.add_argument("--interval", default="100ms", help="--collect.interval")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between RSS readings")
    parser.add_argument("--scrapes", type=float, default=10.0, help="scrapes per second")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--pod-changes", type=float, default=5.0)
    args = parser.parse_args()
    args.interval_seconds = parse_duration(args.interval)

    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        fleet_file = scratch / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(fleet(args.gpus, args.processes)))
        log = scratch / "stderr"
        with attributed_node(
            scratch, fleet_file, args.processes, args.pods, args.pod_changes
        ) as attribution:
            flags = [
                f"--simulate={fleet_file}",
                f"--collect.interval={args.interval}",
                *attribution,
            ]
            try:
                with serving(flags, log) as (daemon, port):
                    time.sleep(2.0)
                    results = asyncio.run(soak(daemon.pid, port, args))
            except RuntimeError as error:
                raise SystemExit(str(error)) from error
        warnings = [
            line
            for line in log.read_text().splitlines()
            if "level=warn" in line or "level=error" in line
        ]
    report = {
        "benchmark": "soak",
        "node": {
            "gpus": args.gpus,
            "processes": args.processes,
            "pods": args.pods,
            "pod_changes_per_second": args.pod_changes,
            "collect_interval": args.interval,
            "scrapes_per_second": args.scrapes,
            "minutes": args.minutes,
        },
        "python": sys.version.split()[0],
        **results,
        "daemon_warnings": warnings[:20],
    }
    print(json.dumps(report, indent=2))
    return 0 if results["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
