"""`GpuThreads`: the GPUs read in one shared thread while they answer fast (or, watched, in the
cycle's own thread), a GPU stuck in a call moved out of everyone else's way within the cycle, and
what waits for a thread kept bounded."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import pytest

from exporter.nvml.workers import (
    REJOIN_AFTER,
    SHARED_NAME,
    CycleMoved,
    GpuThreads,
    GpuWorker,
    Ticket,
)
from tests.helpers import eventually

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.timeout(30)


class FakeGpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.worker: GpuWorker[Any] | None = None
        self.ticket: Ticket[Any] | None = None
        self.block: threading.Event | None = None
        """Its read waits for this while set."""
        self.follow_up_block: threading.Event | None = None
        self.follow_ups = 0
        self.seconds = 0.0
        """How long its read takes."""
        self.read_in: list[str] = []
        """The threads its reads and follow-ups ran in, in order."""

    def read(self) -> int:
        self.read_in.append(threading.current_thread().name)
        if self.block is not None:
            self.block.wait(20)
        time.sleep(self.seconds)
        return self.index

    def follow_up(self, seconds: float = 0.0) -> None:
        self.read_in.append(threading.current_thread().name)
        if self.follow_up_block is not None:
            self.follow_up_block.wait(20)
        time.sleep(seconds)
        self.follow_ups += 1


def _threads(gpus: list[FakeGpu], *, slow_seconds: float = 0.1) -> GpuThreads[Any]:
    errors: list[Exception] = []
    threads: GpuThreads[Any] = GpuThreads(
        slow_seconds=slow_seconds,
        name=lambda gpu: f"gpu{gpu.index}",
        on_error=lambda gpu, error: errors.append(error),
    )
    threads.place(gpus)
    return threads


def _cycle(
    threads: GpuThreads[Any],
    gpus: list[FakeGpu],
    *,
    wait: float = 0.4,
    follow_up: Callable[[FakeGpu], None] | None = None,
) -> dict[int, Any]:
    """One cycle: a job per GPU, waited for until `wait`; each answering GPU's value."""
    batch = threads.submit((gpu, FakeGpu.read, follow_up) for gpu in gpus)
    threads.wait(batch, time.monotonic() + wait)
    answered = {}
    for gpu in gpus:
        ticket = batch.ticket(gpu)
        if ticket is not None and ticket.answered:
            answered[gpu.index] = ticket.value
    return answered


def test_fast_gpus_share_one_thread() -> None:
    gpus = [FakeGpu(n) for n in range(4)]
    threads = _threads(gpus)
    try:
        for _ in range(3):
            assert _cycle(threads, gpus) == {0: 0, 1: 1, 2: 2, 3: 3}
        assert len(threads.workers()) == 1
        assert threads.workers()[0]._thread.name == SHARED_NAME
    finally:
        threads.stop(time.monotonic() + 2)


def test_a_gpu_stuck_in_the_shared_thread_costs_only_itself_within_the_cycle() -> None:
    """GPU 1 hangs in its read while GPUs 2 and 3 wait behind it in the same thread: after
    `slow_seconds` they move to a new thread and still answer within the cycle's wait."""
    gpus = [FakeGpu(n) for n in range(4)]
    threads = _threads(gpus, slow_seconds=0.1)
    release = threading.Event()
    gpus[1].block = release
    try:
        answered = _cycle(threads, gpus, wait=0.4)
        assert answered == {0: 0, 2: 2, 3: 3}
        assert gpus[1].worker is not gpus[0].worker
        assert gpus[1].worker is not None
        assert gpus[1].worker._thread.name == "gpu1"
        # While stuck it owes an answer: no new job, no new thread, the others answer.
        for _ in range(3):
            assert _cycle(threads, gpus, wait=0.4) == {0: 0, 2: 2, 3: 3}
        assert threads.busy_since(gpus[1]) is not None
        assert len(threads.workers()) == 2
    finally:
        release.set()
    gpus[1].block = None
    eventually(lambda: threads.busy_since(gpus[1]) is None, 5, "GPU 1's call to return")
    for _ in range(REJOIN_AFTER + 2):
        assert _cycle(threads, gpus) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert len(threads.workers()) == 1, "fast again, GPU 1 rejoins the shared thread"
    threads.stop(time.monotonic() + 2)


