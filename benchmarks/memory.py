"""Where the daemon's resident memory goes; prints one JSON document.

    .venv/bin/python benchmarks/memory.py                    # imports, the daemon, its heap
    .venv/bin/python benchmarks/memory.py --rounds 3 --seconds 60
    .venv/bin/python benchmarks/memory.py --env MALLOC_ARENA_MAX=4    # a variant of the daemon

Three measurements, each of the daemon as it ships (`benchmarks/runtime.py`'s runtime-only
virtualenv):

1. **imports**: a fresh interpreter imports, one step at a time and in the order the daemon
   does, what `gpuscope serve` loads with attribution on; resident memory (anonymous and
   file-backed apart) after each step is what that step costs. References follow the steps, each
   on top of them: what the daemon imports only for a feature that needs it (`bcrypt` for basic
   auth, `exporter.dcgm` for `--compat.dcgm`, the profile reader for `--calibration.path`), then
   the `kubernetes` package (what the daemon loaded before it read kubeconfigs itself, and what
   a kubeconfig with an auth-provider still loads, from the `auth-providers` extra); and
   `python -X importtime`'s slowest packages.
2. **daemon**: `gpuscope serve` on `benchmarks/daemon.py --pods`'s node (8 simulated H100s, 64
   processes in pods of their own, `--pods` pods, `--pod-changes` changes a second through the
   stand-in API server's watch, the real gRPC kubelet, a generated procfs), scraped once a
   second as Prometheus would; resident memory when it is ready and after `--seconds`, its
   peak, and its threads, in `--rounds` rounds (medians, and every round).
3. **heap**: the same node in process (the simulator's pods as the attribution source, every
   snapshot rendered), traced with tracemalloc after warm cycles: the Python objects alive,
   largest first by the file that allocated them (the label caches, the snapshot, the families).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import Connections, attributed_node, fleet, peak_rss_bytes  # noqa: E402
from benchmarks.dcgm import with_pods  # noqa: E402
from benchmarks.runtime import runtime_python, serving  # noqa: E402

MIB = 2**20
IMPORT_STEPS = (
    "ssl",
    "asyncio",
    "yaml",
    "pynvml",
    "prometheus_client",
    "httptools",
    "exporter.cli",
    "exporter.attribution.live",
)
"""What `gpuscope serve` imports, in its order; each step's cost is what it adds to the ones before."""
REFERENCES = (
    "bcrypt",
    "exporter.dcgm",
    "exporter.calibration.parse",
    "kubernetes.client",
)
"""Imported only when a feature needs them (`tests/lazy_imports.py`), each on top of the steps;
the last is what the daemon once loaded for every cluster and now only for a kubeconfig's
auth-provider, kept for comparison. (aiohttp, which the daemon once served HTTP with, is no longer
in its install: the rightsizing job's extra.)"""
_MEASURE = """
import importlib, json, sys
def rss():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields
steps = [{"step": "python", **rss(), "modules": len(sys.modules)}]
for name in sys.argv[1:]:
    importlib.import_module(name)
    steps.append({"step": name, **rss(), "modules": len(sys.modules)})
print(json.dumps(steps))
"""


