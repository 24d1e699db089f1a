"""The one-thread executor the sampling loop, the web config's checks and the cluster writes run
in: jobs in order, in a daemon thread, awaited either through `concurrent.futures` (`submit`) or
straight on the loop (`run`, the sampling loop's cycle every second)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError as FutureCancelled

import pytest

from exporter.supervise import DaemonExecutor


def _blocked(executor: DaemonExecutor) -> threading.Event:
    """The executor's thread held in a job until the event is set."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    executor.submit(hold)
    assert started.wait(5)
    return release


async def test_run_answers_on_the_loop_from_the_executor_thread() -> None:
    executor = DaemonExecutor("test-executor")
    try:
        assert await executor.run(lambda: threading.current_thread().name) == "test-executor"
        assert await executor.run(lambda: None) is None
    finally:
        executor.shutdown()


async def test_run_hands_the_call_s_exception_to_its_awaiter() -> None:
    executor = DaemonExecutor("test-executor")

    def fail() -> None:
        raise ValueError("no answer")

    try:
        with pytest.raises(ValueError, match="no answer"):
            await executor.run(fail)
        assert await executor.run(lambda: 1) == 1, "the thread outlives the failure"
    finally:
        executor.shutdown()


async def test_run_and_submit_take_turns_in_the_order_given() -> None:
    executor = DaemonExecutor("test-executor")
    order: list[str] = []
    try:
        release = _blocked(executor)
        first = executor.run(lambda: order.append("run 1"))
        second = asyncio.wrap_future(executor.submit(order.append, "submit"))
        third = executor.run(lambda: order.append("run 2"))
        release.set()
        await asyncio.gather(first, second, third)
        assert order == ["run 1", "submit", "run 2"]
    finally:
        executor.shutdown()


async def test_a_run_whose_awaiter_stopped_waiting_before_it_started_is_skipped() -> None:
    executor = DaemonExecutor("test-executor")
    ran: list[str] = []
    try:
        release = _blocked(executor)
        skipped = executor.run(lambda: ran.append("skipped"))
        skipped.cancel()
        release.set()
        await executor.run(lambda: ran.append("next"))
        assert ran == ["next"]
    finally:
        executor.shutdown()


async def test_shutting_down_with_cancel_futures_cancels_what_waits_of_both_kinds() -> None:
    executor = DaemonExecutor("test-executor")
    release = _blocked(executor)
    awaited = executor.run(lambda: "never")
    submitted = executor.submit(lambda: "never")
    executor.shutdown(wait=False, cancel_futures=True)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await awaited
    with pytest.raises(FutureCancelled):
        submitted.result(5)
    with pytest.raises(RuntimeError, match="shut down"):
        executor.run(lambda: None)


def test_an_outcome_whose_loop_has_closed_is_dropped_and_the_thread_goes_on() -> None:
    executor = DaemonExecutor("test-executor")
    release = _blocked(executor)

    async def hand_in() -> None:
        executor.run(lambda: "too late")  # its loop ends before the call runs

    try:
        asyncio.run(hand_in())
        release.set()
        assert executor.submit(lambda: "still running").result(5) == "still running"
    finally:
        executor.shutdown()