def test_a_gpu_stuck_in_its_follow_up_read_costs_only_itself() -> None:
    gpus = [FakeGpu(n) for n in range(3)]
    threads = _threads(gpus, slow_seconds=0.1)
    release = threading.Event()
    gpus[0].follow_up_block = release
    follow_up = FakeGpu.follow_up
    try:
        assert _cycle(threads, gpus, follow_up=follow_up) == {0: 0, 1: 1, 2: 2}
        for _ in range(3):  # GPU 0's next job waits behind its own follow-up read
            assert _cycle(threads, gpus, follow_up=follow_up) == {1: 1, 2: 2}
        assert not threads.settle(time.monotonic() + 0.1), "a call is still in the driver"
    finally:
        release.set()
    assert threads.settle(time.monotonic() + 5)
    threads.stop(time.monotonic() + 2)


def test_follow_ups_wait_one_per_gpu_at_most() -> None:
    """Follow-up reads slower than the cycles (PCIe windows of several GPUs, a short interval)
    used to pile up in the shared thread's queue, one more per GPU every cycle."""
    gpus = [FakeGpu(n) for n in range(3)]
    threads = _threads(gpus, slow_seconds=1.0)

    def follow_up(gpu: FakeGpu) -> None:
        gpu.follow_up(0.03)

    try:
        queued = []
        for _ in range(30):
            assert _cycle(threads, gpus, wait=2.0, follow_up=follow_up) == {0: 0, 1: 1, 2: 2}
            (worker,) = threads.workers()
            with worker._cond:
                queued.append(len(worker._follow_ups))
        assert max(queued) <= len(gpus)
        assert all(gpu.follow_ups for gpu in gpus), "every GPU's follow-up still runs"
    finally:
        threads.stop(time.monotonic() + 2)


def test_a_gpu_dropped_after_its_cycles_is_freed_without_the_cycle_collector() -> None:
    # A job holds its GPU (its calls are bound to it) and is dropped once run: the GPU keeps
    # only its ticket, so a cycle leaves no garbage that only the cycle collector could free.
    gpus = [FakeGpu(n) for n in range(2)]
    threads = _threads(gpus)
    try:
        for _ in range(2):
            assert _cycle(threads, gpus) == {0: 0, 1: 1}
    finally:
        threads.stop(time.monotonic() + 2)
    freed = weakref.ref(gpus[0])
    gc.disable()
    try:
        del gpus
        assert freed() is None
    finally:
        gc.enable()


# -- watched: the shared GPUs read in the cycle's thread -----------------------------------------


def _watched(gpus: list[FakeGpu], *, slow_seconds: float = 0.1) -> GpuThreads[Any]:
    threads = _threads(gpus, slow_seconds=slow_seconds)
    threads.watched = True
    return threads


def test_watched_the_fast_gpus_are_read_in_the_cycles_thread_and_followed_up_in_the_shared_one() -> (
    None
):
    gpus = [FakeGpu(n) for n in range(3)]
    threads = _watched(gpus)
    follow_up = FakeGpu.follow_up
    here = threading.current_thread().name
    try:
        for _ in range(3):
            assert _cycle(threads, gpus, follow_up=follow_up) == {0: 0, 1: 1, 2: 2}
            eventually(lambda: threads.workers()[0].idle, 5, "the follow-ups to end")
        for gpu in gpus:
            assert gpu.read_in == [here, SHARED_NAME] * 3
        assert len(threads.workers()) == 1
    finally:
        threads.stop(time.monotonic() + 2)


def test_watched_a_busy_shared_thread_gets_the_jobs_behind_its_follow_ups() -> None:
    """A GPU's job never runs beside its own follow-up read: while the shared thread has one to
    make, the cycle's jobs queue behind it there, as unwatched."""
    gpus = [FakeGpu(n) for n in range(2)]
    threads = _watched(gpus, slow_seconds=1.0)
    release = threading.Event()
    gpus[0].follow_up_block = release
    try:
        assert _cycle(threads, gpus, follow_up=FakeGpu.follow_up) == {0: 0, 1: 1}
        assert _cycle(threads, gpus, wait=0.2) == {}, "queued behind GPU 0's follow-up"
        release.set()
        eventually(lambda: all(len(gpu.read_in) == 3 for gpu in gpus), 5, "the queued jobs")
        assert [gpu.read_in[2] for gpu in gpus] == [SHARED_NAME, SHARED_NAME]
    finally:
        release.set()
        threads.stop(time.monotonic() + 2)


