"""What `--compat.dcgm` costs per rendered snapshot, in process; prints one JSON document.

    .venv/bin/python benchmarks/dcgm.py [--gpus 8] [--processes 64] [--pods 0] [--cycles 100]
                                        [--dcgm-version 4.8]

The node is benchmarks/daemon.py's (H100s, GPM on each); with `--pods N` its processes run in N
time-sliced pods spread over the GPUs, so shared GPUs carry a series per pod. The same simulated
node is sampled `--cycles` times on a manual clock, each snapshot rendered as OpenMetrics (as a
Prometheus scrape asks), without and with dcgm-exporter's default fields, in `--rounds` rounds
that alternate which goes first (so that the machine's load falls on both alike). Reported: the
median CPU time (`time.process_time`, every thread of the process) per sampled and rendered
cycle of each, the median of the rounds' differences — what the DCGM families cost a scraped
snapshot — and the samples they add, in `--dcgm-version`'s shapes (`--compat.dcgm-version`).
A snapshot nobody scrapes is never rendered, so an unscraped cycle costs the same either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import fleet  # noqa: E402
from exporter.config import ServeConfig  # noqa: E402
from exporter.metrics.exposition import OPENMETRICS  # noqa: E402
from exporter.metrics.families import BuildInfo  # noqa: E402
from exporter.sampling import SamplingLoop  # noqa: E402
from exporter.simulator import SimulatedNvml, load_fleet  # noqa: E402
from exporter.simulator.cluster import simulated_attributor  # noqa: E402
from tests.helpers import ManualClock  # noqa: E402

WARM_CYCLES = 10


def with_pods(document: dict[str, Any], pods: int, gpus: int) -> dict[str, Any]:
    """The fleet's processes in `pods` time-sliced pods, each holding a replica of its GPU."""
    document["pods"] = [
        {"name": f"pod-{n}", "namespace": "bench", "gpus": [n % gpus], "shared": True}
        for n in range(pods)
    ]
    for process in document["processes"]:
        owners = [n for n in range(pods) if n % gpus == process["gpu"]]
        if owners:
            process["pod"] = f"bench/pod-{owners[process['pid'] % len(owners)]}"
    return document


async def measure(
    fleet_file: Path, *, compat: bool, pods: bool, cycles: int, version: str = "4.8"
) -> tuple[float, int]:
    """CPU milliseconds per sampled and rendered cycle, and the DCGM samples of the last one."""
    loaded = load_fleet(fleet_file)
    clock = ManualClock()
    wall = lambda: 1_767_225_600.0 + clock()  # noqa: E731 - a clock is a function
    attributor = simulated_attributor(loaded, node="benchmark-node") if pods else None
    sampling = SamplingLoop(
        replace(
            ServeConfig(),
            collect_interval=1.0,
            compat_dcgm=compat,
            dcgm_version=version,
            node_name="benchmark-node",
        ),
        SimulatedNvml(loaded, clock=clock, wall=wall),
        build=BuildInfo("benchmark"),
        clock=clock,
        wall=wall,
        attributor=attributor,
    )
    if attributor is not None:
        attributor.start()
    await sampling.start()
    try:
        for n in range(WARM_CYCLES + cycles):
            if n == WARM_CYCLES:
                started = time.process_time()
            exposition = sampling.cycle()
            rendered = exposition.render(OPENMETRICS)
            clock.advance(1.0)
        spent = time.process_time() - started
    finally:
        await sampling.close()
        if attributor is not None:
            attributor.stop()
    samples = sum(1 for line in rendered.body.splitlines() if line.startswith(b"DCGM_FI_"))
    return spent / cycles * 1000, samples


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--pods", type=int, default=0, help="time-sliced pods (0: no attribution)")
    parser.add_argument("--cycles", type=int, default=100, help="cycles per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dcgm-version", choices=("4.8", "4.9"), default="4.8")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        document = fleet(args.gpus, args.processes)
        if args.pods:
            document = with_pods(document, args.pods, args.gpus)
        fleet_file = Path(scratch) / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(document))
        rounds: list[tuple[float, float]] = []
        for n in range(args.rounds):
            order = (False, True) if n % 2 == 0 else (True, False)
            taken = {
                compat: asyncio.run(
                    measure(
                        fleet_file,
                        compat=compat,
                        pods=bool(args.pods),
                        cycles=args.cycles,
                        version=args.dcgm_version,
                    )
                )
                for compat in order
            }
            rounds.append((taken[False][0], taken[True][0]))
            samples = taken[True][1]
    without = statistics.median(plain for plain, _ in rounds)
    with_dcgm = statistics.median(dcgm for _, dcgm in rounds)
    added = statistics.median(dcgm - plain for plain, dcgm in rounds)
    report = {
        "benchmark": "dcgm",
        "node": {"gpus": args.gpus, "processes": args.processes, "pods": args.pods},
        "python": sys.version.split()[0],
        "cycles_per_measurement": args.cycles,
        "rounds": args.rounds,
        "dcgm_version": args.dcgm_version,
        "cpu_ms_per_rendered_cycle_without": round(without, 3),
        "cpu_ms_per_rendered_cycle_with_compat_dcgm": round(with_dcgm, 3),
        "cpu_ms_the_dcgm_series_add": round(added, 3),
        "dcgm_samples": samples,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
