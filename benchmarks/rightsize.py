"""Benchmark `gpuscope rightsize` against a real Prometheus or VictoriaMetrics holding N workloads
x 14 days.

    .venv/bin/python benchmarks/rightsize.py [--workloads 1000] [--days 14] [--interval 2m]
        [--store prometheus|victoria-metrics|both] [--step 5m[,10m]] [--concurrency 4[,1]]
        [--no-server] [--refresh 5m] [--refreshes 3] [--keep DIR]

1. Writes the synthetic history (tests/synthetic_history.py: a mix of idle holders, small
   inference services, memory-heavy jobs, compute-bound trainers with GPM series, input-starved
   trainers with cAdvisor/kube-state-metrics series, time-sliced pairs, MIG instances and a few
   new workloads) as OpenMetrics, in 54-hour pieces that promtool backfills into non-overlapping
   blocks, the next piece written while promtool reads the last.
2. Serves it from Prometheus (loopback, default query limits) and/or VictoriaMetrics (Debian's
   single-node server, default limits; the same blocks imported with vmctl, once per --keep
   directory).
3. Runs `gpuscope rightsize --format json` as a user would, for each --step and
   --prometheus.concurrency asked, and measures the wall time until the report is written and
   the process's peak resident memory (from wait4).
4. Unless --no-server, runs `gpuscope rightsize serve` on the same data, at the first --step and
   --concurrency, refreshing every --refresh (by default the refresh target: 1 minute up to
   1,000 workloads, 5 up to 10,000; a refresh must finish within it), and measures --refreshes
   refreshes (3): each one's duration (as it logs it), the server's resident memory after each
   and its peak (VmHWM), and how long the page, the JSON and /metrics take to fetch and how
   large they are.

Prints one JSON document, with the machine's load average at the end. Targets from the issues:
up to 1,000 workloads, a report in < 60 s and < 500 MiB, a server's refresh in < 60 s and
< 300 MiB; up to 10,000 workloads, < 5 minutes and < 1 GiB for each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dashboards.victoria import VictoriaMetrics  # noqa: E402 - after the path set-up above
from exporter.durations import DurationError, parse_duration  # noqa: E402
from tests.prometheus_server import free_port, running_prometheus  # noqa: E402
from tests.synthetic_history import FakeWorkload, Wave, backfill, write_openmetrics  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

REFRESHES = 3
"""Refreshes the server is measured over by default: the first, and two more a refresh interval
apart."""

H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
L4 = "NVIDIA L4"
PIECE = 54 * 3600  # promtool's 54 h block range: pieces aligned to it never overlap


def behaviour(kind: int, n: int) -> dict[str, Any]:
    """What workload n of kind `kind` (0-9) runs on and how busy it keeps it; `swing` varies the
    busy ones' daily wave from workload to workload."""
    swing = 0.02 + (n % 7) * 0.01
    return [
        {"model": H100},  # an idle holder
        {"model": A100_80, "busy": Wave(0.08, swing, jitter=0.01), "memory_gib": Wave(6, 1)},
        {"model": A100_80, "busy": Wave(0.08, swing, jitter=0.01), "memory_gib": Wave(6, 1)},
        {
            "model": H100,
            "busy": Wave(0.1, swing),
            "memory_gib": Wave(8, 1),
            "sm": Wave(0.06, 0.01),
            "tensor": Wave(0.03, 0.01),
            "dram": Wave(0.05, 0.01),
        },
        {"kind": "Job", "model": A100_80, "busy": Wave(0.5, 0.1), "memory_gib": Wave(70, 1)},
        {
            "kind": "Job",
            "model": H100,
            "gpus_per_pod": 2,
            "busy": Wave(0.95, 0.02),
            "memory_gib": Wave(70, 2),
            "sm": Wave(0.88, 0.02),
            "tensor": Wave(0.7, 0.05),
            "dram": Wave(0.3, 0.05),
        },
        {
            "kind": "Job",
            "model": A100_80,
            "busy": Wave(0.35, 0.08),
            "memory_gib": Wave(20, 1),
            "cpu_limit": 4,
            "cpu_usage": Wave(3.95, 0.03),
        },
        {
            "model": A100_80,
            "busy": Wave(0.15, swing),
            "memory_gib": Wave(9, 1),
            # workloads n and n + 10 time-slice one GPU
            "shared_uuid": f"GPU-shared-{n // 20:04d}",
        },
        {"model": L4, "busy": Wave(0.55, 0.1), "memory_gib": Wave(12, 1)},
        {
            "model": H100,
            "mig_profile": "3g.40gb",
            "busy": Wave(0.2, swing),
            "memory_gib": Wave(5, 1),
        },
    ][kind]


def fleet(count: int) -> list[FakeWorkload]:
    """`count` workloads over 20 namespaces, ten kinds of behaviour in turn; one in 50 is new
    (3 hours of history)."""
    return [
        FakeWorkload(
            f"team-{n % 20:02d}",
            f"w{n:04d}",
            hours=3.0 if n % 50 == 49 else None,
            labels={"team": f"team-{n % 20:02d}"},
            **behaviour(n % 10, n),
        )
        for n in range(count)
    ]


