"""What reading the GPUs costs per cycle in one process, and what handing it to the GPU thread adds;
prints one JSON document.

    .venv/bin/python benchmarks/reading.py [--gpus 8] [--rounds 6] [--cycles 30] [--pause 0.2]

A sampler on `--simulate=N` (H100s, the collectors on by default, no process lists: the daemon
without attribution) is read three ways, alternately, `--rounds` times `--cycles` cycles each:
- `inline`: every GPU's job (`DeviceReader.read`) called in this thread, one after the other, as
  the daemon read them before the GPU threads (the reading only, no assembly);
- `assembled_inline`: `NvmlSampler.sample()` watched (`GpuThreads.watched`), the daemon's cycle:
  each GPU's job made in this thread, the follow-ups handed to the shared thread, and the cycle
  assembled from the answers;
- `threaded`: `NvmlSampler.sample()` unwatched, as a sampler runs with no sampling loop to watch
  it: the jobs handed to the shared `gpuscope-gpus` thread, waited for, and the cycle assembled.
`threaded` minus `assembled_inline` is what the hand-off costs (`handoff_adds_ms`): the two
thread switches a cycle (sampler thread -> GPU thread -> sampler thread) and their wakeups.
Each cycle's CPU is the process's (every thread), its median per round, then the median of the
rounds. `--pause` sleeps between cycles, as the daemon does between its 1 s cycles (caches go
cold then; `--pause 0` measures hot loops, the code's own cost).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.config import COLLECTORS, OFF_BY_DEFAULT
from exporter.nvml.sampler import NvmlSampler
from exporter.simulator import SimulatedNvml, default_fleet

if TYPE_CHECKING:
    from collections.abc import Callable


def per_cycle(cycle: Callable[[], object], cycles: int, pause: float) -> float:
    """The median process CPU of one call of `cycle`, in ms."""
    spent = []
    for _ in range(cycles):
        started = time.process_time()
        cycle()
        spent.append(time.process_time() - started)
        time.sleep(pause)
    return statistics.median(spent) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between cycles")
    args = parser.parse_args()
    sampler = NvmlSampler(
        SimulatedNvml(default_fleet(args.gpus)),
        collectors=[name for name, _ in COLLECTORS if name not in OFF_BY_DEFAULT],
        read_processes=False,
        interval=1.0,
    )
    sampler.start()
    reader, devices = sampler._reader, sampler._devices  # the job itself, called inline

    def inline() -> None:
        for device in devices:
            reader.read(device)

    threads = sampler.gpu_threads

    def threaded() -> None:
        threads.watched = False
        sampler.sample()

    def assembled_inline() -> None:
        threads.watched = True
        sampler.sample()

    ways: dict[str, Callable[[], object]] = {
        "inline": inline,
        "assembled_inline": assembled_inline,
        "threaded": threaded,
    }
    runs: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for _ in range(3):
            sampler.sample()
        for round_ in range(args.rounds):
            for name in list(ways) if round_ % 2 == 0 else list(reversed(ways)):
                runs[name].append(per_cycle(ways[name], args.cycles, args.pause))
    finally:
        sampler.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(
        json.dumps(
            {
                "benchmark": "reading",
                "gpus": args.gpus,
                "pause_seconds": args.pause,
                "rounds": args.rounds,
                "cycles_per_round": args.cycles,
                "python": sys.version.split()[0],
                "cpu_ms_per_cycle_rounds": {
                    name: [round(value, 3) for value in values] for name, values in runs.items()
                },
                "cpu_ms_per_cycle_median": {name: round(m, 3) for name, m in medians.items()},
                "threads_add_ms": round(medians["threaded"] - medians["inline"], 3),
                "handoff_adds_ms": round(medians["threaded"] - medians["assembled_inline"], 3),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
