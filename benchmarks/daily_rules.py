"""The rules' daily windows on a day-old fleet: what each `[1d]` recording rule costs once a day
of what it reads is there; prints one JSON document.

    .venv/bin/python benchmarks/daily_rules.py                # 1,000 nodes: ~15 min, ~25 GB of disk
    .venv/bin/python benchmarks/daily_rules.py --nodes 20     # the same in a minute

`benchmarks/fleet.py` runs a fleet for minutes, so the rules' `[1d]` windows hold minutes of
samples there. This writes what those rules read, a day of it at the rules' evaluation interval
(one sample a minute), for the fleet of `fleet.py` (8 GPUs and 64 allocations a node, time-sliced
8 to a GPU; 64 workloads a node spread over groups of 25 nodes and 10 namespaces):

- `allocation:gpu_pod_busy_seconds:rate5m`, one series per allocation (64,000 at 1,000 nodes);
- `gpu:gpu_busy_seconds:rate5m` and `gpu:gpu_memory_used_bytes:max1h`, one per GPU;
- `namespace_workload_model:gpu_allocation:share_sum`, `…:gpu_pod_busy_seconds:rate5m` and
  `…:gpu_pod_memory_used_bytes:max1h`, one per workload;

as OpenMetrics made into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`, loaded by
Debian's Prometheus and imported into VictoriaMetrics with `vmctl` (the same samples in both).
Then every recording rule of deploy/prometheus/gpuscope.rules.yaml whose window is a day is
evaluated as the rule engine evaluates it, an instant query at the day's end, `--repeats` times
on each store: the median and worst time of each, the series it gives, and each group's daily
rules' total against the group's interval.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Final

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fleet import prometheus, promtool_blocks  # noqa: E402
from dashboards.live import RULE_FILES, wait_until  # noqa: E402
from dashboards.victoria import VictoriaMetrics  # noqa: E402

Json = dict[str, Any]

STEP: Final = 60
"""Seconds between samples: the rules' evaluation interval."""
DAY: Final = 86400
GPUS: Final = 8
ALLOCATIONS: Final = 64
"""Per node, 8 to a GPU, each a pod of its own."""
WORKLOADS_PER_NODE: Final = 64
NODES_PER_WORKLOAD: Final = 25
NAMESPACES: Final = 10
MODEL: Final = "NVIDIA H100 80GB HBM3"
QUERY_TIMEOUT: Final = 600


