"""The on-demand GPU trace's parts in-process: calls beside a GPU worker's jobs, the simulator's
sample buffers, the endpoint off (404), and a trace cut by the daemon's stop or by its client
leaving. Against a running daemon: tests/test_trace.py."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from exporter.app import App
from exporter.config import ServeConfig
from exporter.nvml.workers import CallRefused, GpuThreads
from exporter.simulator import SimulatedNvml, default_fleet
from exporter.simulator.samples import SAMPLE_PERIOD_US
from tests.helpers import eventually_async

if TYPE_CHECKING:
    from exporter.nvml.workers import GpuWorker, Ticket
    from tests.served_app import AppClient

pytestmark = pytest.mark.timeout(30)

CONFIG = replace(ServeConfig(), collect_interval=0.1)


class _Gpu:
    def __init__(self) -> None:
        self.worker: GpuWorker[Any] | None = None
        self.ticket: Ticket[Any] | None = None


def _threads() -> tuple[GpuThreads[_Gpu], _Gpu]:
    threads: GpuThreads[_Gpu] = GpuThreads(
        slow_seconds=5.0, name=lambda _: "gpuscope-gpu0", on_error=lambda *_: None
    )
    gpu = _Gpu()
    threads.place([gpu])
    return threads, gpu


def test_a_call_runs_on_the_gpus_worker_and_counts_as_work() -> None:
    threads, gpu = _threads()
    release = threading.Event()
    try:
        held = threads.call(gpu, lambda: (release.wait(5), threading.current_thread().name)[1])
        assert gpu.worker is not None
        assert not gpu.worker.wait_idle(0.05), "a call in the driver: the worker is not idle"
        release.set()
        assert held.result(5) == "gpuscope-gpus"
        assert gpu.worker.wait_idle(5)
        failing = threads.call(gpu, lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(5)
    finally:
        release.set()
        threads.stop(5.0)


def test_calls_are_refused_while_nvml_may_be_shut_down() -> None:
    """`settle` (before nvmlShutdown) refuses calls, and takes them again when it finds a call
    still in the driver (no shutdown then); a stopped worker refuses them too."""
    threads, gpu = _threads()
    release = threading.Event()
    running = threading.Event()
    try:
        held = threads.call(gpu, lambda: (running.set(), release.wait(5)))
        assert running.wait(5)
        assert not threads.settle(time.monotonic() + 0.05), "a call in the driver: not idle"
        release.set()
        held.result(5)
        assert threads.call(gpu, lambda: "again").result(5) == "again"
        assert threads.settle(time.monotonic() + 5.0)
        with pytest.raises(CallRefused):
            threads.call(gpu, lambda: "after settling").result(5)
    finally:
        release.set()
        threads.stop(5.0)
    with pytest.raises(CallRefused):
        threads.call(gpu, lambda: "after stopping").result(5)


def test_the_simulator_keeps_sample_buffers() -> None:
    wall = [1_000.0]
    driver = SimulatedNvml(default_fleet(1), wall=lambda: wall[0])
    driver.nvmlInit()
    handle = driver.nvmlDeviceGetHandleByIndex(0)
    kind, samples = driver.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)
    assert kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    times = [sample.timeStamp for sample in samples]
    assert all(later - earlier == SAMPLE_PERIOD_US for earlier, later in itertools.pairwise(times))
    assert samples[-1].sampleValue.uiVal == driver.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_NotFound):
        driver.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, times[-1])
    wall[0] += 0.5
    _, fresh = driver.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, times[-1])
    assert len(fresh) == 10, "20 Hz"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        driver.nvmlDeviceGetSamples(handle, pynvml.NVML_DEC_UTILIZATION_SAMPLES, 0)


async def _ready(app_client: Any, config: ServeConfig) -> AppClient:
    client: AppClient = await app_client(App(config, SimulatedNvml(default_fleet(2))))

    async def ready() -> bool:
        return (await client.get("/-/ready")).status == 200

    await eventually_async(ready, 4, "the app to be ready", every=0.02)
    return client


async def test_off_by_default_the_path_is_unknown(app_client: Any) -> None:
    client = await _ready(app_client, CONFIG)
    trace = await client.get("/debug/gpu-trace?seconds=1")
    unknown = await client.get("/debug/nothing-here")
    assert trace.status == unknown.status == 404
    assert await trace.read() == await unknown.read()
    assert "gpu-trace" not in await (await client.get("/")).text()


async def test_the_daemons_stop_cuts_a_trace(app_client: Any) -> None:
    client = await _ready(app_client, replace(CONFIG, enable_trace=True))
    tracing = client.app.tracing
    assert tracing is not None
    answer = asyncio.create_task(client.get("/debug/gpu-trace?seconds=60"))
    await eventually_async(lambda: tracing.busy, 5, "the trace to begin")
    await client.app.stop()
    response = await asyncio.wait_for(answer, 5)
    assert response.status == 503
    assert await response.text() == "the daemon is stopping\n"
    assert not tracing.busy


async def test_a_client_that_leaves_frees_its_gpu(app_client: Any) -> None:
    client = await _ready(app_client, replace(CONFIG, enable_trace=True))
    tracing = client.app.tracing
    assert tracing is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(b"GET /debug/gpu-trace?seconds=60&gpu=0 HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await eventually_async(lambda: tracing.busy, 5, "the trace to begin")
    writer.close()
    await writer.wait_closed()
    await eventually_async(lambda: not tracing.busy, 5, "the GPU to be free")
    again = await client.get("/debug/gpu-trace?seconds=1&gpu=0")
    assert again.status == 200
    assert reader.at_eof() or not await reader.read()
