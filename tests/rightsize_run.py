"""`gpuscope rightsize` as a user runs it: a subprocess, its exit status, output and peak memory;
and a scripted PromQL API on loopback (an aiohttp server in a thread) for it to talk to."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from aiohttp import web

from tests.helpers import ROOT

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

COMMAND = (sys.executable, "-m", "exporter", "rightsize")


def rightsize(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int
    seconds: float


def measured(*args: str, timeout: float) -> Measured:
    """Run the job and measure its peak resident memory (its own, from wait4: not that of
    other children of the test process). Killed, and the test failed, past `timeout`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        process = subprocess.Popen([*COMMAND, *args], stdout=out, stderr=err, cwd=ROOT)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - started > timeout:
                process.kill()
                os.wait4(process.pid, 0)
                process.returncode = -9
                pytest.fail(f"gpuscope rightsize {' '.join(args)} ran past {timeout}s")
            time.sleep(0.05)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return Measured(
            process.returncode,
            out.read().decode(),
            err.read().decode(),
            usage.ru_maxrss * 1024,  # KiB on Linux
            seconds,
        )


@contextmanager
def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Iterator[str]:
    """An HTTP server on a free loopback port answering every request with `handler`, in a
    thread of its own; yields its base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-promql", daemon=True)
    thread.start()

    async def start() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
