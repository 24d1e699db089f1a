"""`gpuscope rightsize` as a user runs it: a subprocess, its exit status, output and peak memory;
and a scripted PromQL API on loopback (an aiohttp server in a thread) for it to talk to."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING

from aiohttp import web

from tests.helpers import ROOT, Measured, run_measured

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


def measured(*args: str, timeout: float) -> Measured:
    """Run the job and measure its own peak resident memory; killed, and the test failed, past
    `timeout`."""
    return run_measured([*COMMAND, *args], timeout=timeout)


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