def build(
    data: Path, workloads: list[FakeWorkload], end: float, duration: float, interval: float
) -> dict[str, float]:
    """The history as promtool blocks in `data`, a 54-hour piece at a time: the next piece is
    written while promtool backfills the one before (two cores, two processes)."""
    state: dict = {}
    promtool = "/usr/bin/promtool"
    write_seconds = 0.0
    lines = 0
    began_all = time.monotonic()
    start = end - duration
    piece_start = start - start % PIECE
    backfilling: Future[None] | None = None
    with ThreadPoolExecutor(max_workers=1) as promtool_thread:
        while piece_start <= end:
            text = data.parent / f"piece-{piece_start:.0f}.om"
            began = time.monotonic()
            with text.open("w") as out:
                write_openmetrics(
                    out,
                    workloads,
                    end=end,
                    duration=duration,
                    interval=interval,
                    chunk=(piece_start, piece_start + PIECE),
                    state=state,
                )
            write_seconds += time.monotonic() - began
            with text.open("rb") as counted:
                lines += sum(1 for line in counted if not line.startswith(b"#"))
            if backfilling is not None:
                backfilling.result()
            backfilling = promtool_thread.submit(_backfill_piece, promtool, text, data)
            piece_start += PIECE
        if backfilling is not None:
            backfilling.result()
    return {
        "samples": lines,
        "write_seconds": round(write_seconds, 1),
        "build_seconds": round(time.monotonic() - began_all, 1),
    }


def _backfill_piece(promtool: str, text: Path, data: Path) -> None:
    backfill(promtool, text, data, max_block_duration="54h")
    text.unlink()


def run_report(
    url: str,
    end: float,
    output: Path,
    *,
    step: str = "5m",
    concurrency: int = 4,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """`gpuscope rightsize --format json` (and `extra` flags) against `url`: its wall time, peak
    resident memory, queries and warnings."""
    command = [
        sys.executable,
        "-m",
        "exporter",
        "rightsize",
        f"--prometheus={url}",
        f"--end={end:.0f}",
        f"--step={step}",
        f"--prometheus.concurrency={concurrency}",
        "--format=json",
        f"--output={output}",
        "--log.format=json",
        *extra,
    ]
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - began
    log = process.stderr.read() if process.stderr else ""
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"rightsize failed ({process.returncode}):\n{log}")
    ready = next(json.loads(line) for line in log.splitlines() if '"report ready"' in line)
    return {
        "step": step,
        "concurrency": concurrency,
        "report_seconds": round(seconds, 2),
        "report_max_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "queries": ready["queries"],
        "workloads_reported": ready["workloads"],
        "warnings": sum(1 for line in log.splitlines() if '"level": "warning"' in line),
    }


def _memory(pid: int) -> dict[str, float]:
    """The process's resident memory now and at its peak, in MiB (/proc/PID/status)."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in {"VmRSS", "VmHWM"}:
            found[name] = round(int(value.split()[0]) / 1024, 1)  # kB
    return found


def _fetch(url: str) -> tuple[float, int]:
    began = time.monotonic()
    with urllib.request.urlopen(url, timeout=120) as response:
        size = len(response.read())
    return round(time.monotonic() - began, 3), size


def run_server(
    url: str, end: float, *, refresh: int, refreshes: int, step: str, concurrency: int
) -> dict[str, Any]:
    """`gpuscope rightsize serve` on the data, refreshing every `refresh` seconds (which also
    bounds each refresh) at the report's `step` and concurrency, `refreshes` times: each
    refresh's duration and memory."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "exporter",
        "rightsize",
        "serve",
        f"--prometheus={url}",
        f"--end={end:.0f}",
        f"--refresh={refresh}s",
        f"--step={step}",
        f"--prometheus.concurrency={concurrency}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.format=json",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    measured: list[dict[str, float]] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if '"report refreshed"' in line:
                logged = json.loads(line)
                measured.append({"seconds": logged["seconds"], **_memory(process.pid)})
                if len(measured) == refreshes:
                    break
            elif '"refresh failed' in line:
                raise SystemExit(f"the server's refresh failed:\n{line}")
        base = f"http://127.0.0.1:{port}"
        fetched = {name: _fetch(base + path) for name, path in SERVED.items()}
        peak = _memory(process.pid)["VmHWM"]
    finally:
        process.terminate()
        process.wait(30)
    return {
        "refresh_interval_seconds": refresh,
        "refreshes": measured,
        "refresh_seconds_max": max(r["seconds"] for r in measured),
        "server_max_rss_mib": peak,
        "served": {
            name: {"seconds": seconds, "bytes": size} for name, (seconds, size) in fetched.items()
        },
    }


SERVED = {"page": "/", "json": "/api/v1/report", "metrics": "/metrics"}


TARGETS: Final = {
    # workloads up to: (report seconds, report peak MiB, refresh seconds, server peak MiB)
    1000: (60, 500, 60, 300),
    10_000: (300, 1024, 300, 1024),
}
"""Issue targets: 1,000 workloads in a minute and 500 MiB; 10,000 in 5 minutes and 1 GiB."""


