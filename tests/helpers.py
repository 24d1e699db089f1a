"""Shared test helpers: run the daemon as a user would, scrape it, read its metrics."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, NoReturn, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping

    from exporter.nvml.sampler import NvmlSampler
    from exporter.sampling import SamplingLoop

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
FLEETS = Path(__file__).resolve().parent / "fixtures" / "fleets"
CYCLES = "gpuscope_sample_cycles_total"
"""The daemon's own count of completed sampling cycles: what tests wait on instead of sleeping."""
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_tool(name: str) -> str:
    """The path of a command the test needs: a failure under CI=true, a skip elsewhere."""
    beside_python = Path(sys.executable).parent  # tools pip installed into the test venv
    path = shutil.which(name) or shutil.which(name, path=f"{beside_python}:/usr/sbin:/usr/bin")
    if path is None:
        unavailable(f"{name} is not installed (the README's test command installs it)")
    return path


def unavailable(message: str) -> NoReturn:
    """Something the test needs is missing: a failure under CI=true (CI must install it), a
    skip on a developer's machine that has not run the README's test command."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def assert_promtool_accepts(exposition: str | bytes) -> None:
    """`promtool check metrics` lints an exposition clean (names, units, help, types)."""
    promtool = require_tool("promtool")
    body = exposition.encode() if isinstance(exposition, str) else exposition
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    port: int
    log_lines: list[str] = field(default_factory=list)
    """Its standard error, line by line (the log)."""
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    """Every byte it wrote to each, kept."""
    pumps: list[threading.Thread] = field(default_factory=list)

    def output(self) -> bytes:
        """Everything it wrote so far, standard output then standard error."""
        return bytes(self.stdout) + bytes(self.stderr)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(
        self, path: str = "/metrics", headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=dict(headers or {}))
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def metrics(self) -> str:
        status, _, body = self.get()
        assert status == 200, body
        return body.decode()

    def wait_ready(self, timeout: float = 15.0) -> None:
        eventually(
            lambda: self.get("/-/ready")[0] == 200,
            timeout,
            "the daemon to be ready",
            every=0.05,
            detail=lambda: "log:\n" + "\n".join(self.log_lines),
        )

    def cycles(self) -> int:
        """Sampling cycles the daemon completed (`gpuscope_sample_cycles_total`)."""
        return int(value(self.metrics(), CYCLES))

    def metrics_until(self, check: Callable[[str], object], timeout: float, what: str) -> str:
        """Scrape /metrics until `check(text)` holds; that text. A timeout shows the last one."""
        last = [""]

        def scrape() -> str | None:
            last[0] = self.metrics()
            return last[0] if check(last[0]) else None

        return eventually(scrape, timeout, what, detail=lambda: "last /metrics:\n" + last[0])

    def wait_cycles(self, n: int, *, since: float | None = None, timeout: float = 10.0) -> str:
        """Wait until the daemon completed `n` more sampling cycles than `since` (by default:
        than now) — instead of sleeping for what should be n intervals. The /metrics text that
        showed them; a failure if they take longer than `timeout` seconds."""
        start = self.cycles() if since is None else since
        return self.metrics_until(
            lambda text: value(text, CYCLES) >= start + n,
            timeout,
            f"{n} sampling cycles after cycle {start:.0f}",
        )

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM; its exit status, once every byte it wrote has been read."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout)
        for pump in self.pumps:
            pump.join(timeout)
        return status


def daemon_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", "serve", *args]


@contextmanager
def running_daemon(
    *args: str,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 20.0,
    preexec: Callable[[], None] | None = None,
) -> Iterator[Daemon]:
    """`gpuscope serve ARGS` on a free loopback port, every byte it writes kept; stopped with
    SIGTERM afterwards. `preexec` runs in the child before it starts (e.g. a resource limit)."""
    command = daemon_command("--web.listen-address=127.0.0.1:0", *args)
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        preexec_fn=preexec,  # noqa: PLW1509 - only what a test asks for, before exec
    )
    daemon = Daemon(process, 0)
    port_found = threading.Event()

    def pump_err() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            daemon.stderr.extend(raw)
            line = raw.decode(errors="replace").rstrip("\n")
            daemon.log_lines.append(line)
            match = re.search(
                r'"?msg"?[=:]"?listening\b.*"?address"?[=:]"?127\.0\.0\.1:(\d+)', line
            )
            if match and not daemon.port:
                daemon.port = int(match[1])
                port_found.set()
        port_found.set()

    def pump_out() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            daemon.stdout.extend(raw)

    daemon.pumps = [threading.Thread(target=pump, daemon=True) for pump in (pump_err, pump_out)]
    for pump in daemon.pumps:
        pump.start()
    if not port_found.wait(startup_timeout) or not daemon.port:
        process.kill()
        process.wait()
        raise AssertionError("daemon did not start; log:\n" + "\n".join(daemon.log_lines))
    try:
        yield daemon
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass(frozen=True)
class Measured:
    """How a command ended, what it wrote, and its own peak resident memory."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int
    seconds: float


