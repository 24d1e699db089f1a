"""Serving: listening where the settings say with the web config's security, until SIGTERM or
SIGINT (SIGHUP reloads the web config), then stopping under one deadline. The daemon and the
report server both serve this way; the listener itself is `exporter.web.server`'s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from typing import TYPE_CHECKING

from exporter.web.server import Listener

if TYPE_CHECKING:
    import logging
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from exporter.settings import ListenAddress
    from exporter.web.http import Handler
    from exporter.web.security import WebSecurity


class CannotListen(Exception):
    """The server cannot listen where it was told. `status` is the exit status: 2 where the
    address does not resolve (a mistake in the settings), 1 otherwise (the port is taken, or
    not ours to take: the machine's state)."""

    def __init__(self, address: ListenAddress, error: OSError) -> None:
        if isinstance(error, socket.gaierror):
            reason = (error.strerror or "").lower() or "no such host"
            super().__init__(f"cannot listen on {address}: the address does not resolve ({reason})")
            self.status = 2
        else:
            reason = os.strerror(error.errno).lower() if error.errno else str(error)
            super().__init__(f"cannot listen on {address}: {reason}")
            self.status = 1


async def resolve(address: ListenAddress) -> None:
    """Check, before anything starts, that the address resolves. Raises `CannotListen`."""
    try:
        await asyncio.get_running_loop().getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as error:
        raise CannotListen(address, error) from error


async def listen(handler: Handler, address: ListenAddress, security: WebSecurity) -> Listener:
    """Listen at `address` with `security`'s connections and TLS. Raises `CannotListen`."""
    listener = Listener(handler, security.connections, security.ssl_context)
    try:
        await listener.start(address.host, address.port)
    except OSError as error:
        raise CannotListen(address, error) from error
    return listener


async def serve_until_stopped(
    listener: Listener,
    security: WebSecurity,
    web_config_file: Path | None,
    logger: logging.Logger,
    *,
    shutdown_seconds: float,
    then: Callable[[], Awaitable[None]],
) -> None:
    """Serve until SIGTERM or SIGINT, reloading the web config file on SIGHUP; then, at once and
    under one deadline of `shutdown_seconds`, stop the listener (requests being answered get
    all but the last second of it) and run `then` (the rest of the program's stop). Past the
    deadline whatever has not stopped is left (its threads end with the process)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    reloads: set[asyncio.Task[bool]] = set()

    def reloaded(task: asyncio.Task[bool]) -> None:
        reloads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("a web config reload failed", exc_info=task.exception())

    def reload() -> None:
        if stop.is_set():
            return  # stopping: a reload now would only be abandoned
        if web_config_file is None:
            logger.info("SIGHUP: no --web.config.file to reload")
            return
        task = asyncio.create_task(security.reload(reason="SIGHUP"), name="gpuscope-web-reload")
        reloads.add(task)
        task.add_done_callback(reloaded)

    loop.add_signal_handler(signal.SIGHUP, reload)
    await stop.wait()
    logger.info("stopping")
    started = loop.time()
    # A reload under way is abandoned: its files are read in a daemon thread, which a file that
    # never answers may keep for ever, but which keeps neither this stop nor the process's exit.
    abandoned = set(reloads)
    for task in abandoned:
        task.cancel()
    stopping = asyncio.gather(
        listener.stop(max(shutdown_seconds - 1.0, shutdown_seconds / 2)),
        then(),
        *((asyncio.wait(abandoned),) if abandoned else ()),
    )
    try:
        async with asyncio.timeout(shutdown_seconds):
            await stopping
    except TimeoutError:
        logger.warning(
            "stopping took too long; exiting with what has not stopped",
            extra={"seconds": shutdown_seconds},
        )
    logger.info("stopped", extra={"seconds": round(loop.time() - started, 2)})
