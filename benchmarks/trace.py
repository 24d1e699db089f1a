"""Benchmark the on-demand GPU trace; prints one JSON document.

    .venv/bin/python benchmarks/trace.py [--seconds 5]

`gpuscope serve --simulate examples/fleet.yaml --web.enable-trace` (five GPUs, eight pods, the
default 1 s interval) is asked for an N-second trace of every GPU while /metrics is scraped every
100 ms. Reported: the fewest and most points per counter per GPU (target: at least 9 x N, the
issue's "a 5-second trace holds >= 45 samples per counter per GPU"), the pods' tracks per GPU,
the answer's size and time, the slowest scrape meanwhile, and the daemon's CPU time over the
trace against the same time without one (its cost).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNTERS = ("utilization", "memory_used", "power", "sm_clock")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return bytes(answer.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    seconds = parser.parse_args().seconds
    command = [sys.executable, "-m", "exporter", "serve", "--simulate=examples/fleet.yaml"]
    command += ["--web.enable-trace", "--web.listen-address=127.0.0.1:0"]
    daemon = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.stderr is not None
        port = None
        for line in daemon.stderr:
            found = re.search(r"listening.*127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found[1])
                break
        assert port is not None, "the daemon did not start"
        threading.Thread(target=lambda: [None for _ in daemon.stderr], daemon=True).start()
        base = f"http://127.0.0.1:{port}"
        while True:
            try:
                get(base + "/-/ready", 1)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2)  # past the first cycles' one-off work
        before = cpu_seconds(daemon.pid)
        time.sleep(seconds)
        idle_cpu = cpu_seconds(daemon.pid) - before

        answer: list[bytes] = []
        slowest = 0.0
        scrapes = 0
        before = cpu_seconds(daemon.pid)
        started = time.monotonic()
        tracing = threading.Thread(
            target=lambda: answer.append(get(f"{base}/debug/gpu-trace?seconds={seconds}", 90))
        )
        tracing.start()
        while tracing.is_alive():
            began = time.monotonic()
            get(base + "/metrics", 10)
            slowest = max(slowest, time.monotonic() - began)
            scrapes += 1
            time.sleep(0.1)
        tracing.join()
        answered = time.monotonic() - started
        traced_cpu = cpu_seconds(daemon.pid) - before
    finally:
        daemon.terminate()
        daemon.wait(10)
    events = json.loads(answer[0])["traceEvents"]
    counts = Counter((e["pid"], e["name"]) for e in events if e["ph"] == "C")
    pods: dict[int, int] = defaultdict(int)
    for pid, name in counts:
        if name not in COUNTERS:
            pods[pid] += 1
    per_counter = [count for (_, name), count in counts.items() if name in COUNTERS]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "gpus": sum(1 for e in events if e["name"] == "process_name"),
                "points_per_counter_per_gpu": {"min": min(per_counter), "max": max(per_counter)},
                "target_min": 9 * seconds,
                "pod_tracks_per_gpu": dict(sorted(pods.items())),
                "answer_bytes": len(answer[0]),
                "answer_seconds": round(answered, 2),
                "scrapes_meanwhile": scrapes,
                "slowest_scrape_seconds": round(slowest, 3),
                "daemon_cpu_seconds": {
                    "without_trace": round(idle_cpu, 2),
                    "with_trace": round(traced_cpu, 2),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
