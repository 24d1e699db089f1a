"""Benchmark the daemon on a simulated node; prints one JSON document.

    .venv/bin/python benchmarks/daemon.py [--gpus 8] [--processes 64] [--mig-gpus 2] [--quick]
    .venv/bin/python benchmarks/daemon.py --pods 200 --pod-changes 10    # with pod attribution
    .venv/bin/python benchmarks/daemon.py --fleet examples/fleet.yaml
    .venv/bin/python benchmarks/daemon.py --serve-flag=--compat.dcgm     # any further serve flag
    .venv/bin/python benchmarks/daemon.py --against 5d90971^ [--rounds 5] [--seconds 30]
    .venv/bin/python benchmarks/daemon.py --against 5d90971^ --together --cpu 1   # same window, same core

The generated node is H100s (which have GPM); `--mig-gpus N` splits the first N of them into
MIG instances (3g.40gb + 2g.20gb + 1g.10gb x2) with their share of the processes placed on
the instances. `--fleet FILE` runs any fleet file instead. `--serve-flag FLAG` (repeatable) passes
a further flag to `gpuscope serve`.

Phases (about 100 s in all):
1. 30 s with no scrapes: the daemon's CPU time per sampling cycle (from /proc/<pid>/stat and the
   daemon's own cycle counter). Unscraped snapshots are not rendered.
1b. 20 s scraped once a second, as often as it samples: CPU per cycle when every snapshot is
   rendered (the most a 1 s scrape interval costs). Resident memory is read at t = 60 s.
2. 30 s of open-loop scraping at 100 scrapes/s (each request sent at its scheduled instant,
   whether or not earlier ones have returned), asking for OpenMetrics as Prometheus does.
3. 10 s closed-loop with 16 concurrent clients: the highest scrape rate the daemon sustains.

Targets from the daemon issue: <= 10 ms CPU per 1 s cycle, <= 80 MiB resident, p99 < 5 ms at
100 scrapes/s, >= 1,000 scrapes/s.

`--against REV` measures one thing only, CPU per sampling cycle (unscraped: the two scrapes that
read the cycle counter, and the snapshot rendered at once after the first, fall outside the
measured window) on `--simulate=N`
(`--gpus`, default 8), side by side with the daemon of an earlier commit: REV's tree comes out of
`git archive` into a temporary directory and gets a runtime venv of its own
(.cache/bench-runtime-<commit>), then the two daemons run one at a time, alternately (the order
swapped each round, so a drift of the shared machine's load falls on both), `--rounds` times for
`--seconds` each after a warm-up. It prints each side's runs, their medians and the ratio
(this tree / REV: below 1 means this tree costs less), and each side's threads' CPU per cycle,
largest first (the median of each rank over the runs).
Each round's ratio (this tree's run over the other's next to it) and their median come too.
With `--together` the two daemons run at once instead, half a cycle apart, and each round
measures both over the same window: the shared machine's speed, which can swing by a third from
one minute to the next under other tenants' load, is then the same for both sides of a round
(each daemon uses well under 1% of a core, so they hardly compete for the 2 cores). `--cpu N`
then puts every thread of both on CPU N once they are warm, so that both run on a core whose
other hyperthread's load, which differs from core to core, is the same for both: the rounds'
ratios then spread over a few percent, where either alone still spreads over a third.
`--serve-flag` goes to both daemons, `--this-flag` to this tree's only (a collector REV did
not have, left out to compare like with like).

With `--pods N`, pod attribution is on: a stand-in API server (tests/fake_kube) serves N pods on
the node and changes `--pod-changes` of them per second through the watch, a real gRPC
pod-resources server (tests/fake_kubelet) allocates every GPU to the pods whose processes run on
it (time-sliced), and a generated procfs tree puts each process in its pod's container. Both
stand-ins run in a process of their own, so their work is not counted as the daemon's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-ins live in tests/

from benchmarks.runtime import runtime_python, serving  # noqa: E402
from exporter.durations import parse_duration  # noqa: E402
from exporter.simulator import load_fleet  # noqa: E402
from tests.fake_kube.pods import NODE, pod, serve_pods  # noqa: E402
from tests.fake_kube.server import FakeKube  # noqa: E402
from tests.fake_kubelet import FakeKubelet, gpu_allocations  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator

PROMETHEUS_HEADERS = {  # what Prometheus 2.x sends (the benchmark takes the body uncompressed)
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
}
PATTERNS = ("steady", "bursty", "sawtooth", "input_starved", "idle")
MIG_LAYOUT = ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
MIG_USABLE_GIB = (39, 19, 9, 9)
WARM_UP_SECONDS = 3.0
"""Before a side-by-side measurement: the first cycles, imports and caches settle."""
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def fleet(gpus: int, processes: int, mig_gpus: int = 0) -> dict[str, object]:
    per_gpu = max(processes // gpus, 1)
    per_instance = -(-per_gpu // len(MIG_LAYOUT))
    entries: list[dict[str, object]] = []
    for n in range(processes):
        gpu = n % gpus
        entry: dict[str, object] = {
            "pid": 100_000 + n,
            "gpu": gpu,
            "memory": f"{70 // per_gpu}GiB",
            "pattern": PATTERNS[n % len(PATTERNS)],
            "level": 0.5,
        }
        if gpu < mig_gpus:
            slot = n // gpus % len(MIG_LAYOUT)
            entry["mig_instance"] = slot
            entry["memory"] = f"{max(MIG_USABLE_GIB[slot] // per_instance, 1)}GiB"
        entries.append(entry)
    models: list[dict[str, object]] = []
    if mig_gpus:
        models.append({"model": "h100-sxm", "count": mig_gpus, "mig": list(MIG_LAYOUT)})
    if gpus > mig_gpus:
        models.append({"model": "h100-sxm", "count": gpus - mig_gpus})
    return {"seed": 1, "gpus": models, "processes": entries}


def attribution_node(
    scratch: Path, fleet_file: Path, pods: int, changes: float, ready: multiprocessing.Queue
) -> None:
    """The stand-in API server and kubelet, run in a process of their own until terminated."""
    fleet_spec = load_fleet(fleet_file)
    processes = fleet_spec.processes
    uuids = [gpu.uuid for gpu in fleet_spec.gpus]
    holders = [
        (f"gpu-{n}", process_uid(n), container(n), process.gpu)
        for n, process in enumerate(processes)
    ]
    documents = [
        pod(
            name, uid, namespace="ml", containers={"main": cid}, owner=("ReplicaSet", f"{name}-abc")
        )
        for name, uid, cid, _ in holders
    ]
    documents += [
        pod(f"web-{n}", process_uid(10_000 + n), containers={"main": container(10_000 + n)})
        for n in range(max(pods - len(holders), 0))
    ]
    with (
        serve_pods(FakeKube(), *documents) as api,
        FakeKubelet(scratch / "kubelet.sock") as kubelet,
    ):
        kubelet.set(
            gpu_allocations(
                ("ml", name, "main", "nvidia.com/gpu", [f"{uuids[gpu]}::{n}"])
                for n, (name, _, _, gpu) in enumerate(holders)
            )
        )
        ready.put(str(api.write_kubeconfig(scratch / "kubeconfig")))
        change = 0
        started = time.monotonic()
        while True:  # churn: status updates to every pod in turn, one in ten a delete + re-create
            change += 1
            document = documents[change % len(documents)]
            metadata = document["metadata"]
            if change % 10 == 0 and metadata["name"].startswith("web-"):
                api.delete("pods", metadata["namespace"], metadata["name"])
            document["metadata"] = {**metadata, "labels": {"revision": str(change)}}
            api.put("pods", document)
            time.sleep(max(0.0, started + change / changes - time.monotonic()))


@contextlib.contextmanager
def attributed_node(
    scratch: Path, fleet_file: Path, processes: int, pods: int, changes: float
) -> Iterator[list[str]]:
    """The node's Kubernetes side: a procfs tree putting process n in pod n's container, and
    `attribution_node` in a process of its own; yields the daemon flags that point at them."""
    procfs_tree(scratch / "proc", processes)
    context = multiprocessing.get_context("spawn")
    ready: multiprocessing.Queue[str] = context.Queue()
    node = context.Process(
        target=attribution_node, args=(scratch, fleet_file, pods, changes, ready), daemon=True
    )
    node.start()
    try:
        yield [
            f"--path.procfs={scratch / 'proc'}",
            f"--kubeconfig={ready.get(timeout=60)}",
            f"--kubernetes.node-name={NODE}",
            f"--kubelet.pod-resources-socket={scratch / 'kubelet.sock'}",
        ]
    finally:
        node.terminate()
        node.join(10)


def process_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def container(n: int) -> str:
    return f"{n:064x}"


def procfs_tree(root: Path, processes: int) -> None:
    """A procfs with one cgroup file per process: process n runs in pod n's container."""
    for n in range(processes):
        directory = root / str(100_000 + n)
        directory.mkdir(parents=True)
        uid = process_uid(n).replace("-", "_")
        (directory / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container(n)}.scope\n"
        )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def peak_rss_bytes(pid: int) -> int:
    """The most resident memory the process ever had (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/<pid>/status")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Connections:
    """A pool of keep-alive HTTP/1.1 connections speaking just enough HTTP for a scrape.

    A minimal client keeps the load generator's own overhead (which shares this machine's two
    cores with the daemon) far below the latencies being measured."""

    def __init__(self, port: int, size: int) -> None:
        self._port = port
        self._size = size
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    async def __aenter__(self) -> Connections:
        for _ in range(self._size):
            self._idle.put_nowait(await asyncio.open_connection("127.0.0.1", self._port))
        return self

    async def __aexit__(self, *exc: object) -> None:
        while not self._idle.empty():
            self._idle.get_nowait()[1].close()

    async def get(self, path: str = "/metrics") -> tuple[int, bytes]:
        reader, writer = await self._idle.get()
        try:
            writer.write(REQUEST.format(path=path).encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            return status, await reader.readexactly(length)
        finally:
            self._idle.put_nowait((reader, writer))


REQUEST = (
    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: gpuscope-benchmark\r\n"
    f"Accept: {PROMETHEUS_HEADERS['Accept']}\r\nAccept-Encoding: identity\r\n\r\n"
)


async def exposition_size(client: Connections) -> tuple[int, int]:
    """(samples, bytes) of one scrape, as Prometheus asks for it."""
    status, body = await client.get()
    if status != 200:
        raise RuntimeError(f"scrape failed (HTTP {status})")
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return samples, len(body)


async def cycles(client: Connections) -> float:
    status, body = await client.get()
    match = re.search(rb"^gpuscope_sample_cycles_total (\S+)$", body, re.MULTILINE)
    if status != 200 or match is None:
        raise RuntimeError(f"no cycle counter in the scrape (HTTP {status})")
    return float(match[1])


async def open_loop(client: Connections, rate: float, seconds: float) -> dict[str, object]:
    """Requests leave on a fixed schedule, never waiting for earlier answers. Latency runs from
    the moment the client woke up to send (it includes any wait for a free connection); how late
    the client's own timer woke is reported apart, as it is no fault of the daemon."""
    latencies: list[float] = []
    lateness: list[float] = []
    errors = 0
    start = time.perf_counter() + 0.05

    async def one(at: float) -> None:
        nonlocal errors
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        sent = time.perf_counter()
        lateness.append(sent - at)
        try:
            status, _ = await client.get()
            errors += status != 200
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
        latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(one(start + n / rate) for n in range(int(rate * seconds))))
    return {
        "p50": round(statistics.median(latencies) * 1000, 3),
        "p99": round(percentile(latencies, 0.99) * 1000, 3),
        "max": round(max(latencies) * 1000, 3),
        "requests": len(latencies),
        "errors": errors,
        "client_timer_lateness_p99_ms": round(percentile(lateness, 0.99) * 1000, 3),
    }


