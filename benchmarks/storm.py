"""A mixed-format scrape storm against a fast sampler, for minutes: sampling must never stall and
no scrape may fail; prints one JSON document.

    .venv/bin/python benchmarks/storm.py [--minutes 10] [--gpus 64] [--interval 100ms]

The daemon (runtime-only virtualenv) simulates `--gpus` H100s (64 by default: a large render is
the widest window for a race between scrapes and the sampler's rendering) sampling every 100 ms.
Four clients scrape as fast as they like with random pauses of up to 1.5 intervals — text and
OpenMetrics, each with and without gzip, on keep-alive connections — while a monitor reads the
cycle counter every second. This is the storm that stopped the sampler of gpuscope 0.1.0 within
seconds (scrapes recorded their format in a set the sampler thread was iterating).

Reported: cycles completed against those expected, the longest stretch without a new cycle, the
scrapes and failures per client, latency percentiles, and the lines the daemon logged at warn or
error.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import percentile  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402
from exporter.durations import parse_duration  # noqa: E402

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


class Client(threading.Thread):
    def __init__(self, port: int, *, openmetrics: bool, gzip: bool, stop: float, pause: float):
        super().__init__(daemon=True)
        self.name = ("openmetrics" if openmetrics else "text") + ("+gzip" if gzip else "")
        self._port = port
        self._headers = {
            **({"Accept": OPENMETRICS} if openmetrics else {}),
            **({"Accept-Encoding": "gzip"} if gzip else {}),
        }
        self._until = stop
        self._pause = pause
        self.latencies: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        pause = random.Random(self.name)
        connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=10)
        while time.monotonic() < self._until:
            sent = time.perf_counter()
            try:
                connection.request("GET", "/metrics", headers=self._headers)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    self.failures.append(f"HTTP {response.status}")
            except (OSError, http.client.HTTPException) as error:
                self.failures.append(repr(error))
                connection.close()
            self.latencies.append(time.perf_counter() - sent)
            time.sleep(pause.uniform(0, self._pause))


def cycles(port: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read().decode()
    connection.close()
    match = re.search(r"^gpuscope_sample_cycles_total (\S+)$", body, re.MULTILINE)
    if match is None:
        raise RuntimeError("no cycle counter in the scrape")
    return float(match[1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--interval", default="100ms")
    args = parser.parse_args()
    interval = parse_duration(args.interval)
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "stderr"
        with serving([f"--simulate={args.gpus}", f"--collect.interval={args.interval}"], log) as (
            _,
            port,
        ):
            time.sleep(2.0)
            seconds = args.minutes * 60
            stop = time.monotonic() + seconds
            clients = [
                Client(port, openmetrics=om, gzip=gz, stop=stop, pause=1.5 * interval)
                for om in (False, True)
                for gz in (False, True)
            ]
            first = cycles(port)
            started = time.monotonic()
            for client in clients:
                client.start()
            last, last_change, longest_stall = first, started, 0.0
            while time.monotonic() < stop:
                time.sleep(1.0)
                now, seen = time.monotonic(), cycles(port)
                if seen > last:
                    last, last_change = seen, now
                longest_stall = max(longest_stall, now - last_change)
            elapsed = time.monotonic() - started
            for client in clients:
                client.join(15)
        logged = [
            line for line in log.read_text().splitlines() if re.search(r"level=(warn|error)", line)
        ]
    latencies = [latency for client in clients for latency in client.latencies]
    failures = sum(len(client.failures) for client in clients)
    report = {
        "benchmark": "storm",
        "node": {"gpus": args.gpus, "collect_interval": args.interval},
        "python": sys.version.split()[0],
        "minutes": round(elapsed / 60, 1),
        "cycles": int(last - first),
        "cycles_expected": int(elapsed / interval),
        "longest_seconds_without_a_new_cycle": round(longest_stall, 1),
        "scrapes": {client.name: len(client.latencies) for client in clients},
        "failed_scrapes": failures,
        "first_failures": [f for client in clients for f in client.failures][:5],
        "scrape_latency_ms": {
            "p50": round(statistics.median(latencies) * 1000, 2),
            "p99": round(percentile(latencies, 0.99) * 1000, 2),
            "max": round(max(latencies) * 1000, 2),
        },
        "warn_or_error_lines": logged[:10],
        "targets": {
            "never stalled (a new cycle at least every 2 s)": longest_stall < 2.0,
            "no scrape failed": failures == 0,
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