class _Run:
    """A cycle run in a thread of its own, as the sampling loop's executor runs it."""

    def __init__(self, threads: GpuThreads[Any], gpus: list[FakeGpu], wait: float) -> None:
        self.answered: dict[int, Any] | None = None
        self.moved = False
        self._thread = threading.Thread(target=self._run, args=(threads, gpus, wait))
        self._thread.start()

    def _run(self, threads: GpuThreads[Any], gpus: list[FakeGpu], wait: float) -> None:
        try:
            self.answered = _cycle(threads, gpus, wait=wait)
        except CycleMoved:
            self.moved = True

    def join(self) -> None:
        self._thread.join(10)
        assert not self._thread.is_alive()


def _watch_until_moved(threads: GpuThreads[Any], within: float) -> float:
    """The watcher's part: look at the cycle's thread until it is stuck, then move the cycle;
    when, after the cycle's start."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        wait = threads.stuck_in()
        if wait <= 0 and threads.move():
            return time.monotonic() - started
        time.sleep(min(max(wait, 0.001), 0.01))
    raise AssertionError(f"the cycle was not moved within {within}s")


def test_watched_a_gpu_stuck_in_the_cycles_thread_keeps_it_and_the_cycle_moves() -> None:
    gpus = [FakeGpu(n) for n in range(4)]
    threads = _watched(gpus, slow_seconds=0.1)
    release = threading.Event()
    gpus[1].block = release
    try:
        stuck = _Run(threads, gpus, wait=0.4)
        moved_after = _watch_until_moved(threads, 2)
        assert 0.1 <= moved_after < 0.4
        assert not threads.move(), "moved once"
        # The cycle run again in a fresh thread: GPU 0 answered in the first run and is not
        # read twice; GPU 1 owes its answer; GPUs 2 and 3 answer, within the same deadline.
        again = _Run(threads, gpus, wait=0.4)
        again.join()
        assert again.answered == {2: 2, 3: 3}
        assert gpus[0].ticket is not None
        assert gpus[0].ticket.value == 0
        assert len(gpus[0].read_in) == 1
        assert gpus[1].worker is not None
        assert gpus[1].worker._thread.name == "gpu1"
        assert threads.busy_since(gpus[1]) is not None
        assert not threads.settle(time.monotonic() + 0.1), "GPU 1's call is still in the driver"
        # While it stays stuck the others are read each cycle in the cycle's thread.
        for _ in range(3):
            assert _cycle(threads, gpus) == {0: 0, 2: 2, 3: 3}
    finally:
        release.set()
    stuck.join()
    assert stuck.moved, "the stuck thread gives up its cycle once its call returns"
    assert gpus[1].ticket is not None
    assert gpus[1].ticket.answered
    assert threads.settle(time.monotonic() + 2), "nothing in the driver any more"
    gpus[1].block = None
    for _ in range(REJOIN_AFTER + 2):
        assert _cycle(threads, gpus) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert len(threads.workers()) == 1, "fast again, GPU 1 rejoins the shared GPUs"
    assert gpus[1].read_in[-1] == threading.current_thread().name
    threads.stop(time.monotonic() + 2)


def test_watched_jobs_not_begun_by_the_deadline_answer_late_from_the_shared_thread() -> None:
    gpus = [FakeGpu(n) for n in range(3)]
    for gpu in gpus:
        gpu.seconds = 0.06
    threads = _watched(gpus, slow_seconds=1.0)
    try:
        assert _cycle(threads, gpus, wait=0.09) == {0: 0, 1: 1}
        eventually(lambda: gpus[2].read_in == [SHARED_NAME], 5, "GPU 2 read in the shared thread")
        eventually(lambda: threads.busy_since(gpus[2]) is None, 5, "GPU 2's late answer")
    finally:
        threads.stop(time.monotonic() + 2)