async def closed_loop(client: Connections, clients: int, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            status, _ = await client.get()
            done += status == 200

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return done / (time.perf_counter() - started)


async def measure(pid: int, port: int, *, quick: bool) -> dict[str, object]:
    idle_seconds, scraped_seconds, load_seconds, burst_seconds = (
        (5, 5, 5, 3) if quick else (30, 20, 30, 10)
    )
    async with Connections(port, 16) as client:
        began = time.monotonic()
        cycles_before, cpu_before = await cycles(client), cpu_seconds(pid)
        await asyncio.sleep(idle_seconds)
        cycles_after, cpu_after = await cycles(client), cpu_seconds(pid)
        cpu_per_cycle = (cpu_after - cpu_before) / max(cycles_after - cycles_before, 1)

        cycles_before, cpu_before = cycles_after, cpu_seconds(pid)
        await open_loop(client, 1.0, scraped_seconds)
        cycles_after, cpu_after = await cycles(client), cpu_seconds(pid)
        cpu_per_rendered_cycle = (cpu_after - cpu_before) / max(cycles_after - cycles_before, 1)
        await asyncio.sleep(0 if quick else max(0.0, 60.0 - (time.monotonic() - began)))
        rss = rss_bytes(pid)

        cpu_before = cpu_seconds(pid)
        latency = await open_loop(client, 100.0, load_seconds)
        cpu_under_load = (cpu_seconds(pid) - cpu_before) / load_seconds

        rate = await closed_loop(client, 16, burst_seconds)
        samples, size = await exposition_size(client)
        # VmHWM lags the per-thread RSS counters a little; a reading above it is the peak.
        peak = max(peak_rss_bytes(pid), rss)
    return {
        "cpu_seconds_per_cycle": round(cpu_per_cycle, 5),
        "cpu_seconds_per_cycle_scraped_every_cycle": round(cpu_per_rendered_cycle, 5),
        "cpu_share_of_a_core_at_100_scrapes_per_second": round(cpu_under_load, 4),
        "rss_mib_after_60s": round(rss / 2**20, 1),
        "rss_mib_peak": round(peak / 2**20, 1),
        "scrape_latency_ms_at_100_per_second": latency,
        "max_scrapes_per_second": round(rate),
        "samples_per_scrape": samples,
        "bytes_per_scrape": size,
    }


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """Each thread's time on a CPU in nanoseconds (/proc/<pid>/task/*/schedstat), by thread id:
    exact where /proc/<pid>/stat counts in 10 ms ticks, which over 30 one-second cycles is
    0.3 ms a cycle."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            found[task.name] = int((task / "schedstat").read_text().split()[0])
    return found


async def idle_cpu_per_cycle(
    pid: int, port: int, seconds: float, interval: float
) -> tuple[float, list[float]]:
    """CPU seconds per sampling cycle over `seconds` without scrapes: in all, and each thread's,
    largest first (Python 3.11 gives the OS no thread names, so threads are told apart by what
    they cost). A thread that ended meanwhile would go uncounted: an unscraped daemon's threads
    live as long as it does.

    The cycle counter is read by two scrapes, and neither one's rendering falls in the measured
    window: the first is followed by the next snapshot rendered at once in the format it took
    (the daemon renders eagerly while scrapes keep up), so the window opens two cycles after it,
    and the cycles between are not counted; the window closes before the second scrape asks."""
    async with Connections(port, 1) as client:
        cycles_scraped = await cycles(client)
        await asyncio.sleep(2 * interval)  # two cycles: the eager rendering is in the first
        cpu_before = thread_cpu_ns(pid)
        await asyncio.sleep(seconds)
        cpu_after = thread_cpu_ns(pid)
        cycles_after = await cycles(client)
    count = max(cycles_after - cycles_scraped - 2, 1)
    each = sorted(
        ((ns - cpu_before.get(tid, 0)) / 1e9 / count for tid, ns in cpu_after.items()),
        reverse=True,
    )
    return sum(each), each


async def _measured_at_once(
    daemons: dict[str, tuple[int, int]], seconds: float, interval: float
) -> dict[str, tuple[float, list[float]]]:
    """`idle_cpu_per_cycle` of each daemon (by name: its pid and port), over the same window."""
    found = await asyncio.gather(
        *(idle_cpu_per_cycle(pid, port, seconds, interval) for pid, port in daemons.values())
    )
    return dict(zip(daemons, found, strict=True))


def commit_of(revision: str) -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode:
        raise SystemExit(f"--against: {revision!r} names no commit of this repository")
    return found.stdout.strip()


def side_by_side(args: argparse.Namespace) -> dict[str, object]:
    """CPU per cycle of this tree and of `args.against`, run alternately (or at once, with
    `--together`); both medians, and the ratio of each round."""
    commit = commit_of(args.against)
    if args.cpu is not None and args.cpu not in os.sched_getaffinity(0):
        raise SystemExit(f"--cpu: CPU {args.cpu} is not one this process may run on")
    flags = [f"--simulate={args.gpus}", f"--collect.interval={args.interval}", *args.serve_flag]
    interval = parse_duration(args.interval)
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "against"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        venv = ROOT / ".cache" / f"bench-runtime-{commit[:12]}"
        sides = {
            "this": (ROOT, runtime_python(), [*flags, *args.this_flag]),
            "against": (tree, runtime_python(root=tree, venv=venv), flags),
        }
        runs: dict[str, list[float]] = {name: [] for name in sides}
        threads: dict[str, list[list[float]]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            groups = [order] if args.together else [[name] for name in order]
            for group in groups:
                with contextlib.ExitStack() as stack:
                    started: dict[str, tuple[int, int]] = {}
                    for name in group:
                        root, python, side_flags = sides[name]
                        log = Path(scratch) / f"{name}.log"
                        try:
                            daemon, port = stack.enter_context(
                                serving(side_flags, log, root=root, python=python)
                            )
                        except RuntimeError as error:
                            raise SystemExit(f"{name}: {error}") from error
                        started[name] = (daemon.pid, port)
                        if args.together:
                            # Half a cycle apart: the two daemons' cycles do not coincide.
                            time.sleep(interval / 2)
                    time.sleep(WARM_UP_SECONDS)
                    if args.cpu is not None:
                        for pid, _ in started.values():
                            for task in Path(f"/proc/{pid}/task").iterdir():
                                os.sched_setaffinity(int(task.name), {args.cpu})
                    measured = asyncio.run(_measured_at_once(started, args.seconds, interval))
                for name, (spent, each) in measured.items():
                    runs[name].append(spent)
                    threads[name].append(each)
    medians = {name: statistics.median(values) for name, values in runs.items()}
    per_round = [mine / theirs for mine, theirs in zip(runs["this"], runs["against"], strict=True)]
    return {
        "benchmark": "daemon-side-by-side",
        "together": args.together,
        "node": {"simulate": args.gpus, "collect_interval": args.interval},
        "serve_flags": args.serve_flag,
        "this_flags": args.this_flag,
        "against": {"revision": args.against, "commit": commit},
        "rounds": args.rounds,
        "seconds_per_run": args.seconds,
        "python": sys.version.split()[0],
        "cpu_ms_per_cycle_runs": {
            name: [round(v * 1000, 3) for v in values] for name, values in runs.items()
        },
        "cpu_ms_per_cycle_median": {name: round(m * 1000, 3) for name, m in medians.items()},
        "ratio_this_to_against": round(medians["this"] / medians["against"], 3),
        "ratio_per_round": [round(ratio, 3) for ratio in per_round],
        "ratio_per_round_median": round(statistics.median(per_round), 3),
        "cpu_ms_per_cycle_by_thread_largest_first_median": {
            name: [
                round(
                    statistics.median(run[rank] if rank < len(run) else 0.0 for run in side) * 1000,
                    3,
                )
                for rank in range(max(len(run) for run in side))
            ]
            for name, side in threads.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--mig-gpus", type=int, default=0, help="how many GPUs are MIG-split")
    parser.add_argument("--fleet", type=Path, help="a fleet file to run instead of generating one")
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--quick", action="store_true", help="a few seconds per phase (smoke run)")
    parser.add_argument("--pods", type=int, default=0, help="pods on the node (0: no attribution)")
    parser.add_argument("--pod-changes", type=float, default=10.0, help="pod changes per second")
    parser.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a further gpuscope serve flag, e.g. --serve-flag=--compat.dcgm (repeatable)",
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="only CPU per cycle, side by side with the daemon of this git revision",
    )
    parser.add_argument(
        "--this-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="with --against: a serve flag for this tree's daemon only, e.g. to leave out a "
        "collector the other revision did not have (repeatable)",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="with --against: both daemons run at once, measured over the same windows",
    )
    parser.add_argument(
        "--cpu", type=int, help="with --against: every thread of the daemons on this CPU"
    )
    parser.add_argument("--rounds", type=int, default=5, help="with --against: runs per side")
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="with --against: seconds measured per run"
    )
    args = parser.parse_args()
    if args.against is not None:
        print(json.dumps(side_by_side(args), indent=2))
        return 0

    with tempfile.TemporaryDirectory() as scratch:
        fleet_file = args.fleet or Path(scratch) / "fleet.yaml"
        if args.fleet is None:
            fleet_file.write_text(yaml.safe_dump(fleet(args.gpus, args.processes, args.mig_gpus)))
        with contextlib.ExitStack() as stack:
            attribution = (
                stack.enter_context(
                    attributed_node(
                        Path(scratch), fleet_file, args.processes, args.pods, args.pod_changes
                    )
                )
                if args.pods
                else []
            )
            flags = [
                f"--simulate={fleet_file}",
                f"--collect.interval={args.interval}",
                *attribution,
                *args.serve_flag,
            ]
            try:
                daemon, port = stack.enter_context(serving(flags, Path(scratch) / "stderr"))
            except RuntimeError as error:
                raise SystemExit(str(error)) from error
            time.sleep(2.0)  # let the first cycles and imports settle
            results = asyncio.run(measure(daemon.pid, port, quick=args.quick))
    latency = results["scrape_latency_ms_at_100_per_second"]
    assert isinstance(latency, dict)
    report = {
        "benchmark": "daemon",
        "node": (
            {"fleet": str(args.fleet), "collect_interval": args.interval}
            if args.fleet
            else {
                "gpus": args.gpus,
                "mig_gpus": args.mig_gpus,
                "processes": args.processes,
                "collect_interval": args.interval,
            }
        )
        | {"pods": args.pods, "pod_changes_per_second": args.pod_changes if args.pods else 0}
        | {"serve_flags": args.serve_flag},
        "python": sys.version.split()[0],
        **results,
        "targets": {
            "cpu_seconds_per_cycle <= 0.010": results["cpu_seconds_per_cycle"] <= 0.010,  # type: ignore[operator]
            "rss_mib_after_60s <= 80": results["rss_mib_after_60s"] <= 80,  # type: ignore[operator]
            "p99_ms < 5": latency["p99"] < 5,
            "max_scrapes_per_second >= 1000": results["max_scrapes_per_second"] >= 1000,  # type: ignore[operator]
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