_MEASURE = (
    "import resource, subprocess, sys\n"
    "status = subprocess.run(sys.argv[2:], check=False).returncode\n"
    "with open(sys.argv[1], 'w') as file:\n"
    "    file.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))\n"
    "sys.exit(status)\n"
)
"""Runs a command and writes its peak memory to a file. Linux keeps a process's peak across
fork and exec, so a direct child of the (large) test process would report the test process's
own size; a child of this small wrapper reports its own."""


def run_measured(
    command: list[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> Measured:
    """Run `command` to its end with its own peak resident memory; killed (and the test failed)
    past `timeout` seconds."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as peak:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-c", _MEASURE, peak.name, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            pytest.fail(f"{' '.join(command)} still running after {timeout}s")
        return Measured(
            process.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            int(peak.read() or 0),
            time.monotonic() - started,
        )


def eventually(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `check` until it gives a truthy value (returned), or fail after `timeout` seconds
    naming `what` (and `detail()`, say the last answer or a log). The one way tests wait for
    something to happen; `eventually_async` is the same for tests on the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(timeout, what, detail))
        time.sleep(every)


async def eventually_async(
    check: Callable[[], T | Awaitable[T | None] | None],
    timeout: float,  # noqa: ASYNC109 - eventually()'s signature; the deadline is checked per poll
    what: str,
    *,
    every: float = 0.01,
    detail: Callable[[], str] | None = None,
) -> T:
    """`eventually` for a test running on the event loop (an in-process app or `SamplingLoop`):
    `check` may be a coroutine function, and the loop runs between polls."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(timeout, what, detail))
        await asyncio.sleep(every)


def _timed_out(timeout: float, what: str, detail: Callable[[], str] | None) -> str:
    message = f"timed out after {timeout}s waiting for {what}"
    return f"{message}; {detail()}" if detail is not None else message


def loop_cycles(sampling: SamplingLoop) -> int:
    """Cycles an in-process `SamplingLoop` completed, read as a scrape would
    (`gpuscope_sample_cycles_total` of its latest exposition; 0 before the first), without
    rendering it (rendering would change what the loop pre-renders)."""
    exposition = sampling.exposition
    if exposition is None:
        return 0
    return int(
        next(
            sample.value
            for family in exposition.families
            for sample in family.samples
            if sample.name == CYCLES
        )
    )


async def loop_cycles_pass(
    sampling: SamplingLoop,
    n: int,
    timeout: float = 10.0,  # noqa: ASYNC109 - as eventually_async's
) -> int:
    """Wait until an in-process `SamplingLoop` completed `n` more cycles; the count then."""
    start = loop_cycles(sampling)
    return await eventually_async(
        lambda: (now := loop_cycles(sampling)) >= start + n and now,
        timeout,
        f"{n} sampling cycles after cycle {start}",
    )


SampleKey = tuple[str, frozenset[tuple[str, str]]]


@functools.lru_cache(maxsize=8)
def _parsed(exposition: str) -> Mapping[SampleKey, float]:
    """A text exposition parsed once: tests look up many series in the same few expositions."""
    found: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return MappingProxyType(found)


def samples(exposition: str) -> dict[SampleKey, float]:
    """Every sample of a text exposition, keyed by (name, labels)."""
    return dict(_parsed(exposition))


def series(exposition: str, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one metric whose labels include `labels`."""
    wanted = set(labels.items())
    return {
        key_labels: value
        for (sample_name, key_labels), value in _parsed(exposition).items()
        if sample_name == name and wanted <= key_labels
    }


def value(exposition: str, name: str, **labels: str) -> float:
    found = series(exposition, name, **labels)
    assert len(found) == 1, f"{name}{labels}: expected one series, found {len(found)}"
    return next(iter(found.values()))


def patient(sampler: NvmlSampler) -> NvmlSampler:
    """`sampler` waiting as long as a test may for its GPUs' answers. On a manual clock the
    values follow that clock whenever the answers come, so a cycle need not give up on them; the
    daemon's half-interval wait, on a loaded machine, could let one GPU's answer miss its cycle
    and the test read that GPU as late."""
    sampler.wait_seconds = PATIENT_WAIT_SECONDS
    return sampler


PATIENT_WAIT_SECONDS: Final = 20.0


class ManualClock:
    """A clock that moves only when told: makes simulated time, and so values, deterministic."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
