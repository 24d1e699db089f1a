"""The threads that make the driver calls about GPUs, so that a call that hangs holds up one GPU.

An NVML call can block for tens of seconds when a GPU falls off the bus. Made blindly in the
sampling thread, such a call would freeze the cycle and every GPU's values. The sampler hands out
the cycle's jobs (`GpuThreads.submit`), waits for their answers until a deadline
(`GpuThreads.wait`), and goes on with the GPUs that answered.

While the GPUs answer fast, one thread reads them all, one after the other — the cycle's own
thread, when a watcher in another thread looks on (`GpuThreads.watched`: the sampling loop does),
else one shared worker thread (`gpuscope-gpus`) woken once a cycle, whose last answer wakes the
sampler. Read in the cycle's thread, a cycle costs no hand-off between threads; the watcher looks
at it once a cycle (`stuck_in`), and when it has been in one GPU's call for `slow_seconds` or is
in one at the cycle's deadline, it moves the cycle (`move`): that thread is left to the stuck GPU,
whose later jobs go to a thread of its own, and the watcher runs the cycle again in a fresh thread,
where the GPUs that answered are not read again and the deadline is the same. In a worker, a GPU
whose job has run for `slow_seconds` (its follow-up read for that long beyond the read's own
windows) keeps the thread it is stuck in, and the GPUs that thread was reading move, with their
queued jobs, to a new shared thread — in the same cycle, since `slow_seconds` is half of the
cycle's wait. A GPU in a thread of its own goes back to the shared GPUs once `REJOIN_AFTER` jobs in
a row answered within `slow_seconds`; one that stays slow keeps its thread. (A thread per GPU cost
more CPU than the reading: eight threads woken every cycle, and handing the GIL to each other
around every driver call.)

The shared GPUs' follow-up reads (PCIe throughput) and the calls beside the jobs (`call`: a GPU
trace's polls) always run in the shared worker; a job read in the cycle's thread is made there
too, behind them, while the worker has any to make, so that a GPU's job never runs beside its own
follow-up read.

A GPU owes at most one answer: one whose last job has not answered gets no new job until it
does, so a call stuck for minutes costs one parked thread — never a growing queue or more
threads. When the call returns, the job answers (stale by then: the sampler stopped waiting for
it) and the GPU takes jobs again, in its own thread until it has been fast for a while.

A worker is *idle* when no job or follow-up read of it runs or waits: NVML is shut down (at a
re-initialisation or at exit) only while every worker is idle and every job of a moved cycle has
answered.

Threading rules: a job's answer is written into its `Ticket` under the batch's lock (`answered`
last), and read by the sampler once it sees `answered`; a batch's jobs left to the cycle's thread,
the one it makes now and whether it was moved are under the same lock; a worker's queues and what
it runs now are under the worker's lock; which thread reads which GPU (`Gpu.worker`, `Gpu.ticket`,
`GpuThreads`) is the cycle's thread's to change — and the watcher's in `move`, while the stuck
thread is in the driver (it touches only its job's ticket and the batch once the call returns) and
before the fresh thread starts; another thread only reads the GPUs placed (`gpus`, a list replaced
whole) and a GPU's `worker` once, to queue a call (`call`). Everything a job touches belongs to its
GPU, so jobs of different GPUs share nothing but thread-safe helpers (the log-once set, the error
counter, the simulator's own lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

log = logging.getLogger(__name__)

T = TypeVar("T")
G = TypeVar("G", bound="Gpu")


class CallRefused(RuntimeError):
    """A call beside the jobs (`GpuThreads.call`) that will not run: the GPU's thread is
    stopping, NVML is about to be shut down, or the GPU is no longer read."""


class CycleMoved(RuntimeError):
    """Raised in a cycle's thread, once its stuck call returns, when its watcher has moved the
    cycle to a fresh thread (`GpuThreads.move`): nothing of the old run may go on."""


REJOIN_AFTER: Final = 10
"""Jobs in a row answered within `slow_seconds` before a GPU in a thread of its own goes back to
the shared thread."""
FOLLOW_UP_ALLOWANCE_SECONDS: Final = 0.04
"""What a follow-up read may take before `slow_seconds` starts counting: the PCIe throughput read
waits through two of the driver's 20 ms windows."""
SHARED_NAME: Final = "gpuscope-gpus"


