"""Background work that never dies silently, nor keeps the process from stopping: a thread or
task that raises is logged, reported unhealthy and restarted after a backoff; the sampling loop's
worker is a daemon thread, so a call stuck in the driver cannot hold up the exit.

The daemon runs a few loops beside the sampling cycle (the XID event thread, the pod watch, the
web-config watch). Each catches the failures it expects; these wrappers catch the rest. A crash
is logged once per distinct error (its traceback at debug level), `healthy` is False from the
crash until the restarted loop runs again (`gpuscope_collector_success{collector}` shows it),
and restarts back off along `BACKOFF_SECONDS`. A loop that returns has finished on purpose (it
was asked to stop) and is not restarted.

Threading rule: `healthy` is a bool written by the supervising thread or task and read by the
sampling cycle — a single reference, never a compound update.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_SECONDS: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
STABLE_SECONDS: Final = 60.0
"""A loop that ran this long since its last restart starts the backoff from the beginning."""


@dataclass(slots=True)
class TaskHealth:
    """A supervised task's state, as the sampling cycle reports it (a collector)."""

    name: str
    healthy: bool = True


class _Restarts:
    """The crash-and-restart bookkeeping both wrappers share."""

    def __init__(
        self,
        name: str,
        backoff: tuple[float, ...],
        on_crash: Callable[[], None] | None,
        timer: Callable[[], float],
    ) -> None:
        self.name = name
        self.healthy = True
        self._backoff = backoff
        self._on_crash = on_crash
        self._timer = timer
        self._once = LogOnce(log)
        self._attempt = 0
        self._started = timer()

    def crashed(self, error: BaseException) -> float:
        """Record a crash; the answer is how long to wait before the restart."""
        self.healthy = False
        if self._timer() - self._started > STABLE_SECONDS:
            self._attempt = 0
        wait = self._backoff[min(self._attempt, len(self._backoff) - 1)]
        self._attempt += 1
        self._once.unexpected(
            (self.name,),
            "background task failed; restarting it",
            error,
            fields={"task": self.name, "restart_in_seconds": wait},
        )
        if self._on_crash is not None:
            self._on_crash()
        return wait

    def restarting(self) -> None:
        self._started = self._timer()
        self.healthy = True


class DaemonExecutor(Executor):
    """A one-thread executor whose thread never keeps the process alive.

    `ThreadPoolExecutor` joins its threads when the interpreter exits, so a job stuck in a driver
    call would keep a stopping daemon from ever exiting; this one's thread is a daemon thread.
    Jobs run one at a time, in order, whether handed in by `submit` or awaited through `run`."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], object]] | None] = (
            queue.SimpleQueue()
        )
        """Each job to run, and how to cancel it (`shutdown(cancel_futures=True)`)."""
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("the executor is shut down")
        future: Future[T] = Future()
        self._jobs.put((partial(_into_future, future, partial(fn, *args, **kwargs)), future.cancel))
        return future

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """`call()` in this thread, awaited on the running loop: its outcome is handed to the loop
        in one `call_soon_threadsafe`, without `concurrent.futures`' locks and conditions (the
        sampling loop awaits a cycle this way every second). An awaiter that stops waiting does
        not stop the call once it has started; one not yet started is skipped."""
        if self._closed:
            raise RuntimeError("the executor is shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put(
            (
                partial(_onto_loop, loop, future, call),
                partial(_on_loop, loop, future.cancel),
            )
        )
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # noqa: FBT001, FBT002 - Executor's signature
        self._closed = True
        if cancel_futures:
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[1]()
        self._jobs.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job[0]()


def _into_future(future: Future[T], call: Callable[[], T]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(call())
    except BaseException as error:  # noqa: BLE001 - handed to whoever waits on it
        future.set_exception(error)


def _onto_loop(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], call: Callable[[], T]
) -> None:
    # Read outside the loop: a flag the loop sets once. Seen late, the call runs and its outcome
    # is dropped by `_settle`, as it would be after the awaiter stopped waiting mid-call.
    if future.done():
        return  # its awaiter stopped waiting before it started
    result: T | None = None
    error: BaseException | None = None
    try:
        result = call()
    except BaseException as caught:  # noqa: BLE001 - handed to whoever awaits it
        error = caught
    _on_loop(loop, partial(_settle, future, result, error))


def _on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], object]) -> None:
    """`call()` on the loop, soon; from any thread."""
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody awaits it any more
        loop.call_soon_threadsafe(call)


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    """On the loop: the outcome, unless the awaiter has stopped waiting."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(cast("T", result))


async def in_daemon_thread(name: str, call: Callable[[], T]) -> T:
    """`call()` in a daemon thread of its own, awaited: unlike `asyncio.to_thread`, whose
    threads the loop joins when it ends, a call that overruns cannot hold up the exit."""
    executor = DaemonExecutor(name)
    try:
        return await asyncio.wrap_future(executor.submit(call))
    finally:
        executor.shutdown(wait=False)


class SupervisedThread:
    """Runs `target` in a daemon thread, again after a backoff whenever it raises."""

    def __init__(
        self,
        name: str,
        target: Callable[[], None],
        *,
        backoff: tuple[float, ...] = BACKOFF_SECONDS,
        on_crash: Callable[[], None] | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._restarts = _Restarts(name, backoff, on_crash, timer)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def healthy(self) -> bool:
        """False from a crash until the restarted loop runs again."""
        return self._restarts.healthy

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop restarting; the target must be told to return by its owner. Waits `timeout`."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._target()
            except Exception as error:  # noqa: BLE001 - whatever broke it, restart it
                if self._stopping.wait(self._restarts.crashed(error)):
                    return
                self._restarts.restarting()
                continue
            return


def background_task(
    coroutine: Coroutine[Any, Any, None],
    *,
    name: str,
    failed: Callable[[BaseException], None] | None = None,
) -> asyncio.Task[None]:
    """`coroutine` in a task of its own whose end is never silent: an exception it ends with is
    logged (with the task's name) and handed to `failed` (to count it), once, by a done-callback
    — so the task's owner may cancel and forget it without retrieving its result."""
    task = asyncio.create_task(coroutine, name=name)

    def ended(done: asyncio.Task[None]) -> None:
        if done.cancelled() or (error := done.exception()) is None:
            return
        log.error(
            "a background task failed", extra={"task": name}, exc_info=(type(error), error, None)
        )
        if failed is not None:
            failed(error)

    task.add_done_callback(ended)
    return task


async def supervised(
    health: TaskHealth,
    run: Callable[[], Awaitable[None]],
    *,
    backoff: tuple[float, ...] = BACKOFF_SECONDS,
    timer: Callable[[], float] = time.monotonic,
) -> None:
    """Await `run()` until it returns or this task is cancelled, restarting it after a backoff
    whenever it raises; `health` says meanwhile whether it runs."""
    restarts = _Restarts(health.name, backoff, None, timer)
    while True:
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever broke it, restart it
            health.healthy = False
            await asyncio.sleep(restarts.crashed(error))
            restarts.restarting()
            health.healthy = True
            continue
        return
