"""Series per node: what one gpuscope daemon asks its users' metrics store to keep; prints one
JSON document.

    .venv/bin/python benchmarks/series.py                  # 8 H100s, 64 processes, 200 pods
    .venv/bin/python benchmarks/series.py --churn-seconds 600

The node is the one of `benchmarks/daemon.py --pods` and `benchmarks/soak.py` (their fleet and
their stand-in API server, kubelet and procfs, reused as they are): 8 simulated H100s, 64
processes each in a pod of its own (time-sliced, 8 per GPU), 200 pods on the node, and the
soak's pod turnover through the watch (`--pod-changes` a second, one in ten a delete and
re-create). The daemon runs as it ships (`benchmarks/runtime.py`) once per configuration:

- `default`: no collector flag;
- `lean` and `full`: the chart's profiles (`PROFILES`, the same flags `daemon.profile` renders);
- `full` with `--compat.dcgm`: everything gpuscope can serve (dcgm-exporter 4.8's shapes, and
  4.9.0's with `--compat.dcgm-version=4.9`).

For each, once the daemon is steady (attribution filled, the 5 s readings in), one scrape as
Prometheus asks for it (OpenMetrics) is counted: its series (sample lines), by family and by
what fills them (each collector, attribution, per-process series, `--compat.dcgm`, the daemon's
own). Then churn: the default and the full configuration are scraped every `--every` seconds for
`--churn-seconds` while the soak's turnover goes on, and every series not in the first scrape is
counted as created, per hour. Pod changes that touch no GPU create no series; what a GPU
workload's turnover costs is given per event (`per_process_restart`, `per_gpu_pod_replaced`:
the series that carry one process's pid, one pod's name) and per hour for a stated rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import Connections, attributed_node, fleet  # noqa: E402
from benchmarks.runtime import serving  # noqa: E402
from exporter.config import BUDGET_SERIES, PROFILES  # noqa: E402
from exporter.metrics.families import ALL_FAMILIES  # noqa: E402

DAEMON_PREFIXES = ("gpuscope_", "process_", "python_")
"""The daemon's own series: its health and footprint."""
STEADY_SECONDS = 12.0
"""A daemon this old has read everything at least twice (throttle time and repairs every 5 s)."""
CONFIGURATIONS: dict[str, list[str]] = {
    "default": [],
    "lean": list(PROFILES["lean"]),
    "full": list(PROFILES["full"]),
    "full+compat.dcgm": [*PROFILES["full"], "--compat.dcgm"],
    "full+compat.dcgm-4.9": [*PROFILES["full"], "--compat.dcgm", "--compat.dcgm-version=4.9"],
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
COLLECTOR_OF = {family.exposed_name: family.collector or "daemon" for family in ALL_FAMILIES}


def parse(body: bytes) -> dict[str, tuple[str, dict[str, str]]]:
    """Each series of an exposition (its name and labels as text) -> (metric name, labels)."""
    series: dict[str, tuple[str, dict[str, str]]] = {}
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise RuntimeError(f"not a sample line: {line[:120]!r}")
        name, labels = match[1], match[2] or ""
        series[name + labels] = (name, dict(_LABEL.findall(labels)))
    return series


def what_fills(name: str) -> str:
    """Which switch a series comes with: a collector (`processes`: per-process series),
    `--compat.dcgm`, or the daemon's own."""
    if name.startswith("DCGM_FI_"):
        return "compat.dcgm"
    if name in COLLECTOR_OF:
        return COLLECTOR_OF[name]
    if name.startswith(DAEMON_PREFIXES):
        return "daemon"
    raise RuntimeError(f"{name}: a series no declared family makes")


def breakdown(series: dict[str, tuple[str, dict[str, str]]]) -> dict[str, object]:
    by_source = Counter(what_fills(name) for name, _ in series.values())
    by_family = Counter(name for name, _ in series.values())
    return {
        "series": len(series),
        "by_source": dict(by_source.most_common()),
        "by_family": dict(by_family.most_common()),
        "with_pid_label": sum("pid" in labels for _, labels in series.values()),
        "with_pod_label": sum("pod" in labels for _, labels in series.values()),
    }


async def scrape(port: int) -> dict[str, tuple[str, dict[str, str]]]:
    async with Connections(port, 1) as client:
        status, body = await client.get()
    if status != 200:
        raise RuntimeError(f"scrape failed (HTTP {status})")
    return parse(body)


async def steady(port: int) -> dict[str, tuple[str, dict[str, str]]]:
    """The first scrape after STEADY_SECONDS whose series are those of the one before."""
    await asyncio.sleep(STEADY_SECONDS)
    previous = await scrape(port)
    for _ in range(30):
        await asyncio.sleep(2.0)
        current = await scrape(port)
        if current.keys() == previous.keys() and any(
            "pod" in labels for _, labels in current.values()
        ):
            return current
        previous = current
    changed = sorted(previous.keys() ^ current.keys())[:5]
    raise RuntimeError(f"the daemon's series did not settle within a minute: {changed}")


async def churn(port: int, seconds: float, every: float) -> dict[str, object]:
    first = await steady(port)
    seen = set(first)
    created: Counter[str] = Counter()
    started = time.monotonic()
    scrapes = 0
    while time.monotonic() - started < seconds:
        await asyncio.sleep(every)
        for key, (name, _) in (await scrape(port)).items():
            if key not in seen:
                seen.add(key)
                created[what_fills(name)] += 1
        scrapes += 1
    elapsed = time.monotonic() - started
    return {
        "seconds": round(elapsed, 1),
        "scrapes": scrapes,
        "series_created": sum(created.values()),
        "series_created_per_hour": round(sum(created.values()) * 3600 / elapsed),
        "by_source": dict(created.most_common()),
    }


def per_event(series: dict[str, tuple[str, dict[str, str]]]) -> dict[str, float]:
    """What one GPU process and one GPU pod carry: the series that would be new when a process
    restarts (new pid) or a pod holding a GPU is replaced (new name, its processes new too)."""
    pids = Counter(labels["pid"] for _, labels in series.values() if "pid" in labels)
    pods = Counter(
        (labels["namespace"], labels["pod"])
        for _, labels in series.values()
        if "pod" in labels and "namespace" in labels and "pid" not in labels
    )
    per_process = sum(pids.values()) / len(pids) if pids else 0.0
    gpu_pods = [key for key in pods if key[0] == "ml"]  # the pods that hold a GPU (daemon.py's)
    per_pod = sum(pods[key] for key in gpu_pods) / len(gpu_pods) if gpu_pods else 0.0
    return {
        "per_process_restart": round(per_process, 1),
        "per_gpu_pod_replaced": round(per_pod + per_process, 1),
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    results: dict[str, object] = {}
    churned: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        fleet_file = scratch / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(fleet(args.gpus, args.processes)))
        with attributed_node(
            scratch, fleet_file, args.processes, args.pods, args.pod_changes
        ) as attribution:
            for name, flags in CONFIGURATIONS.items():
                serve = [f"--simulate={fleet_file}", *attribution, *flags]
                with serving(serve, scratch / f"{name}.log") as (_, port):
                    if name in ("default", "full") and args.churn_seconds > 0:
                        churned[name] = asyncio.run(churn(port, args.churn_seconds, args.every))
                    series = asyncio.run(steady(port))
                results[name] = {"flags": flags, **breakdown(series), **per_event(series)}
    default = results["default"]
    assert isinstance(default, dict)
    events = per_event_rates(results, args)
    return {
        "configurations": results,
        "churn_measured": churned,
        "churn_per_hour_at_stated_turnover": events,
        "budget": {
            "series_per_node": BUDGET_SERIES,
            "default_within": default["series"] <= BUDGET_SERIES,
        },
    }


def per_event_rates(results: dict[str, object], args: argparse.Namespace) -> dict[str, object]:
    """Series created per hour when every GPU pod is replaced every `--gpu-pod-lifetime` minutes
    and, within a pod, each process restarts every `--process-lifetime` minutes."""
    rates: dict[str, object] = {
        "gpu_pods_replaced_per_hour": round(args.processes * 60 / args.gpu_pod_lifetime),
        "process_restarts_per_hour": round(args.processes * 60 / args.process_lifetime),
    }
    for name, result in results.items():
        assert isinstance(result, dict)
        rates[name] = round(
            rates["gpu_pods_replaced_per_hour"] * result["per_gpu_pod_replaced"]  # type: ignore[operator]
            + rates["process_restarts_per_hour"] * result["per_process_restart"]  # type: ignore[operator]
        )
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--pod-changes", type=float, default=5.0, help="the soak's: 5 a second")
    parser.add_argument("--churn-seconds", type=float, default=120.0, help="0: no churn run")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between churn scrapes")
    parser.add_argument(
        "--gpu-pod-lifetime", type=float, default=360.0, help="minutes a GPU pod lives (6 h)"
    )
    parser.add_argument(
        "--process-lifetime", type=float, default=60.0, help="minutes a GPU process lives (1 h)"
    )
    args = parser.parse_args()
    report = {
        "benchmark": "series",
        "node": {
            "gpus": args.gpus,
            "processes": args.processes,
            "pods": args.pods,
            "pod_changes_per_second": args.pod_changes,
            "gpu_pod_lifetime_minutes": args.gpu_pod_lifetime,
            "process_lifetime_minutes": args.process_lifetime,
        },
        "python": sys.version.split()[0],
        **run(args),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
