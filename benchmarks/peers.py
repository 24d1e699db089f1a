"""gpuscope beside nvitop's Prometheus exporter on the same fake NVIDIA driver; prints JSON.

    .venv/bin/python benchmarks/peers.py            # 8 GPUs, 64 processes, 1 s interval
    .venv/bin/python benchmarks/peers.py --quick    # a smoke run

Both exporters run the real nvidia-ml-py over the tests' fake libnvidia-ml.so.1
(tests/fake_nvml, compiled here against the real nvml.h), one after the other, on the same
node: 8 H100s, 8 compute processes on each, no XID/ECC events (see `node`). Each runs from a
venv holding only what it needs at run time: gpuscope from benchmarks/runtime.py's,
nvitop-exporter (PyPI `nvitop-exporter`, pinned below) from one under .cache/ made on first
use. For each exporter:

- CPU per sample: the exporter's CPU time (from /proc/<pid>/stat) over `--idle` seconds with no
  scrapes, divided by the samples its interval gives in that time;
- resident memory at the end of that idle phase;
- scrape latency at a steady 10 scrapes/s for `--load` seconds, each on a new connection (one
  of the two servers closes every connection), asking for what Prometheus asks for;
- the series and bytes one scrape returns, and the CPU while being scraped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.daemon import PROMETHEUS_HEADERS, cpu_seconds, percentile, rss_bytes  # noqa: E402
from benchmarks.runtime import runtime_python, stop  # noqa: E402
from tests.fake_nvml import (  # noqa: E402
    STATE_ENV,
    FakeDevice,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
)

NVITOP_EXPORTER = "nvitop-exporter==1.7.2"
NVITOP_VENV = ROOT / ".cache" / "nvitop-venv"
GIB = 2**30


def node(gpus: int, per_gpu: int) -> FakeNvmlState:
    return FakeNvmlState(
        devices=[
            FakeDevice.numbered(
                index,
                name="NVIDIA H100 80GB HBM3",
                util_gpu_percent=20 + 10 * (index % 8),
                util_memory_percent=10 + index,
                memory_used_bytes=per_gpu * 8 * GIB,
                power_usage_mw=300_000 + 10_000 * index,
                power_limit_mw=700_000,
                temperature_c=50 + index,
                clock_sm_mhz=1755,
                clock_event_reasons=0,
                # No XID/ECC events: the fake driver's event wait polls its state file every
                # 5 ms, CPU a real driver's blocking wait does not spend (and nvitop does not
                # watch events), so gpuscope's event thread would be charged for the fake.
                supported_events=0,
                processes=[
                    FakeProcess(100_000 + index * per_gpu + n, 8 * GIB) for n in range(per_gpu)
                ],
            )
            for index in range(gpus)
        ]
    )


def nvitop_exporter() -> Path:
    """The nvitop-exporter console script, installed into its own venv if need be."""
    script = NVITOP_VENV / "bin" / "nvitop-exporter"
    if not script.exists():
        print(f"peers: installing {NVITOP_EXPORTER} into {NVITOP_VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(NVITOP_VENV)], check=True)
        subprocess.run(
            [str(NVITOP_VENV / "bin" / "pip"), "install", "--quiet", NVITOP_EXPORTER], check=True
        )
    return script


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


REQUEST = (
    "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n"
    "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
)


async def scrape(port: int) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST.format(accept=PROMETHEUS_HEADERS["Accept"]).encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def wait_until_serving(port: int, process: subprocess.Popen[bytes]) -> bytes:
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"exited with status {process.returncode}")
        with contextlib.suppress(OSError, IndexError, ValueError):
            status, body = await scrape(port)
            if status == 200 and b"gpu" in body:
                return body
        await asyncio.sleep(0.1)
    raise RuntimeError("never served metrics")


async def measure(
    process: subprocess.Popen[bytes], port: int, interval: float, idle: float, load: float
) -> dict[str, object]:
    await wait_until_serving(port, process)
    await asyncio.sleep(3.0)  # imports settled, first samples taken
    cpu_before, started = cpu_seconds(process.pid), time.monotonic()
    await asyncio.sleep(idle)
    elapsed = time.monotonic() - started
    cpu_idle = cpu_seconds(process.pid) - cpu_before
    rss = rss_bytes(process.pid)

    latencies: list[float] = []
    errors = 0
    body = b""
    cpu_before, started = cpu_seconds(process.pid), time.monotonic()
    for n in range(int(load * 10)):
        await asyncio.sleep(max(0.0, started + n / 10 - time.monotonic()))
        sent = time.perf_counter()
        try:
            status, body = await scrape(port)
            errors += status != 200
        except (OSError, IndexError, ValueError):
            errors += 1
        latencies.append(time.perf_counter() - sent)
    cpu_load = cpu_seconds(process.pid) - cpu_before
    loaded = time.monotonic() - started
    text = body.decode(errors="replace")
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {
        "cpu_ms_per_sample": round(1000 * cpu_idle / (elapsed / interval), 2),
        "cpu_share_of_a_core_idle": round(cpu_idle / elapsed, 4),
        "rss_mib": round(rss / 2**20, 1),
        "scrape_latency_ms": {
            "p50": round(statistics.median(latencies) * 1000, 2),
            "p99": round(percentile(latencies, 0.99) * 1000, 2),
            "max": round(max(latencies) * 1000, 2),
            "scrapes": len(latencies),
            "errors": errors,
        },
        "cpu_share_of_a_core_at_10_scrapes_per_second": round(cpu_load / loaded, 4),
        "samples_per_scrape": len(samples),
        "gpu_samples_per_scrape": sum(1 for line in samples if re.match(r"(gpu|process)_", line)),
        "bytes_per_scrape": len(body),
    }


def run(
    name: str, command: list[str], env: dict[str, str], port: int, args: argparse.Namespace
) -> dict[str, object]:
    print(f"peers: measuring {name}", file=sys.stderr)
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=ROOT)
        try:
            return asyncio.run(measure(process, port, args.interval, args.idle, args.load))
        except RuntimeError as error:
            log.seek(0)
            raise SystemExit(f"{name}: {error}\n{log.read().decode(errors='replace')}") from error
        finally:
            stop(process)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes-per-gpu", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds without scrapes")
    parser.add_argument("--load", type=float, default=30.0, help="seconds of 10 scrapes/s")
    parser.add_argument("--quick", action="store_true", help="10 s idle, 5 s load")
    args = parser.parse_args()
    if args.quick:
        args.idle, args.load = 10.0, 5.0

    nvitop = nvitop_exporter()
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        library = build_fake_nvml(scratch / "lib")
        state = node(args.gpus, args.processes_per_gpu).write(scratch / "state")
        env = {**os.environ, "LD_LIBRARY_PATH": str(library), STATE_ENV: str(state)}
        gpuscope_port, nvitop_port = free_port(), free_port()
        results = {
            "gpuscope": run(
                "gpuscope",
                [
                    runtime_python(),
                    "-m",
                    "exporter",
                    "serve",
                    f"--web.listen-address=127.0.0.1:{gpuscope_port}",
                    f"--collect.interval={int(args.interval * 1000)}ms",
                    "--log.level=warn",
                ],
                {**env, "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""},
                gpuscope_port,
                args,
            ),
            "nvitop-exporter": run(
                "nvitop-exporter",
                [
                    str(nvitop),
                    "--bind-address=127.0.0.1",
                    f"--port={nvitop_port}",
                    f"--interval={args.interval}",
                ],
                env,
                nvitop_port,
                args,
            ),
        }
    versions = subprocess.run(
        [str(NVITOP_VENV / "bin" / "pip"), "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {item["name"]: item["version"] for item in json.loads(versions.stdout)}
    print(
        json.dumps(
            {
                "benchmark": "peers",
                "node": {
                    "gpus": args.gpus,
                    "processes": args.gpus * args.processes_per_gpu,
                    "interval_seconds": args.interval,
                    "driver": "tests/fake_nvml (fake libnvidia-ml.so.1 under nvidia-ml-py)",
                },
                "python": sys.version.split()[0],
                "nvitop_exporter_version": installed.get("nvitop-exporter"),
                "phases": {"idle_seconds": args.idle, "load_seconds": args.load},
                **results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
