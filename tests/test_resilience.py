"""Never silently stale: the daemon survives its own faults, a hung GPU costs only that GPU, and
its health endpoints say when sampling has stopped.

Subprocess tests run `gpuscope serve` as a user does (on the simulator, or the real pynvml over
the fake libnvidia-ml.so.1); in-process tests drive `SamplingLoop` and the app directly where a
fault cannot be provoked from outside (a wedged or dead loop, a crash in a background thread).
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import random
import re
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from exporter.app import App
from exporter.config import ServeConfig
from exporter.metrics.families import BuildInfo
from exporter.nvml.sampler import NvmlSampler
from exporter.sampling import HealthBounds, SamplingLoop
from exporter.simulator import SimulatedNvml, default_fleet
from exporter.simulator.fleet import parse_fleet
from exporter.supervise import SupervisedThread, TaskHealth, background_task, supervised
from tests.fake_nvml import FakeDevice, FakeNvmlState
from tests.fake_nvml.node import fake_env
from tests.helpers import (
    CYCLES,
    FLEETS,
    ManualClock,
    eventually,
    eventually_async,
    loop_cycles_pass,
    patient,
    running_daemon,
    series,
    value,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.helpers import Daemon
    from tests.served_app import AppClient

STORM_SECONDS = float(os.environ.get("GPUSCOPE_TEST_STORM_SECONDS", "60"))
"""How long the scrape storm lasts: a minute by default (the README's soak runs ten)."""


def log_lines(daemon: Daemon, fragment: str) -> list[str]:
    return [line for line in daemon.log_lines if fragment in line]


# -- the race between scrapes and rendering ------------------------------------------------------


def _scraper(
    port: int, accept_openmetrics: bool, gzip: bool, stop: float, failures: list[str]
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {}
    if accept_openmetrics:
        headers["Accept"] = "application/openmetrics-text;version=1.0.0"
    if gzip:
        headers["Accept-Encoding"] = "gzip"
    pause = random.Random(port + 2 * accept_openmetrics + gzip)
    while time.monotonic() < stop:
        try:
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                failures.append(f"HTTP {response.status}")
        except (OSError, http.client.HTTPException) as error:
            failures.append(repr(error))
            connection.close()
        # Up to 1.5 intervals between scrapes: a format's first scrape of a snapshot then often
        # lands while the next cycle renders (the race's window).
        time.sleep(pause.uniform(0, 0.15))


@pytest.mark.timeout(STORM_SECONDS + 90)
def test_a_scrape_storm_in_both_formats_never_stalls_the_sampler() -> None:
    """Four clients scrape text and OpenMetrics, with and without gzip, for a minute while the
    sampler runs every 100 ms; cycles keep advancing and no scrape fails.

    How we know it catches the race it was written for: before the fix, scrapes recorded their
    format in a set the worker thread iterated while rendering the next snapshot; with this
    64-GPU fleet (a render of ~4,000 series is a wide window) and these pauses, that raised
    `RuntimeError: Set changed size during iteration` in the worker and sampling stopped for
    good — within 5 to 40 seconds in every run tried — while scrapes kept answering 200."""
    with running_daemon("--simulate=64", "--collect.interval=100ms") as daemon:
        daemon.wait_ready()
        stop = time.monotonic() + STORM_SECONDS
        failures: list[str] = []
        clients = [
            threading.Thread(target=_scraper, args=(daemon.port, om, gz, stop, failures))
            for om in (False, True)
            for gz in (False, True)
        ]
        for client in clients:
            client.start()
        seen = daemon.cycles()
        while time.monotonic() < stop:
            time.sleep(2.0)  # the storm lasts STORM_SECONDS: cycles are counted every 2 s of it
            now = daemon.cycles()
            assert now > seen + 5, f"sampling stalled at cycle {now:.0f}"
            seen = now
        for client in clients:
            client.join(15)
        assert daemon.get("/-/ready")[0] == 200
        assert daemon.get("/-/healthy")[0] == 200
    assert not failures, failures[:5]
    assert not log_lines(daemon, "level=error"), log_lines(daemon, "level=error")


# -- unexpected errors: a reading, a GPU, a whole cycle ---------------------------------------


def test_a_reading_that_raises_is_logged_counted_and_sampling_goes_on(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "gpus: [{model: h100-sxm, count: 2}]\n"
        "processes: [{pid: 7, gpu: 0, memory: 1GiB}]\n"
        "faults:\n"
        "  - {kind: exception, function: nvmlDeviceGetPowerUsage, gpu: 0, at: 1s, until: 4s,\n"
        "     exception: TypeError}\n"
    )
    with running_daemon(
        f"--simulate={fleet}", "--collect.interval=100ms", "--log.level=debug"
    ) as daemon:
        daemon.wait_ready()
        during = eventually(
            lambda: (
                (text := daemon.metrics())
                and value(text, "gpuscope_sample_errors_total") >= 3
                and text
            ),
            10,
            "errors to be counted",
        )
        assert not series(during, "gpu_power_watts", gpu="0"), "the failing reading is omitted"
        assert series(during, "gpu_power_watts", gpu="1"), "the other GPU is unaffected"
        assert value(during, "gpu_up", gpu="0") == 1, "the rest of GPU 0 is still read"
        assert series(during, "gpu_temperature_celsius", gpu="0")
        before = daemon.cycles()
        after = eventually(
            lambda: (
                (text := daemon.metrics()) and series(text, "gpu_power_watts", gpu="0") and text
            ),
            10,
            "the reading to come back once the fault ends",
        )
        assert value(after, CYCLES) > before
        settled = value(after, "gpuscope_sample_errors_total")
        later = daemon.wait_cycles(5)
        assert value(later, "gpuscope_sample_errors_total") == settled
    errors = log_lines(daemon, "unexpected error reading NVML")
    assert len([line for line in errors if "level=error" in line]) == 1, "logged once"
    assert "TypeError: simulated TypeError in nvmlDeviceGetPowerUsage" in errors[0]
    tracebacks = [line for line in errors if "level=debug" in line]
    assert tracebacks
    assert "Traceback (most recent call last)" in tracebacks[0]


def _loop(interval: float = 0.05) -> tuple[SamplingLoop, SimulatedNvml]:
    driver = SimulatedNvml(default_fleet(2))
    loop = SamplingLoop(
        replace(ServeConfig(), collect_interval=interval), driver, build=BuildInfo("0")
    )
    return loop, driver


async def test_a_cycle_that_raises_is_one_bad_cycle(caplog: pytest.LogCaptureFixture) -> None:
    sampling, _ = _loop()
    await sampling.start()
    real_cycle = sampling.cycle
    failing = {"left": 3}

    def sometimes_failing() -> Any:
        if failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("Set changed size during iteration")
        return real_cycle()

    sampling.cycle = sometimes_failing  # type: ignore[method-assign]
    task = sampling.begin()
    try:
        await eventually_async(
            lambda: sampling.exposition is not None and failing["left"] == 0,
            4,
            "the failing cycles and a good one",
        )
        await loop_cycles_pass(sampling, 3)
        assert not task.done()
        assert sampling.ready() == (True, "OK")
        text = sampling.exposition.render("text").body.decode()  # type: ignore[union-attr]
        assert "gpuscope_sample_errors_total 3.0" in text
    finally:
        await sampling.close()
    failed = [r for r in caplog.records if "sampling cycle failed" in r.getMessage()]
    assert len(failed) == 1, "once per distinct error"


async def test_a_gpu_whose_answer_makes_no_sense_is_down_with_reason_error() -> None:
    driver = SimulatedNvml(default_fleet(2))
    real_memory = driver.nvmlDeviceGetMemoryInfo

    def garbled(handle: Any, version: int | None = None) -> Any:
        if handle.device.gpu.index == 1:
            return object()  # a struct of a layout nobody expected
        return real_memory(handle, version)

    driver.nvmlDeviceGetMemoryInfo = garbled  # type: ignore[method-assign]
    sampler = NvmlSampler(driver)
    sampler.start()
    try:
        gpus, (status, *_) = sampler.sample()
    finally:
        sampler.close()
    by_index = {gpu.identity.index: gpu for gpu in gpus}
    assert status.success
    assert by_index[0].up
    assert not by_index[1].up
    assert by_index[1].down_reason == "error"
    assert sampler.errors_total == 1


# -- a GPU hung in the driver -------------------------------------------------------------------


def _hung_node(*, hang: bool) -> FakeNvmlState:
    return FakeNvmlState(
        devices=[
            FakeDevice.numbered(i, util_gpu_percent=50, hang=hang and i == 1) for i in range(3)
        ]
    )


def _busy(text: str, gpu: str) -> float:
    return value(text, "gpu_busy_seconds_total", gpu=gpu)


@pytest.mark.timeout(90)
def test_a_gpu_hung_in_the_real_driver_costs_only_that_gpu(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    """The real pynvml over the fake driver, whose every call about GPU 1 blocks until released."""
    state = _hung_node(hang=False).write(tmp_path / "state")
    with running_daemon("--collect.interval=100ms", env=fake_env(fake_lib_dir, state)) as daemon:
        daemon.wait_ready()
        eventually(lambda: _busy(daemon.metrics(), "0") > 0, 5, "busy time to accumulate")
        _hung_node(hang=True).write(state)
        hung_at = time.monotonic()
        down = eventually(
            lambda: (text := daemon.metrics()) and value(text, "gpu_up", gpu="1") == 0 and text,
            15,
            "the hung GPU to go down",
        )
        went_down = time.monotonic() - hung_at
        assert value(down, "gpu_down_reason", gpu="1", reason="hung") == 1
        assert not series(down, "gpu_utilization_ratio", gpu="1"), "stale values are dropped"
        assert series(down, "gpu_info", gpu="1"), "it keeps its identity"
        # The others keep their cadence: 5 cycles (of 100 ms) within a second, their counters
        # advance, all scrapes answer.
        before = down
        during = daemon.wait_cycles(5, since=value(before, CYCLES), timeout=1.0)
        for gpu in ("0", "2"):
            assert value(during, "gpu_up", gpu=gpu) == 1
            assert _busy(during, gpu) > _busy(before, gpu)
        assert daemon.get("/-/ready")[0] == 200
        assert daemon.get("/-/healthy")[0] == 200
        _hung_node(hang=False).write(state)
        back = eventually(
            lambda: (text := daemon.metrics()) and value(text, "gpu_up", gpu="1") == 1 and text,
            10,
            "the GPU to come back once its call returns",
        )
        assert not series(back, "gpu_down_reason")
        assert series(back, "gpu_utilization_ratio", gpu="1")
    assert went_down < 15
    assert log_lines(daemon, "driver calls have not returned")
    assert log_lines(daemon, "driver calls return again")


@pytest.mark.timeout(60)
def test_a_simulated_hang_shows_as_scripts_try_users_see_it(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "gpus: [{model: h100-sxm, count: 3}]\nfaults: [{kind: hang, gpu: 1, at: 1s, until: 6s}]\n"
    )
    with running_daemon(f"--simulate={fleet}", "--collect.interval=200ms") as daemon:
        daemon.wait_ready()
        down = eventually(
            lambda: (text := daemon.metrics()) and value(text, "gpu_up", gpu="1") == 0 and text,
            10,
            "the simulated hang",
        )
        assert value(down, "gpu_down_reason", gpu="1", reason="hung") == 1
        assert value(down, "gpu_up", gpu="0") == 1
        eventually(lambda: value(daemon.metrics(), "gpu_up", gpu="1") == 1, 15, "the hang to end")


def test_a_stuck_worker_holds_one_thread_and_takes_no_more_work() -> None:
    """While a call stays stuck, cycles add no threads and no queued jobs."""
    fleet = parse_fleet({"gpus": [{"model": "l4", "count": 2}], "faults": []})
    driver = SimulatedNvml(fleet)
    release = threading.Event()
    real = driver.nvmlDeviceGetTemperature

    def stuck(handle: Any, sensor: int) -> int:
        if handle.device.gpu.index == 1:
            release.wait(30)
        return real(handle, sensor)

    driver.nvmlDeviceGetTemperature = stuck  # type: ignore[method-assign]
    sampler = NvmlSampler(driver, interval=0.1)
    sampler.hang_seconds = 0.3
    sampler.start()
    try:
        sampler.sample()
        threads = threading.active_count()
        for _ in range(20):
            gpus, _ = sampler.sample()
        assert threading.active_count() == threads
        by_index = {gpu.identity.index: gpu for gpu in gpus}
        assert by_index[0].up
        assert by_index[1].down_reason == "hung"
    finally:
        release.set()
    eventually(lambda: all(g.up for g in sampler.sample()[0]), 5, "the GPU back")
    sampler.close()


async def test_a_gpu_stuck_in_the_sampler_thread_moves_the_cycle_and_costs_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sampling loop's thread reads the GPUs that answer fast itself: one stuck in a call
    there is left that thread, the cycle moves to a fresh sampler thread, and every cycle still
    publishes the other GPUs' values; the stuck call adds no thread while it lasts."""
    caplog.set_level(logging.INFO, logger="exporter.nvml.workers")
    fleet = parse_fleet({"gpus": [{"model": "l4", "count": 3}], "faults": []})
    driver = SimulatedNvml(fleet)
    hang = threading.Event()
    release = threading.Event()
    real = driver.nvmlDeviceGetTemperature

    def stuck(handle: Any, sensor: int) -> int:
        if handle.device.gpu.index == 1 and hang.is_set():
            release.wait(30)
        return real(handle, sensor)

    driver.nvmlDeviceGetTemperature = stuck  # type: ignore[method-assign]
    sampling = SamplingLoop(
        replace(ServeConfig(), collect_interval=0.2), driver, build=BuildInfo(version="test")
    )
    await sampling.start()
    sampling.begin()

    def gpus() -> dict[int, Any]:
        snapshot = sampling.snapshot
        return {gpu.identity.index: gpu for gpu in snapshot.gpus} if snapshot else {}

    def cycles() -> int:
        snapshot = sampling.snapshot
        return snapshot.cycles_total if snapshot else 0

    try:
        await eventually_async(lambda: len(gpus()) == 3, 5, "a first cycle")
        hang.set()
        await eventually_async(lambda: gpus()[1].down_reason == "hung", 10, "GPU 1 reported hung")
        assert "the cycle in a new one" in caplog.text
        threads = threading.active_count()
        seen = cycles()
        await eventually_async(lambda: cycles() >= seen + 5, 5, "cycles going on")
        assert threading.active_count() == threads
        assert gpus()[0].up
        assert gpus()[2].up
        assert sampling.ready() == (True, "OK")
    finally:
        release.set()
    await eventually_async(lambda: all(gpu.up for gpu in gpus().values()), 10, "GPU 1 back")
    await sampling.close()


# -- health --------------------------------------------------------------------------------------

CONFIG = replace(ServeConfig(), collect_interval=0.05)


async def _client(app_client: Any) -> AppClient:
    client: AppClient = await app_client(App(CONFIG, SimulatedNvml(default_fleet(2))))

    async def ready() -> bool:
        return (await client.get("/-/ready")).status == 200

    await eventually_async(ready, 4, "the app to be ready", every=0.02)
    return client


async def test_a_wedged_sampling_loop_fails_ready_then_healthy(app_client: Any) -> None:
    client = await _client(app_client)
    sampling = client.app.sampling
    sampling.bounds = HealthBounds(ready_seconds=0.3, alive_seconds=0.8)
    release = threading.Event()
    real_cycle = sampling.cycle

    def wedged() -> Any:
        release.wait(10)  # a driver call that never returns, say nvmlInit during re-init
        return real_cycle()

    sampling.cycle = wedged  # type: ignore[method-assign]
    try:
        await asyncio.sleep(0.5)  # wedged past ready_seconds, not yet past alive_seconds
        ready = await client.get("/-/ready")
        assert ready.status == 503
        assert "no sampling cycle finished" in await ready.text()
        assert (await client.get("/-/healthy")).status == 200, "slow is not dead yet"
        await asyncio.sleep(0.6)  # and now past alive_seconds
        healthy = await client.get("/-/healthy")
        assert healthy.status == 503
        assert "no sampling cycle finished" in await healthy.text()
        assert (await client.get("/metrics")).status == 200, "the last sample is still served"
    finally:
        release.set()

    async def recovered() -> bool:
        healthy = (await client.get("/-/healthy")).status == 200
        return healthy and (await client.get("/-/ready")).status == 200

    await eventually_async(recovered, 5, "healthy and ready once a cycle completes again")


@pytest.mark.timeout(90)
def test_a_driver_wedged_as_a_whole_fails_the_probes_and_still_stops(tmp_path: Path) -> None:
    """nvmlInit hangs during a re-initialisation: no cycle finishes again. /-/ready fails after
    5 intervals (at least 10 s), /-/healthy after 10 (at least 30 s) — the liveness probe then
    restarts the daemon — and SIGTERM still stops it within 5 s."""
    with running_daemon(
        f"--simulate={FLEETS / 'stalled-node.yaml'}", "--collect.interval=100ms"
    ) as daemon:
        daemon.wait_ready()
        stalled = eventually(
            lambda: (text := daemon.metrics()) and value(text, "gpu_up", gpu="0") == 0 and text,
            10,
            "the lost GPU",
        )
        assert value(stalled, "gpu_down_reason", gpu="0", reason="lost") == 1
        wedged_at = time.monotonic()
        eventually(lambda: daemon.get("/-/ready")[0] == 503, 20, "/-/ready to fail")
        assert daemon.get("/-/healthy")[0] == 200, "not dead yet"
        _, _, body = eventually(
            lambda: (answer := daemon.get("/-/healthy"))[0] == 503 and answer,
            40,
            "/-/healthy to fail",
        )
        assert time.monotonic() - wedged_at >= 25
        assert b"no sampling cycle finished" in body
        assert daemon.get("/metrics")[0] == 200, "the last sample is still served"
        stopping = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - stopping < 5
    assert log_lines(daemon, "stuck in a driver call")


async def test_a_dead_sampling_loop_fails_healthy(app_client: Any) -> None:
    client = await _client(app_client)
    sampling = client.app.sampling
    task = sampling.task
    assert task is not None
    task.cancel()
    await eventually_async(task.done, 5, "the loop's task to end")
    healthy = await client.get("/-/healthy")
    assert healthy.status == 503
    assert "not running" in await healthy.text()
    assert (await client.get("/-/ready")).status == 503


# -- background tasks restart ---------------------------------------------------------------------


def test_a_crashing_thread_is_restarted_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[float] = []
    done = threading.Event()

    def target() -> None:
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise KeyError("boom")
        done.wait(5)

    thread = SupervisedThread("test-thread", target, backoff=(0.05, 0.1))
    thread.start()
    eventually(lambda: len(runs) == 3, 5, "two restarts")
    assert thread.healthy
    assert runs[2] - runs[1] >= 0.09, "the second restart waits longer"
    done.set()
    thread.stop(1)
    crashes = [r for r in caplog.records if "background task failed" in r.getMessage()]
    assert len(crashes) == 1, "the same error is logged once"


async def test_a_crashing_task_is_restarted_and_reported() -> None:
    health = TaskHealth("web_config")
    states: list[bool] = []
    calls = {"n": 0}

    async def watch() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("inotify went away")
        states.append(health.healthy)
        await asyncio.sleep(10)

    task = asyncio.create_task(supervised(health, watch, backoff=(0.05,)))
    await eventually_async(lambda: calls["n"] == 1, 5, "the first run", every=0.001)
    assert not health.healthy, "unhealthy while waiting to restart"
    await eventually_async(lambda: calls["n"] == 2, 5, "the restart")
    assert states == [True]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_background_task_that_fails_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its owner may cancel and forget it: the done-callback has already told of the failure."""
    failures: list[BaseException] = []

    async def broken() -> None:
        raise KeyError("nobody expected this")

    with caplog.at_level(logging.ERROR):
        task = background_task(broken(), name="gpuscope-test", failed=failures.append)
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert [type(error) for error in failures] == [KeyError]
    assert [(r.getMessage(), getattr(r, "task", None)) for r in caplog.records] == [
        ("a background task failed", "gpuscope-test")
    ]
    cancelled = background_task(asyncio.sleep(10), name="gpuscope-quiet", failed=failures.append)
    cancelled.cancel()
    await asyncio.wait([cancelled])
    assert len(failures) == 1, "a cancelled task is no failure"


async def test_background_tasks_show_as_collectors(app_client: Any, tmp_path: Path) -> None:
    web_config = tmp_path / "web.yml"
    web_config.write_text("http_server_config: {headers: {X-Test: yes}}\n")
    config = replace(CONFIG, web_config_file=web_config)
    client: AppClient = await app_client(App(config, SimulatedNvml(default_fleet(1))))
    client.app.web_watch.healthy = False

    async def reported() -> str | None:
        response = await client.get("/metrics")
        text = await response.text() if response.status == 200 else ""
        return text if 'collector="web_config"} 0.0' in text else None

    text = await eventually_async(reported, 4, "the web-config watch reported", every=0.02)
    assert re.search(r'gpuscope_collector_success\{collector="events"\} 1\.0', text)
    assert 'gpuscope_collector_success{collector="web_config"} 0.0' in text
    assert 'gpuscope_collector_duration_seconds{collector="events"}' not in text


def test_process_metrics_are_served_from_the_snapshot() -> None:
    with running_daemon("--simulate=1", "--collect.interval=100ms") as daemon:
        daemon.wait_ready()
        text = daemon.metrics()
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "python_info",
    ):
        assert series(text, name), name
    assert series(text, "python_gc_collections_total", generation="0")
    assert value(text, "process_resident_memory_bytes") > 10 * 2**20


def test_why_a_gpu_is_down_is_told_apart() -> None:
    """Lost to the driver, or never opened: both are down, each with its own reason."""
    clock = ManualClock()
    driver = SimulatedNvml(
        parse_fleet(
            {
                "gpus": [{"model": "l4", "count": 3}],
                "faults": [
                    {"kind": "gpu_lost", "gpu": 1, "at": "5s"},
                    {"kind": "error", "function": "nvmlDeviceGetHandleByIndex", "gpu": 2},
                ],
            }
        ),
        clock=clock,
    )
    sampler = patient(NvmlSampler(driver, clock=clock))
    sampler.start()
    try:
        clock.advance(6)
        gpus, _ = sampler.sample()
    finally:
        sampler.close()
    assert [gpu.down_reason for gpu in gpus] == [None, "lost", "unopened"]