def _targets(workloads: int) -> tuple[int, int, int, int]:
    return next(t for n, t in sorted(TARGETS.items()) if workloads <= n)


def _stores(root: Path, data: Path, names: list[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(store, URL, what starting it took) for each store asked for, serving the history."""
    if "prometheus" in names:
        began = time.monotonic()
        with running_prometheus(data, retention="15d", ready_timeout=600) as url:
            yield "prometheus", url, {"start_seconds": round(time.monotonic() - began, 1)}
    if "victoria-metrics" in names:
        imported = root / "victoria-imported"
        began = time.monotonic()
        with VictoriaMetrics(root / "victoria", ready_timeout=600) as victoria:
            started = round(time.monotonic() - began, 1)
            if imported.exists():
                setup = json.loads(imported.read_text())
            else:
                began = time.monotonic()
                samples = victoria.import_blocks(data, timeout=6 * 3600)
                setup = {
                    "import_seconds": round(time.monotonic() - began, 1),
                    "imported_samples": samples,
                    "vmctl_runs": len(list((root / "victoria").glob("vmctl-*.log"))),
                }
                imported.write_text(json.dumps(setup))
            yield "victoria-metrics", victoria.url, {"start_seconds": started, **setup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--interval", default="2m", help="scrape interval of the synthetic history")
    parser.add_argument(
        "--step",
        default="5m",
        help="rightsize's --step; a comma-separated list measures each (at least 2 x interval)",
    )
    parser.add_argument(
        "--concurrency",
        default="4",
        help="rightsize's --prometheus.concurrency; a comma-separated list measures each",
    )
    parser.add_argument(
        "--store",
        default="prometheus",
        help="prometheus, victoria-metrics, or both (comma-separated): the same history in each",
    )
    parser.add_argument(
        "--no-server", action="store_true", help="skip gpuscope rightsize serve's refreshes"
    )
    parser.add_argument(
        "--refreshes", type=int, default=REFRESHES, help="the server's refreshes to measure"
    )
    parser.add_argument(
        "--refresh",
        help="the server's --refresh (default: the refresh target, 1m up to 1,000 workloads, 5m"
        " up to 10,000); each refresh must finish within it",
    )
    parser.add_argument("--keep", type=Path, help="build the data here (and reuse it if present)")
    args = parser.parse_args()
    if args.refreshes < 1:
        parser.error(f"--refreshes must be at least 1, not {args.refreshes}")
    interval = parse_duration(args.interval)
    steps = args.step.split(",")
    concurrencies = [int(n) for n in args.concurrency.split(",")]
    stores = ["prometheus", "victoria-metrics"] if args.store == "both" else args.store.split(",")
    workloads = fleet(args.workloads)
    end = float(int(time.time()) // 300 * 300 - 3600)
    duration = args.days * 86400 + 3600
    report_target, memory_target, refresh_target, server_target = _targets(args.workloads)
    try:
        refresh = round(parse_duration(args.refresh)) if args.refresh else refresh_target
    except DurationError as error:
        parser.error(f"--refresh: {error}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpuscope-bench-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        data = root / "data"
        marker = root / "end"
        built: dict[str, float] = {}
        if marker.exists() and data.exists():
            end = float(marker.read_text())
        else:
            data.mkdir(exist_ok=True)
            built = build(data, workloads, end, duration, interval)
            marker.write_text(f"{end:.0f}")
        for store, url, setup in _stores(root, data, stores):
            reports = []
            for step in steps:
                for concurrency in concurrencies:
                    output = root / f"report-{store}-{step}-{concurrency}.json"
                    measured = run_report(url, end, output, step=step, concurrency=concurrency)
                    summary = json.loads(output.read_text())["summary"]
                    reports.append(
                        {
                            **measured,
                            "classifications": summary["classifications"],
                            "confidence": summary["confidence"],
                        }
                    )
            server = (
                None
                if args.no_server
                else run_server(
                    url,
                    end,
                    refresh=refresh,
                    refreshes=args.refreshes,
                    step=steps[0],
                    concurrency=concurrencies[0],
                )
            )
            results[store] = {**setup, "reports": reports, "server": server}
    met = all(
        r["report_seconds"] < report_target and r["report_max_rss_mib"] < memory_target
        for found in results.values()
        for r in found["reports"]
    ) and all(
        found["server"]["refresh_seconds_max"] < refresh_target
        and found["server"]["server_max_rss_mib"] < server_target
        for found in results.values()
        if found["server"] is not None
    )
    print(
        json.dumps(
            {
                "workloads": args.workloads,
                "days": args.days,
                "scrape_interval": args.interval,
                "load_average": os.getloadavg(),
                **built,
                **results,
                "targets": {
                    "report_seconds": report_target,
                    "report_max_rss_mib": memory_target,
                    "refresh_seconds": refresh_target,
                    "server_max_rss_mib": server_target,
                },
                "met": met,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
