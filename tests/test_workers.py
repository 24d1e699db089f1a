"""`GpuThreads`: the GPUs read in one shared thread while they answer fast, a GPU stuck in a call
moved out of everyone else's way within the cycle, and what waits for a thread kept bounded."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import pytest

from exporter.nvml.workers import REJOIN_AFTER, SHARED_NAME, GpuThreads, GpuWorker, Ticket
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

    def read(self) -> int:
        if self.block is not None:
            self.block.wait(20)
        return self.index

    def follow_up(self, seconds: float = 0.0) -> None:
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
    follow_up: Callable[[FakeGpu], Callable[[], None]] | None = None,
) -> dict[int, Any]:
    """One cycle: a job per GPU, waited for until `wait`; each answering GPU's value."""
    batch = threads.submit(
        (gpu, gpu.read, follow_up(gpu) if follow_up is not None else None) for gpu in gpus
    )
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

    def follow_up(gpu: FakeGpu) -> Callable[[], None]:
        return gpu.follow_up

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

    def follow_up(gpu: FakeGpu) -> Callable[[], None]:
        return lambda: gpu.follow_up(0.03)

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
