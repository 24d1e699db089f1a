"""Benchmark `gpuscope rightsize` against a hostile PromQL API that answers every per-pod batch
with every pod's series (what a server of an attacker's, or one ignoring matchers, can do).

    .venv/bin/python benchmarks/hostile_prometheus.py [--pods 10000] [--code DIR]
    .venv/bin/python benchmarks/hostile_prometheus.py --shapes [--code DIR]

The stand-in (tests/rightsize_hostile.py) answers the job's queries about `--pods` pods, each
holding one GPU; the per-pod queries (container CPU and limits, asked in batches of pods, over
the window and each shorter term) are answered honestly first, then with every pod's series in
every batch. For each, the job runs as a user runs it (`--format json`) and its wall time and
peak resident memory (wait4) are measured. `--code DIR` runs the `exporter` package found in DIR
instead of this checkout's (e.g. an older commit's, extracted with `git archive`), to measure
before a change. Prints one JSON document.

`--shapes` instead answers every query with one body just under `--prometheus.max-response-size`
(31 MiB of its 32) shaped to cost the most once read (`SHAPES`), and measures the job's peak
resident memory against each; a run is stopped at `--give-up-mib` or after `--give-up-seconds`
(as an older reader could take gigabytes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.rightsize_hostile import END, StandIn, held_pod  # noqa: E402 - after the path set-up
from tests.rightsize_run import serving  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""
SHAPE_BYTES = 31 * 2**20
_HEAD = '{"status":"success","data":{"resultType":"vector","result":['


def _many_labels() -> str:
    element = (
        '{"metric":{'
        + ",".join(f'"l{n}":"{n}"' for n in range(300))
        + '},"value":[1780000200,"1"]}'
    )
    return _HEAD + ",".join([element] * (SHAPE_BYTES // (len(element) + 1))) + "]}}"


SHAPES: dict[str, Callable[[], str]] = {
    "error_list": lambda: (
        '{"status":"error","error":[' + ",".join(["[]"] * (SHAPE_BYTES // 3)) + "]}"
    ),
    "warnings_objects": lambda: (
        '{"status":"success","warnings":['
        + ",".join(["{}"] * (SHAPE_BYTES // 3))
        + '],"data":{"resultType":"vector","result":[]}}'
    ),
    "element_flat_array": lambda: (
        _HEAD
        + '{"metric":{"pod":"x"},"value":[1,"1"],"pad":['
        + ",".join(["{}"] * (SHAPE_BYTES // 3))
        + "]}]}}"
    ),
    "many_labels": _many_labels,
    "astral_string": lambda: (
        '{"status":"success","error":"\U0001f600","data":{"resultType":"vector","result":[]},'
        f'"pad":"{"a" * SHAPE_BYTES}"}}'
    ),
    "tiny_elements": lambda: (
        _HEAD
        + ",".join(
            f'{{"metric":{{"pod":"p{n}"}},"value":[1780000200,"1"]}}'
            for n in range(SHAPE_BYTES // 56)
        )
        + "]}}"
    ),
    "long_label_value": lambda: (
        _HEAD + '{"metric":{"pod":"' + "p" * SHAPE_BYTES + '"},"value":[1780000200,"1"]}]}}'
    ),
}
"""Bodies each query is answered with: every one is valid JSON within the size limit."""

WATCH = """
import os, signal, sys, time
deadline = time.monotonic() + float(sys.argv[2])
limit = int(sys.argv[3]) * 2**20
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[4], sys.argv[4:])
stopped = ""
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    try:
        with open(f"/proc/{pid}/status") as proc:
            rss = next(int(line.split()[1]) * 1024 for line in proc if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        rss = 0
    if not stopped and (rss > limit or time.monotonic() > deadline):
        stopped = "memory" if rss > limit else "time"
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
open(sys.argv[1], "w").write(f"{usage.ru_maxrss * 1024} {stopped}")
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs the job, stopped past a memory or time limit; writes its peak and why it was stopped."""


def run(url: str, code: Path) -> dict[str, object]:
    """The job against `url`: exit status, seconds, peak resident MiB, workloads reported."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as peak:
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                MEASURE,
                peak.name,
                sys.executable,
                "-m",
                "exporter",
                "rightsize",
                f"--prometheus={url}",
                f"--end={END}",
                "--format=json",
            ],
            capture_output=True,
            text=True,
            cwd=code,
            env={**os.environ, "PYTHONPATH": str(code)},
            timeout=3600,
            check=False,
        )
        seconds = time.monotonic() - started
        rss = int(peak.read() or 0)
    workloads = len(json.loads(result.stdout)["workloads"]) if result.returncode == 0 else None
    return {
        "exit": result.returncode,
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(rss / 2**20),
        "workloads": workloads,
        "error": result.stderr.strip().splitlines()[-1:] if result.returncode else [],
    }


def run_shape(url: str, code: Path, *, seconds: float, mib: int) -> dict[str, object]:
    """The job against `url` under `WATCH`: exit status, seconds, peak resident MiB, and
    whether it was stopped (for memory or time), with its last line."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as peak:
        started = time.monotonic()
        job = [
            "-m",
            "exporter",
            "rightsize",
            f"--prometheus={url}",
            f"--end={END}",
            "--format=json",
        ]
        result = subprocess.run(
            [sys.executable, "-c", WATCH, peak.name, str(seconds), str(mib), sys.executable, *job],
            capture_output=True,
            text=True,
            cwd=code,
            env={**os.environ, "PYTHONPATH": str(code)},
            timeout=seconds + 120,
            check=False,
        )
        elapsed = time.monotonic() - started
        rss, _, stopped = peak.read().partition(" ")
    return {
        "exit": result.returncode,
        "stopped": stopped or None,
        "seconds": round(elapsed, 1),
        "peak_rss_mib": round(int(rss or 0) / 2**20),
        "last_line": result.stderr.strip().splitlines()[-1:],
    }


def shapes(code: Path, *, seconds: float, mib: int, only: Sequence[str] = ()) -> dict[str, object]:
    """The job's peak memory against every shape of `SHAPES` (or those named in `only`)."""
    found: dict[str, object] = {"body_mib": SHAPE_BYTES / 2**20, "code": str(code)}
    for name, make in SHAPES.items():
        if only and name not in only:
            continue
        body = make().encode()

        async def canned(request: web.Request, body: bytes = body) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        with serving(canned) as url:
            found[name] = run_shape(url, code, seconds=seconds, mib=mib)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--shapes", action="store_true", help="hostile shapes, not many pods")
    parser.add_argument("--give-up-seconds", type=float, default=180.0)
    parser.add_argument("--give-up-mib", type=int, default=3072)
    parser.add_argument("--shape", action="append", choices=list(SHAPES), default=[])
    args = parser.parse_args()
    if args.shapes:
        found = shapes(
            args.code.resolve(), seconds=args.give_up_seconds, mib=args.give_up_mib, only=args.shape
        )
        found["load_average"] = [round(load, 2) for load in os.getloadavg()]
        print(json.dumps(found, indent=1))
        return
    pods = [held_pod(f"w{n:05d}", n, namespace=f"team-{n % 20:02d}") for n in range(args.pods)]
    found: dict[str, object] = {"pods": args.pods, "code": str(args.code)}
    for name, every in (("honest", False), ("every_series_in_every_batch", True)):
        stand_in = StandIn(pods, every_series=every)
        with serving(stand_in.handle) as url:
            found[name] = {**run(url, args.code.resolve()), "queries": len(stand_in.queries)}
    found["load_average"] = [round(load, 2) for load in os.getloadavg()]
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
