"""The interpreter the benchmarks run the daemon with: a virtualenv holding gpuscope's core
install (the daemon's dependencies, as the daemon image has them) and the `auth-providers` extra,
the one optional part the daemon itself can import (benchmarks/memory.py measures what it costs).

The development venv would distort the figures: it also holds the test tools and the jobs'
libraries, and some packages import optional ones when they find them (the kubernetes client
imports kubernetes-validate and with it jsonschema, about 2 MiB more per daemon).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "bench-runtime"


def runtime_python(*, root: Path = ROOT, venv: Path = VENV) -> str:
    """The runtime venv's python, created on first use. pip rebuilds a project given by path
    every time, so the benchmark measures the working tree (and new dependencies arrive).
    `root` and `venv`: another tree of gpuscope (an earlier commit's) in a venv of its own."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{root}[auth-providers]",
        ],
        check=True,
    )
    return str(python)


@contextlib.contextmanager
def serving(
    flags: list[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    root: Path = ROOT,
    python: str | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Run `gpuscope serve` with `flags` from the runtime venv, on a free loopback port, with its
    stderr in `log` (and `env` added to its environment); yield it and the port it logged.
    SIGTERM at the end. A daemon that does not start raises RuntimeError with its log.
    `root` and `python`: another tree's daemon (run from that tree, with that interpreter)."""
    command = [
        python or runtime_python(),
        "-m",
        "exporter",
        "serve",
        "--web.listen-address=127.0.0.1:0",
        "--log.level=info",
        *flags,
    ]
    with log.open("w") as stderr:
        daemon = subprocess.Popen(
            command, stderr=stderr, cwd=root, env={**os.environ, **(env or {})}
        )
        try:
            yield daemon, _logged_port(daemon, log)
        finally:
            stop(daemon)


def _logged_port(daemon: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and daemon.poll() is None:
        match = re.search(r"address=127\.0\.0\.1:(\d+)", log.read_text())
        if match:
            return int(match[1])
        time.sleep(0.05)
    raise RuntimeError(f"the daemon did not start; its log:\n{log.read_text()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