def status(pid: int) -> dict[str, float]:
    """Resident memory (MiB: all, anonymous, file-backed) and threads of a process."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
        elif key == "Threads":
            fields[key] = int(value)
    return {
        "rss_mib": fields["VmRSS"],
        "anon_mib": fields["RssAnon"],
        "file_mib": fields["RssFile"],
        "threads": fields["Threads"],
    }


def imports(python: str) -> dict[str, object]:
    """Each import step's cost in a fresh interpreter, then the references on top."""
    result = subprocess.run(
        [python, "-c", _MEASURE, *IMPORT_STEPS, *REFERENCES],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    steps = json.loads(result.stdout)
    rows = []
    for before, after in itertools.pairwise(steps):
        rows.append(
            {
                "step": after["step"],
                "reference": after["step"] in REFERENCES,
                "rss_mib": round(after["VmRSS"], 1),
                "adds_mib": round(after["VmRSS"] - before["VmRSS"], 1),
                "adds_anon_mib": round(after["RssAnon"] - before["RssAnon"], 1),
                "adds_file_mib": round(after["RssFile"] - before["RssFile"], 1),
                "modules": after["modules"],
            }
        )
    return {"interpreter_mib": round(steps[0]["VmRSS"], 1), "steps": rows}


def import_time(python: str, top: int = 12) -> list[dict[str, object]]:
    """`-X importtime`'s top-level packages of the daemon's imports, slowest first (ms)."""
    result = subprocess.run(
        [python, "-X", "importtime", "-c", f"import {', '.join(IMPORT_STEPS)}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    packages: dict[str, int] = {}
    for line in result.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        if name.startswith(" ") and not name.startswith("  "):  # a top-level import
            packages[name.strip().split(".")[0]] = packages.get(
                name.strip().split(".")[0], 0
            ) + int(parts[1])
    ranked = sorted(packages.items(), key=lambda item: -item[1])[:top]
    return [{"package": name, "ms": round(micros / 1000, 1)} for name, micros in ranked]


async def watched(pid: int, port: int, seconds: float) -> dict[str, object]:
    async with Connections(port, 1) as client:
        ready = status(pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            code, _ = await client.get()
            if code != 200:
                raise RuntimeError(f"scrape failed (HTTP {code})")
            await asyncio.sleep(1.0)
        after = status(pid)
    return {
        "at_ready": ready,
        "after": after,
        "peak_mib": round(max(peak_rss_bytes(pid) / MIB, after["rss_mib"]), 1),
    }


def daemon(args: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    rounds = []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        fleet_file = scratch / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(fleet(args.gpus, args.processes)))
        with attributed_node(
            scratch, fleet_file, args.processes, args.pods, args.pod_changes
        ) as attribution:
            for _ in range(args.rounds):
                flags = [f"--simulate={fleet_file}", *attribution, *args.serve_flag]
                with serving(flags, scratch / "stderr", env=env) as (process, port):
                    time.sleep(2.0)  # the first cycles, as benchmarks/daemon.py
                    rounds.append(asyncio.run(watched(process.pid, port, args.seconds)))
    after = [entry["after"]["rss_mib"] for entry in rounds]  # type: ignore[index]
    return {
        "env": env,
        "serve_flags": args.serve_flag,
        "rss_mib_after_median": round(statistics.median(after), 1),
        "rounds": rounds,
    }


async def heap(args: argparse.Namespace, top: int = 15) -> dict[str, object]:
    """Python objects the in-process daemon of the same node holds after `--cycles` cycles,
    each rendered (allocated since the node was built: the imports are not counted)."""
    from exporter.config import ServeConfig  # noqa: PLC0415 - after tracemalloc starts
    from exporter.metrics.exposition import OPENMETRICS  # noqa: PLC0415
    from exporter.metrics.families import BuildInfo  # noqa: PLC0415
    from exporter.simulator import load_fleet  # noqa: PLC0415
    from tests.simulated_node import sampled_node  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as scratch:
        fleet_file = Path(scratch) / "fleet.yaml"
        document = with_pods(fleet(args.gpus, args.processes), args.pods, args.gpus)
        fleet_file.write_text(yaml.safe_dump(document))
        loaded = load_fleet(fleet_file)
    tracemalloc.start()
    async with sampled_node(
        loaded, ServeConfig(), node="benchmark-node", build=BuildInfo("benchmark")
    ) as (sampling, clock):
        for _ in range(args.cycles):
            sampling.cycle().render(OPENMETRICS)
            clock.advance(1.0)
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
    statistics_by_file = snapshot.statistics("filename")
    total = sum(stat.size for stat in statistics_by_file)
    return {
        "cycles": args.cycles,
        "traced_mib": round(total / MIB, 2),
        "by_file": [
            {
                "file": _short(stat.traceback[0].filename),
                "kib": round(stat.size / 1024),
                "blocks": stat.count,
            }
            for stat in statistics_by_file[:top]
        ],
    }


def _short(filename: str) -> str:
    for marker in ("/exporter/", "/site-packages/", "/lib/python3"):
        if marker in filename:
            return (
                filename.split(marker, 1)[1]
                if marker != "/exporter/"
                else "exporter/" + (filename.split(marker, 1)[1])
            )
    return filename


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--pod-changes", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="each round's run")
    parser.add_argument("--cycles", type=int, default=30, help="in-process cycles traced")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="for the daemon"
    )
    parser.add_argument("--serve-flag", action="append", default=[], metavar="FLAG")
    parser.add_argument("--skip", action="append", default=[], choices=("imports", "heap"))
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    python = runtime_python()
    report: dict[str, object] = {
        "benchmark": "memory",
        "node": {
            "gpus": args.gpus,
            "processes": args.processes,
            "pods": args.pods,
            "pod_changes_per_second": args.pod_changes,
        },
        "python": sys.version.split()[0],
    }
    if "imports" not in args.skip:
        report["imports"] = imports(python)
        report["import_time_ms"] = import_time(python)
    report["daemon"] = daemon(args, env)
    if "heap" not in args.skip:
        report["heap"] = asyncio.run(heap(args))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
