"""Benchmark calibration; prints one JSON document.

    .venv/bin/python benchmarks/calibrate.py [--device auto|cpu|cuda] [--skip-full]

1. `gpuscope calibrate --quick` and the full run, each as a user runs it (a subprocess, import of
   PyTorch included): wall time, and the headline figures with their fraction of the datasheet.
   Targets: quick < 20 s and full < 2 min on a GPU, quick < 30 s on a CPU; on a GPU, >= 80% of
   the datasheet bf16 matmul peak and >= 85% of the memory bandwidth.
2. The daemon's cost of calibration per sampling cycle: a sampling cycle of 8 simulated H100s
   with and without `--calibration.path` (a ConfigMap-style directory of 5 profiles that does not
   change), so profiles are shown to be re-read only when they change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.calibration.parse import parse_profile_text  # noqa: E402 - after the path is set
from exporter.calibration.profile import (  # noqa: E402
    Figure,
    configmap_key,
    dump_profile,
)
from exporter.config import ServeConfig  # noqa: E402
from exporter.metrics.families import BuildInfo  # noqa: E402
from exporter.sampling import SamplingLoop  # noqa: E402
from exporter.simulator import SimulatedNvml, default_fleet  # noqa: E402
from tests.profiles import gpu_profile  # noqa: E402


def run_calibration(device: str, *, quick: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "profile.json"
        command = [sys.executable, "-m", "exporter", "calibrate", f"--device={device}"]
        command += [f"--output={output}", "--log.level=warn"] + (["--quick"] if quick else [])
        started = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.monotonic() - started
        profile = parse_profile_text(output.read_text(), source=str(output))
    figures: dict[str, object] = {}
    for name, result in profile.figures.items():
        if isinstance(result, Figure):
            figures[name] = {
                "value": result.value,
                "unit": result.unit,
                "spread": round(result.spread, 4),
                "unstable": result.unstable,
                "size": result.size,
                "achieved_ratio": (
                    round(result.achieved_ratio, 3) if result.achieved_ratio is not None else None
                ),
            }
    return {
        "wall_seconds": round(wall, 2),
        "measuring_seconds": profile.duration_seconds,
        "model": profile.model,
        "device": profile.device,
        "figures": figures,
    }


def configmap_directory(root: Path) -> Path:
    version = root / "..2026_11_22_01"
    version.mkdir(parents=True)
    models = ["NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "B200"]
    for model in models:
        (version / configmap_key(model)).write_text(dump_profile(gpu_profile(model)))
    (root / "..data").symlink_to(version.name)
    for model in models:
        (root / configmap_key(model)).symlink_to(f"..data/{configmap_key(model)}")
    return root


async def cycle_cpu_ms(calibration_path: Path | None, cycles: int) -> float:
    config = replace(ServeConfig(), calibration_path=calibration_path)
    loop = SamplingLoop(config, SimulatedNvml(default_fleet(8)), build=BuildInfo("bench"))
    await loop.start()
    try:
        for _ in range(20):
            loop.cycle()
        started = time.process_time()
        for _ in range(cycles):
            loop.cycle()
        return (time.process_time() - started) / cycles * 1e3
    finally:
        await loop.close()


async def daemon_cost(cycles: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        directory = configmap_directory(Path(scratch) / "calibration")
        without = await cycle_cpu_ms(None, cycles)
        with_profiles = await cycle_cpu_ms(directory, cycles)
        without_again = await cycle_cpu_ms(None, cycles)
    baseline = min(without, without_again)
    return {
        "cycle_cpu_ms_without_calibration": round(baseline, 3),
        "cycle_cpu_ms_with_calibration_path": round(with_profiles, 3),
        "calibration_share_of_cycle": round((with_profiles - baseline) / baseline, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--skip-full", action="store_true")
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    report: dict[str, object] = {"quick": run_calibration(args.device, quick=True)}
    if not args.skip_full:
        report["full"] = run_calibration(args.device, quick=False)
    report["daemon"] = asyncio.run(daemon_cost(args.cycles))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
