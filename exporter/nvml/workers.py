"""A thread of its own for each GPU's driver calls, so that a call that hangs holds up one GPU.

An NVML call can block for tens of seconds when a GPU falls off the bus. With every GPU read in
one thread, one such GPU would freeze the values of all the others. Instead each physical GPU
(with its MIG instances) is read by its own `GpuWorker`; the sampling cycle hands every worker a
job, waits for the answers until a deadline, and goes on with the GPUs that answered.

A worker runs at most one job at a time and holds at most one more: a GPU whose last job has not
delivered its answer is *busy*, and gets no new job until it does, so a call that stays stuck
for minutes costs one parked thread — never a growing queue or more threads. When the call
returns, the worker delivers (the answer is stale by then, and the sampler drops it) and takes
jobs again: the GPU comes back by itself.

A GPU is *busy* while it owes an answer (for hang detection), and *idle* only when no driver
call of its worker is under way or waiting to start, the job's `after` step included: NVML is
shut down (at a re-initialisation or at exit) only while every worker is idle.

Threading rule: a job's answer is handed over through its `Ticket` (written once by the worker,
then signalled; read by the sampler after the signal). Everything a job touches belongs to that
GPU alone, so jobs of different GPUs share nothing but thread-safe helpers (the log-once set,
the error counter, the simulator's own lock).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class Ticket(Generic[T]):
    """The answer to one job: a value or the exception it raised, once `done` is set."""

    __slots__ = ("done", "error", "submitted", "value")

    def __init__(self, submitted: float) -> None:
        self.submitted = submitted
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def wait(self, deadline: float, timer: Callable[[], float]) -> bool:
        """Whether the answer came by `deadline` (on `timer`'s clock)."""
        return self.done.wait(max(0.0, deadline - timer()))


class _Job(Generic[T]):
    __slots__ = ("after", "read", "ticket")

    def __init__(
        self, read: Callable[[], T], after: Callable[[], None] | None, ticket: Ticket[T]
    ) -> None:
        self.read = read
        self.after = after
        self.ticket = ticket


class GpuWorker:
    """One GPU's driver calls, in a daemon thread of their own."""

    def __init__(
        self,
        name: str,
        *,
        on_error: Callable[[Exception], None],
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timer = timer
        self._on_error = on_error
        self._cond = threading.Condition()
        self._job: _Job[Any] | None = None
        """Submitted and not yet answered (waiting or running)."""
        self._pending: _Job[Any] | None = None
        """Submitted while the worker still ran the previous job's `after` step."""
        self._in_driver = False
        """A job's `read` or its `after` step is running: a driver call may be under way."""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy_since(self) -> float | None:
        """When the job still owed an answer was submitted; None when none is."""
        with self._cond:
            job = self._job or self._pending
            return job.ticket.submitted if job is not None else None

    @property
    def idle(self) -> bool:
        """No driver call is under way or about to start: neither a job's `read` nor its `after`
        step runs, and none waits. Only then may NVML be shut down."""
        with self._cond:
            return not self._in_driver and self._pending is None

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `idle` (a job's `after` step takes tens of ms)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._in_driver and self._pending is None, timeout
            )

    def submit(
        self, read: Callable[[], T], *, after: Callable[[], None] | None = None
    ) -> Ticket[T] | None:
        """Run `read` (its answer goes to the ticket), then `after` (slow follow-up work whose
        result the next `read` may use). None, and nothing submitted, while busy."""
        with self._cond:
            if self._stop or self._job is not None or self._pending is not None:
                return None
            ticket: Ticket[T] = Ticket(self._timer())
            self._pending = _Job(read, after, ticket)
            self._cond.notify_all()
            return ticket

    def stop(self) -> None:
        """Ask the thread to end after the job in hand; returns at once (`join` waits)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` for the thread to end. A call hung in the driver is left to its
        daemon thread, which never holds up the process's exit."""
        self._thread.join(max(0.0, timeout))

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._pending is not None)
                if self._stop:
                    return
                job, self._pending = self._pending, None
                self._job = job
                self._in_driver = True
            assert job is not None
            ticket = job.ticket
            try:
                ticket.value = job.read()
            except BaseException as error:  # noqa: BLE001 - handed to the sampler, which decides
                ticket.error = error
            with self._cond:
                self._job = None  # answered: no longer owed, though the `after` step may run
            ticket.done.set()
            try:
                if job.after is not None and ticket.error is None:
                    job.after()
            except Exception as error:  # noqa: BLE001 - the thread must outlive any failure
                self._on_error(error)
            finally:
                with self._cond:
                    self._in_driver = False
                    self._cond.notify_all()
