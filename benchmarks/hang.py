"""A GPU hung in the driver, on the fake NVIDIA driver: how long until it is reported down, whether
the other GPUs keep their cadence, and what scrapes cost meanwhile; prints one JSON document.

    .venv/bin/python benchmarks/hang.py [--gpus 8] [--hung 3] [--interval 1s] [--hang 30]

The daemon runs the real nvidia-ml-py over the tests' fake libnvidia-ml.so.1 (tests/fake_nvml),
from the runtime-only virtualenv. After a warm-up, every driver call about GPU `--hung` blocks
(the fake's `hang` switch) for `--hang` seconds while a client scrapes 100 times a second, open
loop, asking for OpenMetrics as Prometheus does; then the call is released.

Reported: seconds from the hang to `gpu_up 0` with `gpu_down_reason{reason="hung"}`, and from the
release to `gpu_up 1`; the other GPUs' busy counters and the cycle counter during the hang (they
must keep advancing at the sampling rate); scrape latency during the hang; the daemon's threads
once it is reported down and at the end of the hang (a stuck call must not grow them).

Targets from the resilience issue: down within 15 s, scrapes under 5 ms p99, the others on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fake driver lives in tests/

from benchmarks.daemon import Connections, open_loop  # noqa: E402
from benchmarks.runtime import runtime_python, stop  # noqa: E402
from tests.fake_nvml import STATE_ENV, FakeDevice, FakeNvmlState, build_fake_nvml  # noqa: E402


def node(gpus: int, hung: int | None) -> FakeNvmlState:
    return FakeNvmlState(
        devices=[
            FakeDevice.numbered(
                index,
                name="NVIDIA A100-SXM4-80GB",
                util_gpu_percent=40 + index,
                supported_events=0,  # the fake's event wait polls; a real driver's blocks
                hang=index == hung,
            )
            for index in range(gpus)
        ]
    )


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def metric(body: bytes, name: str, **labels: str) -> float | None:
    for line in body.decode().splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{key}="{value}"' in line for key, value in labels.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


async def poll_until(client: Connections, check: object, limit: float) -> float:
    """Seconds until `check(body)` holds (polled every 50 ms), at most `limit`."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        _, body = await client.get()
        if check(body):  # type: ignore[operator]
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise RuntimeError("timed out")


async def measure(
    pid: int, port: int, state: Path, gpus: int, hung: int, hang_seconds: float
) -> dict[str, object]:
    others = [str(gpu) for gpu in range(gpus) if gpu != hung]
    async with Connections(port, 16) as client:
        await asyncio.sleep(3.0)  # the first cycles
        node(gpus, hung).write(state)
        hung_at = time.monotonic()
        down_after = await poll_until(
            client,
            lambda body: (
                metric(body, "gpu_up", gpu=str(hung)) == 0
                and metric(body, "gpu_down_reason", gpu=str(hung), reason="hung") == 1
            ),
            60,
        )
        _, before = await client.get()
        threads_at_hang = threads(pid)
        load_started = time.monotonic()
        latency = await open_loop(
            client, 100.0, max(hang_seconds - (time.monotonic() - hung_at), 5.0)
        )
        elapsed = time.monotonic() - load_started
        _, after = await client.get()
        threads_at_end = threads(pid)
        busy = {
            gpu: round(
                (metric(after, "gpu_busy_seconds_total", gpu=gpu) or 0)
                - (metric(before, "gpu_busy_seconds_total", gpu=gpu) or 0),
                2,
            )
            for gpu in others
        }
        cycles = (metric(after, "gpuscope_sample_cycles_total") or 0) - (
            metric(before, "gpuscope_sample_cycles_total") or 0
        )
        node(gpus, None).write(state)
        back_after = await poll_until(
            client, lambda body: metric(body, "gpu_up", gpu=str(hung)) == 1, 60
        )
    return {
        "seconds_to_down": round(down_after, 2),
        "seconds_back_after_release": round(back_after, 2),
        "seconds_measured_during_hang": round(elapsed, 1),
        "cycles_per_second_during_hang": round(cycles / elapsed, 2),
        "other_gpus_busy_seconds_gained_during_hang": busy,
        "scrape_latency_ms_at_100_per_second_during_hang": latency,
        "threads_when_down_and_at_end": [threads_at_hang, threads_at_end],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hung", type=int, default=3, help="the GPU whose calls hang")
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--hang", type=float, default=30.0, help="seconds the calls stay hung")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        library = build_fake_nvml(scratch / "lib")
        state = node(args.gpus, None).write(scratch / "state")
        log = scratch / "stderr"
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(library),
            STATE_ENV: str(state),
            "KUBECONFIG": "",
            "KUBERNETES_SERVICE_HOST": "",
        }
        with log.open("w") as stderr:
            daemon = subprocess.Popen(
                [
                    runtime_python(),
                    "-m",
                    "exporter",
                    "serve",
                    "--web.listen-address=127.0.0.1:0",
                    f"--collect.interval={args.interval}",
                ],
                stderr=stderr,
                cwd=ROOT,
                env=env,
            )
            try:
                deadline = time.monotonic() + 30
                port = None
                while port is None and time.monotonic() < deadline:
                    match = re.search(r"address=127\.0\.0\.1:(\d+)", log.read_text())
                    port = int(match[1]) if match else None
                    time.sleep(0.05)
                if port is None:
                    raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
                results = asyncio.run(
                    measure(daemon.pid, port, state, args.gpus, args.hung, args.hang)
                )
            finally:
                stop(daemon)
    latency = results["scrape_latency_ms_at_100_per_second_during_hang"]
    assert isinstance(latency, dict)
    busy = results["other_gpus_busy_seconds_gained_during_hang"]
    assert isinstance(busy, dict)
    report = {
        "benchmark": "hang",
        "node": {"gpus": args.gpus, "hung_gpu": args.hung, "collect_interval": args.interval},
        "driver": "tests/fake_nvml (fake libnvidia-ml.so.1 under nvidia-ml-py)",
        "python": sys.version.split()[0],
        **results,
        "targets": {
            "seconds_to_down <= 15": results["seconds_to_down"] <= 15,  # type: ignore[operator]
            "p99_ms < 5": latency["p99"] < 5,
            "every other GPU kept sampling": all(gained > 0 for gained in busy.values()),
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
