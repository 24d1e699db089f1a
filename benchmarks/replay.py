"""Benchmark the policy replay's engine (`exporter/rightsize/replay/`) alone, on synthetic
per-step demand vectors: no Prometheus, no queries, the placement search and the figures.

    .venv/bin/python benchmarks/replay.py [--workloads 10000] [--days 14] [--step 10m]
        [--policies current,exclusive,mig,timeslice,binpack] [--models all]

The workloads: 70% inference services (Deployments; a daily wave at a random phase, 5 to 40%
busy, plus jitter), 20% batch Jobs (busy 30 to 95% while they run), 10% StatefulSets (memory
heavy, lightly busy); on A100 80GB, H100 and L4 GPUs, with memory peaks drawn per workload; a
fixed seed, so every run places the same set. Measures the wall time of `replay` and the
process's peak resident memory (the vectors included), and prints one JSON document with the
GPUs each policy needs and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.catalog import builtin_catalog  # noqa: E402 - after the path set-up above
from exporter.durations import parse_duration  # noqa: E402
from exporter.rightsize.hardware import Hardware, Option  # noqa: E402
from exporter.rightsize.history import Ceilings  # noqa: E402
from exporter.rightsize.replay.engine import CurrentSteps, Workload, replay  # noqa: E402
from exporter.rightsize.replay.policies import parse_policies  # noqa: E402
from exporter.rightsize.settings import StrategySettings, parse_models  # noqa: E402

GIB = 1024**3
MODELS = (("a100-sxm4-80gb", 0.6), ("h100-sxm", 0.25), ("l4", 0.15))


def workloads(count: int, steps: int, step: float, seed: int = 7) -> list[Workload]:
    catalog = builtin_catalog()
    rng = random.Random(seed)
    per_day = 86400 / step
    found = []
    for number in range(count):
        key = rng.choices([k for k, _ in MODELS], [w for _, w in MODELS])[0]
        model = catalog.by_key(key)
        assert model is not None
        memory = model.nvml_memory_bytes
        roll = rng.random()
        if roll < 0.7:
            kind, low, high = "Deployment", rng.uniform(0.05, 0.15), rng.uniform(0.2, 0.4)
            phase = rng.uniform(0, 2 * math.pi)
            busy = array(
                "d",
                (
                    min(
                        1.0,
                        max(
                            0.0,
                            low
                            + (high - low) * (1 + math.sin(2 * math.pi * t / per_day + phase)) / 2
                            + rng.uniform(-0.03, 0.03),
                        ),
                    )
                    for t in range(steps)
                ),
            )
            peak = rng.uniform(0.1, 0.4) * memory
        elif roll < 0.9:
            kind = "Job"
            level = rng.uniform(0.3, 0.95)
            start = rng.randrange(steps)
            length = rng.randrange(steps // 10, steps // 2)
            busy = array("d", (level if start <= t < start + length else 0.0 for t in range(steps)))
            peak = rng.uniform(0.2, 0.9) * memory
        else:
            kind = "StatefulSet"
            busy = array("d", (rng.uniform(0.02, 0.1) for _ in range(steps)))
            peak = rng.uniform(0.5, 0.95) * memory
        found.append(
            Workload("", f"ns-{number % 50}", kind, f"w-{number}", Option(model), busy, peak)
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--step", default="10m")
    parser.add_argument("--policies", default="current,exclusive,mig,timeslice,binpack")
    parser.add_argument("--models", default="all")
    args = parser.parse_args()
    step = parse_duration(args.step)
    steps = int(args.days * 86400 // step)
    started = time.monotonic()
    made = workloads(args.workloads, steps, step)
    generated = time.monotonic() - started
    held = float(len(made))
    current = CurrentSteps(
        (held,) * steps,
        {key: steps * sum(1 for w in made if w.current.model.key == key) for key, _ in MODELS},
        0,
    )
    hardware = Hardware.build(builtin_catalog(), Ceilings())
    settings = StrategySettings(models=parse_models(args.models))
    started = time.monotonic()
    results = replay(
        made, current, hardware=hardware, settings=settings, policies=parse_policies(args.policies)
    )
    seconds = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "workloads": args.workloads,
                "steps": steps,
                "step": args.step,
                "models": args.models,
                "generate_seconds": round(generated, 1),
                "replay_seconds": round(seconds, 1),
                "max_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
                "policies": {
                    r.policy: {
                        "gpus_max": r.gpus.max,
                        "utilization_mean": round(r.utilization_mean, 3),
                        "contention_share": round(r.contention_share, 4),
                        "memory_overcommit_steps": r.memory_overcommit_steps,
                    }
                    for r in results
                },
                "cpus": os.cpu_count(),
                "load_average": [round(load, 2) for load in os.getloadavg()],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
