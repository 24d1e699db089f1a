"""Benchmark `gpuscope rightsize` against a hostile PromQL API that answers every per-pod batch
with every pod's series (what a server of an attacker's, or one ignoring matchers, can do).

    .venv/bin/python benchmarks/hostile_prometheus.py [--pods 10000] [--code DIR]

The stand-in (tests/rightsize_hostile.py) answers the job's queries about `--pods` pods, each
holding one GPU; the per-pod queries (container CPU and limits, asked in batches of pods, over
the window and each shorter term) are answered honestly first, then with every pod's series in
every batch. For each, the job runs as a user runs it (`--format json`) and its wall time and
peak resident memory (wait4) are measured. `--code DIR` runs the `exporter` package found in DIR
instead of this checkout's (e.g. an older commit's, extracted with `git archive`), to measure
before a change. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.rightsize_hostile import END, StandIn, held_pod  # noqa: E402 - after the path set-up
from tests.rightsize_run import serving  # noqa: E402

MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run(url: str, code: Path) -> dict[str, object]:
    """The job against `url`: exit status, seconds, peak resident MiB, workloads reported."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as peak:
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                MEASURE,
                peak.name,
                sys.executable,
                "-m",
                "exporter",
                "rightsize",
                f"--prometheus={url}",
                f"--end={END}",
                "--format=json",
            ],
            capture_output=True,
            text=True,
            cwd=code,
            env={**os.environ, "PYTHONPATH": str(code)},
            timeout=3600,
            check=False,
        )
        seconds = time.monotonic() - started
        rss = int(peak.read() or 0)
    workloads = len(json.loads(result.stdout)["workloads"]) if result.returncode == 0 else None
    return {
        "exit": result.returncode,
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(rss / 2**20),
        "workloads": workloads,
        "error": result.stderr.strip().splitlines()[-1:] if result.returncode else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--code", type=Path, default=ROOT)
    args = parser.parse_args()
    pods = [held_pod(f"w{n:05d}", n, namespace=f"team-{n % 20:02d}") for n in range(args.pods)]
    found: dict[str, object] = {"pods": args.pods, "code": str(args.code)}
    for name, every in (("honest", False), ("every_series_in_every_batch", True)):
        stand_in = StandIn(pods, every_series=every)
        with serving(stand_in.handle) as url:
            found[name] = {**run(url, args.code.resolve()), "queries": len(stand_in.queries)}
    found["load_average"] = [round(load, 2) for load in os.getloadavg()]
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