class Gpu(Protocol):
    """What `GpuThreads` keeps on each GPU it reads; written by the sampler thread only."""

    worker: GpuWorker[Any] | None
    """The thread the GPU is read in now."""
    ticket: Ticket[Any] | None
    """Its last job's answer (owed while not `answered`)."""


class Ticket(Generic[T]):
    """The answer to one job of `batch`: a value or the exception it raised, once `answered`."""

    __slots__ = ("answered", "batch", "error", "seconds", "submitted", "value")

    def __init__(self, batch: Batch, submitted: float) -> None:
        self.batch = batch
        self.submitted = submitted
        self.value: T | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        """How long the job ran."""
        self.answered = False


class Batch:
    """One cycle's jobs: the sampler waits for the workers' all at once, woken by the last
    answer; those left to the cycle's thread (`here`) it makes itself before it waits.

    Two plain locks rather than a condition (the hand-off runs every cycle, and a condition's
    wait and notify are Python code): `lock` guards the workers' jobs still owed and the jobs
    left to the cycle's thread, and `_done`, held from the start, is released by the answer
    that settles the last of the workers' jobs."""

    __slots__ = (
        "_complete",
        "_done",
        "_owed",
        "deadline",
        "here",
        "left",
        "lock",
        "moved",
        "running",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()
        self._owed = 0
        self._complete = False
        """Whether the sampler has seen every job answer (the sampler thread's)."""
        self.deadline = float("inf")
        """Until when the cycle waits for the answers: a moved cycle's, for the cycle run again
        (`GpuThreads.submit`), else the one `GpuThreads.wait` is given."""
        self.here: deque[_Job[Any]] = deque()
        """The jobs the cycle's thread makes itself (`GpuThreads.wait`), under `lock`."""
        self.running: tuple[Gpu, float] | None = None
        """The GPU whose job the cycle's thread makes now, and since when; under `lock`."""
        self.moved = False
        """Whether a watcher moved the cycle off its thread (`GpuThreads.move`); under `lock`."""
        self.left: threading.Event | None = None
        """Once moved: set when the thread it was moved off has left the driver."""

    def ticket(self, gpu: Gpu) -> Ticket[Any] | None:
        """The GPU's job in this batch; None when it got none."""
        ticket = gpu.ticket
        return ticket if ticket is not None and ticket.batch is self else None

    def expect(self, jobs: int) -> None:
        """The number of jobs handed out to workers, set before any of them is."""
        self._owed = jobs
        if not jobs:
            self._done.release()

    def answer(self, ticket: Ticket[Any], value: Any, error: BaseException | None) -> None:
        with self.lock:
            ticket.value = value
            ticket.error = error
            ticket.answered = True
            self._owed -= 1
            last = not self._owed
        if last:
            self._done.release()

    def wait(self, timeout: float) -> bool:
        """Whether every job has answered, waiting up to `timeout` seconds."""
        if not self._complete:
            self._complete = self._done.acquire(timeout=max(0.0, timeout))
        return self._complete


_Job = tuple[G, "Callable[[G], Any]", "Callable[[G], None] | None", Ticket[Any]]
"""A GPU, its `read` (called with the GPU), the follow-up `after` (the same) to queue once `read`
answered without error, and the ticket `read`'s answer goes into. A plain tuple, dropped once run:
the GPU keeps its ticket, and nothing of the job (it holds the GPU) outlives the run."""


class GpuWorker(Generic[G]):
    """A daemon thread making the driver calls of the GPUs handed to it: their jobs in the order
    given, then each answered job's follow-up read (a job handed over meanwhile goes first)."""

    def __init__(
        self,
        name: str,
        *,
        on_error: Callable[[G, Exception], None],
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timer = timer
        self._on_error = on_error
        self._lock = threading.Lock()
        """Taken bare where nothing waits or notifies (`with` on the condition is Python code)."""
        self._cond = threading.Condition(self._lock)
        self._jobs: deque[_Job[G]] = deque()
        self._follow_ups: deque[tuple[G, Callable[[G], None]]] = deque()
        self._calls: deque[tuple[G, Callable[[], Any], Future[Any]]] = deque()
        """Calls beside the jobs (`call`), each answered through its future."""
        self._calls_open = True
        """Whether `call` takes more: closed while NVML may be shut down (`GpuThreads.settle`)."""
        self._running: tuple[G, float] | None = None
        """The GPU whose job or follow-up runs now, and when it started counting as slow."""
        self._stop = False
        self._idle_waiters = 0
        """Threads in `wait_idle`: the worker tells them when a call ends only while there are."""
        self.quick_jobs = 0
        """Its GPU's jobs in a row that answered within `slow_seconds`, while it reads one GPU
        alone (the sampler thread's)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def running(self) -> tuple[G, float] | None:
        """The GPU in the driver now, and since when its call counts towards `slow_seconds`."""
        with self._lock:
            return self._running

    @property
    def idle(self) -> bool:
        """No job or follow-up runs or waits: no driver call is under way or about to start."""
        with self._cond:
            return self._is_idle()

    def _is_idle(self) -> bool:
        return self._running is None and not self._jobs and not self._follow_ups and not self._calls

    def call(self, gpu: G, read: Callable[[], T]) -> Future[T]:
        """Run `read` about `gpu` in this thread after the jobs queued now, before follow-up
        reads (an on-demand trace's fast polls): its future answers with what `read` returned
        or raised, or fails with `CallRefused` if the thread stops or settles first."""
        future: Future[T] = Future()
        with self._cond:
            if self._stop or not self._calls_open:
                future.set_exception(CallRefused("the GPU's thread is stopping"))
                return future
            self._calls.append((gpu, read, future))
            self._cond.notify_all()
        return future

    def close_calls(self, *, closed: bool) -> None:
        """Refuse (`closed`) or take again calls beside the jobs; refusing drops those queued."""
        with self._cond:
            self._calls_open = not closed
            if closed:
                self._refuse_calls()

    def _refuse_calls(self) -> None:
        while self._calls:
            future = self._calls.popleft()[2]
            if future.set_running_or_notify_cancel():
                future.set_exception(CallRefused("the GPU's thread is stopping"))
        self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Whether the worker is idle, waiting up to `timeout` seconds."""
        with self._cond:
            self._idle_waiters += 1
            try:
                return self._cond.wait_for(self._is_idle, max(0.0, timeout))
            finally:
                self._idle_waiters -= 1

    def take(
        self, jobs: Iterable[_Job[G]], follow_ups: Iterable[tuple[G, Callable[[G], None]]] = ()
    ) -> None:
        with self._cond:
            self._jobs.extend(jobs)
            self._follow_ups.extend(follow_ups)
            self._cond.notify_all()

    def keep_only(self, gpu: G) -> tuple[list[_Job[G]], list[tuple[G, Callable[[G], None]]]]:
        """Take back the queued jobs and follow-ups of every other GPU (for another thread)."""
        with self._cond:
            jobs = [job for job in self._jobs if job[0] is not gpu]
            follow_ups = [item for item in self._follow_ups if item[0] is not gpu]
            self._jobs = deque(job for job in self._jobs if job[0] is gpu)
            self._follow_ups = deque(item for item in self._follow_ups if item[0] is gpu)
            return jobs, follow_ups

    def drop_follow_ups(self) -> None:
        """Forget the follow-ups not yet begun (their figures age by a cycle)."""
        with self._cond:
            self._follow_ups.clear()
            self._cond.notify_all()

    def rename(self, name: str) -> None:
        self._thread.name = name

    def stop(self) -> None:
        """Ask the thread to end after the call in hand, dropping what waits; returns at once."""
        with self._cond:
            self._stop = True
            self._jobs.clear()
            self._follow_ups.clear()
            self._refuse_calls()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` for the thread to end. A call hung in the driver is left to its
        daemon thread, which never holds up the process's exit."""
        self._thread.join(max(0.0, timeout))

    def _run(self) -> None:
        lock, cond = self._lock, self._cond
        while True:
            with lock:
                self._running = None
                if self._idle_waiters:
                    cond.notify_all()
                while not (self._stop or self._jobs or self._follow_ups or self._calls):
                    cond.wait()
                if self._stop:
                    return
                now = self._timer()
                job = self._jobs.popleft() if self._jobs else None
                beside = self._calls.popleft() if job is None and self._calls else None
                if job is not None:
                    self._running = (job[0], now)
                elif beside is not None:
                    self._running = (beside[0], now)
                else:
                    follow_up = self._follow_ups.popleft()
                    self._running = (follow_up[0], now + FOLLOW_UP_ALLOWANCE_SECONDS)
            if job is not None:
                self._answer(job, now)
                continue
            if beside is not None:
                _run_call(beside[1], beside[2])
                continue
            gpu, after = follow_up
            try:
                after(gpu)
            except Exception as error:  # noqa: BLE001 - the thread must outlive any failure
                self._on_error(gpu, error)

    def _answer(self, job: _Job[G], started: float) -> None:
        gpu, read, after, ticket = job
        value: Any = None
        error: BaseException | None = None
        try:
            value = read(gpu)
        except BaseException as caught:  # noqa: BLE001 - handed to the sampler, which decides
            error = caught
        ticket.seconds = self._timer() - started
        if error is None and after is not None:
            # Queued before the answer, so that the worker is not idle when the sampler wakes.
            with self._lock:
                self._add_follow_up(gpu, after)
        ticket.batch.answer(ticket, value, error)

    def follow_up(self, gpu: G, after: Callable[[G], None]) -> None:
        """Queue the follow-up read of a job made in another thread (`GpuThreads.wait`)."""
        with self._cond:
            self._add_follow_up(gpu, after)
            self._cond.notify_all()

    def _add_follow_up(self, gpu: G, after: Callable[[G], None]) -> None:
        # One per GPU at most: when the follow-ups of all the GPUs take longer than a cycle
        # (eight 40 ms PCIe windows, a short interval) the queue must not grow; the one queued
        # reads the GPU as it is when it runs, as a new one would.
        if all(queued is not gpu for queued, _ in self._follow_ups):
            self._follow_ups.append((gpu, after))


def _run_call(read: Callable[[], Any], future: Future[Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return  # its caller gave up on it
    try:
        future.set_result(read())
    except BaseException as error:  # noqa: BLE001 - handed to the caller, which decides
        future.set_exception(error)


class GpuThreads(Generic[G]):
    """Which thread reads which GPU: one shared by the GPUs that answer fast (the cycle's own
    thread, while watched), one of its own for each GPU that is slow. Used by the cycle's thread
    only, but for `gpus` and `call`, which any thread may use (a GPU trace's polls), and
    `stuck_in` and `move`, the watcher's."""

    def __init__(
        self,
        *,
        slow_seconds: float,
        name: Callable[[G], str],
        on_error: Callable[[G, Exception], None],
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`slow_seconds`: how long a GPU's job may run before the GPUs queued behind it move to
        another thread; `name`: its own thread's name for a GPU; `on_error`: a follow-up read
        that raised."""
        self.slow_seconds = slow_seconds
        self._name = name
        self._on_error = on_error
        self._timer = timer
        self._gpus: list[G] = []
        self._shared: GpuWorker[G] | None = None
        self.watched = False
        """Whether a watcher in another thread (the sampling loop) looks at the cycle's thread
        (`stuck_in`) and moves the cycle off it when it is stuck (`move`): only then does `wait`
        make the shared GPUs' jobs in the cycle's thread."""
        self._here: Batch | None = None
        """The batch whose jobs the cycle's thread makes now."""
        self._moved: list[threading.Event] = []
        """Each cycle moved off a stuck thread, set once that thread has left the driver."""
        self._carried: Batch | None = None
        """The batch just moved: its answers stand for the cycle run again (`submit` skips
        the GPUs that have one), and its deadline is that run's."""

    def place(self, gpus: Sequence[G]) -> None:
        """The GPUs of a fresh initialisation, all read by one new shared thread."""
        self._gpus = list(gpus)
        self._shared = self._worker(SHARED_NAME) if gpus else None
        self._moved = []
        self._carried = None
        for gpu in gpus:
            gpu.worker = self._shared
            gpu.ticket = None

    def workers(self) -> list[GpuWorker[G]]:
        """Every thread reading a GPU now."""
        found: dict[int, GpuWorker[G]] = {}
        for gpu in self._gpus:
            if gpu.worker is not None:
                found.setdefault(id(gpu.worker), gpu.worker)
        return list(found.values())

    def busy_since(self, gpu: G) -> float | None:
        """When the job the GPU still owes an answer to was handed out; None when it owes none."""
        ticket = gpu.ticket
        return ticket.submitted if ticket is not None and not ticket.answered else None

    def owing(self) -> bool:
        return any(self.busy_since(gpu) is not None for gpu in self._gpus)

    def submit(
        self, jobs: Iterable[tuple[G, Callable[[G], Any], Callable[[G], None] | None]]
    ) -> Batch:
        """Hand out one job per GPU (`read`, then the follow-up `after` once `read` answered
        without error), each to the thread its GPU is read in; a GPU that still owes an answer
        gets none, nor one whose answer a moved run of this cycle has (`move`). Each thread is
        woken once. While watched, the shared GPUs' jobs are left to `wait` to make (in the
        calling thread) when the shared thread is idle."""
        self._isolate_slow()  # stuck since before this cycle: queue nothing behind it
        now = self._timer()
        batch = Batch()
        carried, self._carried = self._carried, None
        if carried is not None:
            batch.deadline = carried.deadline
        shared = self._shared
        here = self.watched and shared is not None and shared.idle
        handed: dict[int, tuple[GpuWorker[G], list[_Job[G]]]] = {}
        for gpu, read, after in jobs:
            previous = gpu.ticket
            worker = gpu.worker
            if worker is None or (
                previous is not None and (not previous.answered or previous.batch is carried)
            ):
                continue
            if worker is not shared and previous is not None:
                worker = self._maybe_rejoin(gpu, worker, previous)
            ticket: Ticket[Any] = Ticket(batch, now)
            gpu.ticket = ticket
            if here and worker is shared:
                batch.here.append((gpu, read, after, ticket))
                continue
            pair = handed.get(id(worker))
            if pair is None:
                pair = handed[id(worker)] = (worker, [])
            pair[1].append((gpu, read, after, ticket))
        batch.expect(sum(len(queued) for _, queued in handed.values()))
        for worker, queued in handed.values():
            worker.take(queued)
        return batch

    def wait(self, batch: Batch, deadline: float) -> None:
        """Until every job of `batch` answered, or `deadline` (the moved cycle's, for a cycle run
        again). The jobs left to make here are made first, one after the other (`_make_here`).
        Meanwhile a GPU whose job has run `slow_seconds` in a worker gets the thread it is stuck
        in, and the GPUs behind it a new one."""
        batch.deadline = min(deadline, batch.deadline)
        if batch.here:
            self._make_here(batch)
        deadline = batch.deadline
        while True:
            now = self._timer()
            shared = self._shared
            running = shared.running() if shared is not None else None
            slow_at = now + self.slow_seconds if running is None else running[1] + self.slow_seconds
            if batch.wait(min(deadline, max(slow_at, now)) - now):
                return
            self._isolate_slow()
            if self._timer() >= deadline:
                return

    def settle(self, deadline: float) -> bool:
        """Whether every worker is idle (queued follow-ups dropped), waiting until `deadline`.
        Calls beside the jobs are refused meanwhile, and stay refused when it answers True (NVML
        is about to be shut down: the next `place` opens new threads)."""
        workers = self.workers()
        for worker in workers:
            worker.drop_follow_ups()
            worker.close_calls(closed=True)
        idle = all(worker.wait_idle(deadline - self._timer()) for worker in workers)
        # A cycle moved off a thread stuck in the driver: its call is still there until it answers.
        self._moved = [
            left for left in self._moved if not left.wait(max(0.0, deadline - self._timer()))
        ]
        idle = idle and not self._moved
        if not idle:
            for worker in workers:
                worker.close_calls(closed=False)
        return idle

    def gpus(self) -> tuple[G, ...]:
        """The GPUs placed now, for any thread: `place` and `stop` replace the list whole."""
        return tuple(self._gpus)

    def call(self, gpu: G, read: Callable[[], T]) -> Future[T]:
        """Run `read` about `gpu` in the thread that reads it now, between its jobs; for any
        thread. `gpu.worker` is a single reference the sampler replaces whole: a call queued on a
        thread the GPU just left runs there all the same (on a thread left to a slow GPU, late)."""
        worker = gpu.worker
        if worker is None:
            refused: Future[T] = Future()
            refused.set_exception(CallRefused("the GPU is not read now"))
            return refused
        return worker.call(gpu, read)

    def stop(self, deadline: float) -> None:
        """Ask every thread to end, then wait for them all until one shared `deadline`."""
        workers = self.workers()
        for worker in workers:
            worker.stop()
        for gpu in self._gpus:
            gpu.worker = None
        self._gpus = []
        self._shared = None
        for worker in workers:
            worker.join(deadline - self._timer())

    def _make_here(self, batch: Batch) -> None:
        """The jobs left to make in the cycle's thread, one after the other, while the watcher
        looks on; those not begun by the deadline go to the shared thread (they answer late, as
        they would there). Each job answers as the next one is taken, under the batch's lock.
        Raises `CycleMoved` once a job returns after the watcher moved the cycle (`move`)."""
        timer = self._timer
        lock = batch.lock
        jobs = batch.here
        self._here = batch
        job: _Job[G] | None = None
        value: Any = None
        error: BaseException | None = None
        started = 0.0
        late: list[_Job[G]] = []
        while True:
            with lock:
                now = timer()
                if job is not None:
                    ticket = job[3]
                    ticket.value = value
                    ticket.error = error
                    ticket.seconds = now - started
                    ticket.answered = True
                if batch.moved:
                    break
                if not jobs or now >= batch.deadline:
                    late.extend(jobs)
                    jobs.clear()
                    batch.running = None
                    self._here = None
                    break
                job = jobs.popleft()
                batch.running = (job[0], now)
                started = now
            gpu, read, after, _ = job
            try:
                value = read(gpu)
                error = None
            except BaseException as caught:  # noqa: BLE001 - handed to the sampler, which decides
                value = None
                error = caught
            worker = gpu.worker
            if error is None and after is not None and worker is not None:
                worker.follow_up(gpu, after)
        if batch.left is not None:
            batch.left.set()
            raise CycleMoved("the cycle was moved to a new thread while this one was in the driver")
        if late and self._shared is not None:
            # Uncounted in the batch (`expect` was set before): their answers may settle the
            # count before a worker's last job does, or take it below zero — harmless, since the
            # deadline has passed and the cycle waits no more (`_done` is released once, at zero).
            self._shared.take(late)

    def stuck_in(self) -> float:
        """For the watcher: seconds until the cycle's thread counts as stuck in a GPU's call —
        in one call for `slow_seconds`, or in one at the cycle's deadline (at most 0: stuck
        now); `slow_seconds` while it makes none."""
        batch = self._here
        running = batch.running if batch is not None else None
        if batch is None or running is None:
            return self.slow_seconds
        return min(running[1] + self.slow_seconds, batch.deadline) - self._timer()

    def move(self) -> bool:
        """For the watcher, from its own thread: when the cycle's thread is stuck (`stuck_in`),
        leave it to the GPU it is stuck in, whose later jobs go to a thread of its own, and take
        back the jobs it has not begun. The caller runs the cycle again in a fresh thread: the
        GPUs that answered in this run are not read again (`submit`), and the run keeps this
        one's deadline (`wait`). Whether it moved the cycle.

        The stuck thread touches nothing of the sampler's once its call returns (it answers its
        job and raises `CycleMoved`), and the fresh thread starts after this returns: so the
        watcher may write which thread reads which GPU here, the cycle's thread's otherwise."""
        batch = self._here
        if batch is None:
            return False
        with batch.lock:
            running = batch.running
            if (
                running is None
                or batch.moved
                or self._timer() < min(running[1] + self.slow_seconds, batch.deadline)
            ):
                return False
            batch.left = threading.Event()
            batch.moved = True
            left = list(batch.here)
            batch.here.clear()
            self._here = None
        for gpu, _, _, _ in left:
            gpu.ticket = None
        stuck = cast("G", running[0])  # a GPU of this `GpuThreads`, placed by `place`
        stuck.worker = self._worker(self._name(stuck))
        self._moved.append(batch.left)
        self._carried = batch
        log.info(
            "a GPU's driver calls run long; reading it in a thread of its own and the cycle in "
            "a new one",
            extra={"worker": self._name(stuck), "gpus_moved": len(left)},
        )
        return True

    def _worker(self, name: str) -> GpuWorker[G]:
        return GpuWorker(name, on_error=self._on_error, timer=self._timer)

    def _isolate_slow(self) -> None:
        """The shared thread, in one GPU's call for `slow_seconds`, becomes that GPU's own; the
        other GPUs it read, and what it held for them, move to a new shared thread."""
        shared = self._shared
        running = shared.running() if shared is not None else None
        if shared is None or running is None:
            return
        stuck, since = running
        if self._timer() - since < self.slow_seconds:
            return
        others = [gpu for gpu in self._gpus if gpu.worker is shared and gpu is not stuck]
        jobs, follow_ups = shared.keep_only(stuck)
        shared.rename(self._name(stuck))
        shared.quick_jobs = 0
        log.info(
            "a GPU's driver calls run long; reading it in a thread of its own",
            extra={"worker": self._name(stuck), "gpus_moved": len(others)},
        )
        if not others:
            self._shared = None
            return
        moved = self._worker(SHARED_NAME)
        for gpu in others:
            gpu.worker = moved
        moved.take(jobs, follow_ups)
        self._shared = moved

    def _maybe_rejoin(self, gpu: G, worker: GpuWorker[G], previous: Ticket[Any]) -> GpuWorker[G]:
        """The thread the GPU's next job goes to: back to the shared one once it has answered
        fast `REJOIN_AFTER` times in a row in a thread of its own, and nothing of it runs."""
        worker.quick_jobs = worker.quick_jobs + 1 if previous.seconds < self.slow_seconds else 0
        if worker.quick_jobs < REJOIN_AFTER or not worker.idle:
            return worker
        if self._shared is None:
            worker.rename(SHARED_NAME)
            self._shared = worker
            return worker
        worker.stop()  # idle: it ends without another call
        gpu.worker = self._shared
        return self._shared