def daily_rules() -> list[tuple[str, str, str]]:
    """(group, record, expr) of every recording rule whose window is a day."""
    return [
        (group["name"], rule["record"], " ".join(rule["expr"].split()))
        for file in RULE_FILES
        for group in yaml.safe_load(file.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
        if "record" in rule and "[1d" in rule["expr"]
    ]


def group_intervals() -> dict[str, float]:
    """Each group's evaluation interval (seconds; Prometheus' global default where unset)."""
    units = {"s": 1, "m": 60, "h": 3600}
    found = {}
    for file in RULE_FILES:
        for group in yaml.safe_load(file.read_text(encoding="utf-8"))["groups"]:
            spelled = str(group.get("interval", "1m"))
            found[group["name"]] = float(spelled[:-1]) * units[spelled[-1]]
    return found


def workload(node: int, number: int) -> tuple[str, str]:
    """(namespace, workload) of a node's `number`-th allocation, as fleet.py's relabelling
    spreads them: a workload spans a group of nodes."""
    group = node // NODES_PER_WORKLOAD
    name = f"wl-{group:03d}-{number:02d}"
    return f"ns-{(group * WORKLOADS_PER_NODE + number) % NAMESPACES}", name


def write_day(path: Path, nodes: int, end: int) -> Json:
    """A day of the daily rules' inputs as OpenMetrics; what was written."""
    stamps = [str(end - DAY + k * STEP) for k in range(DAY // STEP + 1)]
    count = len(stamps)
    shape = [0.5 + 0.4 * math.sin(2 * math.pi * k / count) for k in range(count)]
    busy = [f"{value:.4g}" for value in shape]
    memory = [f"{value * 60e9:.6g}" for value in shape]
    series = samples = 0

    def write(out: Any, head: str, values: list[str], phase: int) -> None:
        nonlocal series, samples
        out.write(
            "".join(
                f"{head} {values[(k + phase) % count]} {stamp}\n" for k, stamp in enumerate(stamps)
            )
        )
        series += 1
        samples += count

    workloads = sorted(
        {workload(node, n) for node in range(nodes) for n in range(WORKLOADS_PER_NODE)}
    )
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE allocation:gpu_pod_busy_seconds:rate5m gauge\n")
        for node in range(nodes):
            for number in range(ALLOCATIONS):
                namespace, name = workload(node, number)
                labels = (
                    f'container="main",instance="node-{node:04d}",model="{MODEL}",'
                    f'namespace="{namespace}",node="node-{node:04d}",'
                    f'pod="pod-{node:04d}-{number:02d}",uuid="GPU-{node:04d}-{number // 8}",'
                    f'workload="{name}",workload_kind="Deployment"'
                )
                write(out, f"allocation:gpu_pod_busy_seconds:rate5m{{{labels}}}", busy, number)
        for metric, values in (
            ("gpu:gpu_busy_seconds:rate5m", busy),
            ("gpu:gpu_memory_used_bytes:max1h", memory),
        ):
            out.write(f"# TYPE {metric} gauge\n")
            for node in range(nodes):
                for gpu in range(GPUS):
                    labels = (
                        f'gpu="{gpu}",instance="node-{node:04d}",model="{MODEL}",'
                        f'node="node-{node:04d}",uuid="GPU-{node:04d}-{gpu}"'
                    )
                    write(out, f"{metric}{{{labels}}}", values, gpu)
        for metric, values in (
            ("namespace_workload_model:gpu_allocation:share_sum", busy),
            ("namespace_workload_model:gpu_pod_busy_seconds:rate5m", busy),
            ("namespace_workload_model:gpu_pod_memory_used_bytes:max1h", memory),
        ):
            out.write(f"# TYPE {metric} gauge\n")
            for number, (namespace, name) in enumerate(workloads):
                labels = (
                    f'model="{MODEL}",namespace="{namespace}",workload="{name}",'
                    'workload_kind="Deployment"'
                )
                write(out, f"{metric}{{{labels}}}", values, number)
        out.write("# EOF\n")
    return {"series": series, "samples": samples, "bytes": path.stat().st_size}


def instant(url: str, expr: str, at: float) -> tuple[float, int]:
    """Seconds an instant query took and the series it gave (raises on an error)."""
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    began = time.monotonic()
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=QUERY_TIMEOUT) as answer:
        document = json.load(answer)
    took = time.monotonic() - began
    if document.get("status") != "success":
        raise RuntimeError(f"{expr}: {document.get('error')}")
    return took, len(document["data"]["result"])


def evaluate(url: str, rules: list[tuple[str, str, str]], at: float, repeats: int) -> list[Json]:
    measured = []
    for group, record, expr in rules:
        runs = [instant(url, expr, at) for _ in range(repeats)]
        times = [took for took, _ in runs]
        measured.append(
            {
                "group": group,
                "record": record,
                "series": runs[-1][1],
                "median_seconds": round(statistics.median(times), 3),
                "max_seconds": round(max(times), 3),
            }
        )
    return measured


def by_group(measured: list[Json], intervals: dict[str, float]) -> dict[str, Json]:
    groups: dict[str, Json] = {}
    for entry in measured:
        group = groups.setdefault(
            entry["group"], {"interval_seconds": intervals[entry["group"]], "daily_seconds": 0.0}
        )
        group["daily_seconds"] = round(group["daily_seconds"] + entry["median_seconds"], 3)
    for group in groups.values():
        group["share_of_interval"] = round(group["daily_seconds"] / group["interval_seconds"], 3)
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    rules = daily_rules()
    intervals = group_intervals()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="gpuscope-daily-"))
    workdir.mkdir(parents=True, exist_ok=True)
    end = int(time.time()) // STEP * STEP - 2 * 3600  # older than Prometheus' head block
    report: Json = {
        "benchmark": "daily_rules",
        "nodes": args.nodes,
        "allocations": args.nodes * ALLOCATIONS,
        "gpus": args.nodes * GPUS,
    }
    try:
        began = time.monotonic()
        text = workdir / "day.om"
        report["written"] = write_day(text, args.nodes, end)
        report["written"]["write_seconds"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        blocks = workdir / "blocks"
        promtool_blocks(text, blocks)
        text.unlink()
        report["written"]["promtool_seconds"] = round(time.monotonic() - began, 1)
        shutil.copytree(blocks, workdir / "data")  # Prometheus opens them at start
        with prometheus(workdir, {"global": {"scrape_interval": "1m"}}) as (store, _, _):
            wait_until(
                "prometheus to load the blocks",
                lambda: bool(
                    store.query("count(gpu:gpu_busy_seconds:rate5m)", at=end)["data"]["result"]
                ),
                600,
            )
            measured = evaluate(store.url, rules, end, args.repeats)
            report["prometheus"] = {"rules": measured, "groups": by_group(measured, intervals)}
        with VictoriaMetrics(workdir / "victoria") as victoria:
            began = time.monotonic()
            victoria.import_blocks(blocks)
            report["victoriametrics_import_seconds"] = round(time.monotonic() - began, 1)
            measured = evaluate(victoria.url, rules, end, args.repeats)
            report["victoriametrics"] = {
                "rules": measured,
                "groups": by_group(measured, intervals),
            }
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
