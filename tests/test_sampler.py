"""NvmlSampler over the simulated driver: readings, integration, and failing alone."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import pynvml
import pytest

from exporter.nvml.device import GPU_COLLECTORS
from exporter.nvml.driver import NvmlUnavailable
from exporter.nvml.sampler import NvmlSampler
from exporter.readings.clocks import CLOCK_EVENTS, CLOCKS, MAX_CLOCKS
from exporter.readings.declare import link_series
from exporter.readings.device import (
    BUSY,
    COMPUTE_MODE,
    DECODER,
    ENCODER,
    ENERGY,
    MEMORY_FREE,
    MEMORY_RESERVED,
    MEMORY_TEMPERATURE,
    MEMORY_TOTAL,
    MEMORY_USED,
    PERSISTENCE_MODE,
    POWER,
    POWER_LIMIT,
    POWER_LIMIT_DEFAULT,
    POWER_LIMIT_MAX,
    POWER_LIMIT_MIN,
    PSTATE,
    TEMPERATURE,
    UTILIZATION,
    fan_series,
)
from exporter.readings.gpm import GRAPHICS_ACTIVE, NVLINK_TRANSMIT
from exporter.readings.health import (
    ECC_AGGREGATE_CORRECTED,
    ECC_AGGREGATE_UNCORRECTED,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    PCIE_REPLAYS,
)
from exporter.readings.nvlink import NVLINK_ERRORS, NVLINK_RECEIVE_TOTAL, NVLINK_TRANSMIT_TOTAL
from exporter.readings.pcie import PCIE_GENERATION, PCIE_MAX_GENERATION, PCIE_MAX_WIDTH, PCIE_WIDTH
from exporter.simulator import SimulatedNvml
from exporter.simulator.fleet import parse_fleet
from tests.helpers import ManualClock, patient

if TYPE_CHECKING:
    from exporter.model import GpuSample
    from exporter.series import Series
    from exporter.simulator.state import Handle


def make(document: dict[str, object], **kwargs: object) -> tuple[NvmlSampler, ManualClock]:
    clock = ManualClock()
    driver = SimulatedNvml(parse_fleet(document), clock=clock, wall=lambda: 1.7e9 + clock())
    sampler = patient(NvmlSampler(driver, clock=clock, **kwargs))  # type: ignore[arg-type]
    sampler.start()
    return sampler, clock


def by_index(gpus: tuple[GpuSample, ...]) -> dict[int, GpuSample]:
    return {gpu.identity.index: gpu for gpu in gpus}


def test_reads_every_field() -> None:
    sampler, clock = make(
        {
            "gpus": [{"model": "rtx6000-ada"}],
            "processes": [
                {"pid": 77, "gpu": 0, "memory": "3GiB", "pattern": "steady", "level": 0.5}
            ],
        }
    )
    clock.advance(1)
    gpus, (status, *_) = sampler.sample()
    assert status.name == "nvml"
    assert status.success
    (gpu,) = gpus
    assert gpu.up
    assert gpu.identity.model == "NVIDIA RTX 6000 Ada Generation"
    assert gpu.identity.uuid.startswith("GPU-")
    assert gpu.identity.pci_bus_id == "00000000:18:00.0"
    assert gpu.identity.driver_version == "570.133.20"
    assert gpu.identity.cuda_version == "12.8"
    assert 0.45 <= (gpu.value(UTILIZATION) or 0) <= 0.55
    assert gpu.value(MEMORY_USED) == 3 * 2**30
    assert gpu.value(MEMORY_TOTAL) == 49140 * 2**20
    assert gpu.value(MEMORY_RESERVED) is not None
    assert gpu.value(POWER) is not None
    assert 25 < gpu.value(POWER) < 300
    assert gpu.value(POWER_LIMIT) == 300
    assert gpu.value(ENERGY) is not None
    assert gpu.value(ENERGY) > 0
    assert gpu.value(TEMPERATURE) is not None
    assert gpu.value(CLOCKS["sm"]) == 2505e6
    assert gpu.value(MAX_CLOCKS["memory"]) == 10001e6
    assert all(gpu.value(series) == 0 for series in CLOCK_EVENTS.values())
    assert 0.3 <= (gpu.value(fan_series(0)) or 0) <= 1.0
    assert gpu.value(fan_series(1)) is None, "one fan"
    assert gpu.value(ECC_CORRECTED) == 0
    assert gpu.value(ECC_UNCORRECTED) == 0
    assert gpu.value(PCIE_REPLAYS) == 0
    assert gpu.value(PSTATE) == 0
    assert gpu.processes is not None
    (process,) = gpu.processes
    assert process.pid == 77
    assert process.used_memory_bytes == 3 * 2**30
    assert process.sm_utilization == pytest.approx(gpu.value(UTILIZATION), abs=0.011)


def test_busy_seconds_integrate_utilization_over_time() -> None:
    sampler, clock = make(
        {"gpus": [{}], "processes": [{"pid": 1, "gpu": 0, "pattern": "steady", "level": 0.5}]}
    )
    total = 0.0
    previous = None
    for _ in range(20):
        gpu = sampler.sample()[0][0]
        if previous is not None:
            total += (gpu.value(UTILIZATION) or 0) * 0.5
        previous = gpu
        clock.advance(0.5)
    assert previous is not None
    assert previous.value(BUSY) == pytest.approx(total)
    assert 4.0 < total < 6.0  # about half of 9.5 s


def test_idle_processes_report_zero_not_unknown() -> None:
    sampler, clock = make({"gpus": [{}], "processes": [{"pid": 5, "gpu": 0, "pattern": "idle"}]})
    clock.advance(1)
    (gpu,) = sampler.sample()[0]
    assert gpu.processes is not None
    assert gpu.processes[0].sm_utilization == 0.0
    assert gpu.value(UTILIZATION) == 0.0


def test_unsupported_reading_drops_only_that_value_and_is_not_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler, clock = make(
        {
            "gpus": [{"count": 2}],
            "faults": [
                {
                    "kind": "error",
                    "gpu": 1,
                    "function": "nvmlDeviceGetPowerUsage",
                    "error": "not_supported",
                }
            ],
        }
    )
    caplog.set_level(logging.INFO)
    for _ in range(5):
        clock.advance(1)
        gpus = by_index(sampler.sample()[0])
    assert gpus[0].value(POWER) is not None
    assert gpus[1].value(POWER) is None
    assert gpus[1].up
    assert gpus[1].value(TEMPERATURE) is not None
    mentions = [r for r in caplog.records if getattr(r, "reading", None) == "power"]
    assert len(mentions) == 1


def test_transient_error_is_retried_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    sampler, clock = make(
        {
            "gpus": [{}],
            "faults": [
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetTemperature",
                    "error": "unknown",
                    "at": "2s",
                    "until": "5s",
                }
            ],
        }
    )
    caplog.set_level(logging.WARNING)
    temperatures = []
    for _ in range(8):
        clock.advance(1)
        temperatures.append(sampler.sample()[0][0].value(TEMPERATURE))
    assert [t is None for t in temperatures] == [
        False,
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    assert len([r for r in caplog.records if getattr(r, "reading", None) == "temperature"]) == 1


def test_missing_newer_function_falls_back_to_older_one() -> None:
    sampler, clock = make(
        {
            "gpus": [{}],
            "processes": [{"pid": 3, "gpu": 0, "memory": "1GiB"}],
            "faults": [
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetCurrentClocksEventReasons",
                    "error": "function_not_found",
                },
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetComputeRunningProcesses",
                    "error": "function_not_found",
                },
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetMemoryInfo",
                    "error": "argument_version_mismatch",
                },
            ],
        }
    )
    clock.advance(1)
    (gpu,) = sampler.sample()[0]
    assert (
        gpu.value(CLOCK_EVENTS["gpu_idle"]) is not None
    )  # from the deprecated throttle-reasons call
    assert gpu.processes is not None
    assert [p.pid for p in gpu.processes] == [3]


def test_lost_gpu_goes_down_alone_and_comes_back_after_reinit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sampler, clock = make(
        {
            "gpus": [{"count": 3}],
            "processes": [{"pid": 9, "gpu": 1, "pattern": "steady", "level": 0.8}],
            "faults": [{"kind": "gpu_lost", "gpu": 1, "at": "5s", "until": "12s"}],
        }
    )
    caplog.set_level(logging.INFO)
    history: list[dict[int, GpuSample]] = []
    for _ in range(40):
        clock.advance(1)
        gpus, (status, *_) = sampler.sample()
        assert status.success
        history.append(by_index(gpus))
    up = [snapshot[1].up for snapshot in history]
    assert up[:3] == [True] * 3
    assert not any(up[4:11])
    assert all(up[-10:]), "the GPU came back by itself"
    assert all(snapshot[0].up and snapshot[2].up for snapshot in history), "others kept reporting"
    down = history[6][1]
    assert down.identity.uuid == history[0][1].identity.uuid, "down GPU keeps its identity"
    assert down.value(UTILIZATION) is None
    back = history[-1][1]
    before = history[3][1]
    assert back.value(BUSY) is not None
    assert before.value(BUSY) is not None
    assert back.value(BUSY) > before.value(BUSY), "counter continues, never resets"
    messages = [r.getMessage() for r in caplog.records]
    assert any("stopped answering" in m for m in messages)
    assert any("answers again" in m for m in messages)


class SlowUtilization:
    """The simulator, with one GPU's utilization call taking `seconds` of real time."""

    def __init__(self, driver: SimulatedNvml, *, index: int, seconds: float) -> None:
        self._driver = driver
        self._index = index
        self._seconds = seconds

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> object:
        if handle.device is self._driver.nvmlDeviceGetHandleByIndex(self._index).device:
            time.sleep(self._seconds)
        return self._driver.nvmlDeviceGetUtilizationRates(handle)

    def __getattr__(self, name: str) -> object:
        return getattr(self._driver, name)


def test_a_gpu_always_slower_than_the_wait_reports_its_newest_answer() -> None:
    """Its every job answers after the cycle stopped waiting. Late answers used to be dropped:
    with no answer ever on time the GPU stayed down as hung although it answered every job, and
    one that answered once in time showed that answer for good (its busy counter frozen)."""
    clock = ManualClock()
    simulated = SimulatedNvml(
        parse_fleet(
            {
                "gpus": [{"count": 2}],
                "processes": [{"pid": 9, "gpu": 1, "pattern": "steady", "level": 0.8}],
            }
        ),
        clock=clock,
    )
    driver = SlowUtilization(simulated, index=1, seconds=0.12)
    sampler = NvmlSampler(driver, clock=clock, interval=0.1)  # type: ignore[arg-type]
    sampler.start()
    busy: list[float | None] = []
    for _ in range(24):
        clock.advance(0.5)
        gpus = by_index(sampler.sample()[0])
        assert gpus[0].up, "the fast GPU answers in time"
        busy.append(gpus[1].value(BUSY) if gpus[1].up else None)
        time.sleep(0.05)  # the rest of the cycle's interval
    sampler.close()
    assert all(value is not None for value in busy[-12:]), "the slow GPU is up"
    assert busy[-1] > busy[-12], "its busy counter moves on"  # type: ignore[operator]


def test_a_gpu_hanging_while_it_is_opened_costs_only_itself() -> None:
    """Its handle call does not return: NVML's start used to wait for it, so the daemon never
    came to listen. The others open and answer; it is down as hung, NVML is not shut down
    under its call, and once the call returns it is opened at the next re-initialisation."""
    clock = ManualClock()
    driver = SimulatedNvml(
        parse_fleet(
            {"gpus": [{"count": 3}], "faults": [{"kind": "hang", "gpu": 1, "until": "10s"}]}
        ),
        clock=clock,
    )
    shutdowns = 0
    shutdown = driver.nvmlShutdown

    def counting_shutdown() -> None:
        nonlocal shutdowns
        shutdowns += 1
        shutdown()

    driver.nvmlShutdown = counting_shutdown  # type: ignore[method-assign]
    sampler = patient(NvmlSampler(driver, clock=clock))
    starting = threading.Thread(target=sampler.start, daemon=True)
    starting.start()
    starting.join(15)
    try:
        assert not starting.is_alive(), "NVML's start waits for a GPU whose calls hang"
        for _ in range(3):
            clock.advance(1)
            gpus = by_index(sampler.sample()[0])
            assert gpus[0].up
            assert gpus[2].up
            assert gpus[1].down_reason == "hung"
            assert shutdowns == 0, "NVML shut down under a call in the driver"
        clock.advance(8)  # the hang is over: its opening returns
        for _ in range(3):
            clock.advance(1)
            gpus = by_index(sampler.sample()[0])
        assert all(gpu.up for gpu in gpus.values()), "opened at the next re-initialisation"
        assert shutdowns == 1
    finally:
        clock.advance(100)
        sampler.close()


def test_a_gpu_whose_opening_returned_is_not_hung_when_the_next_init_fails() -> None:
    """The GPUs still opening were forgotten only once the next initialisation had counted the
    GPUs: when `nvmlInit` itself failed, a GPU whose call had long returned stayed `hung`."""
    clock = ManualClock()
    driver = SimulatedNvml(
        parse_fleet(
            {
                "gpus": [{"count": 2}],
                "faults": [
                    {"kind": "hang", "gpu": 1, "until": "10s"},
                    {"kind": "init_error", "error": "driver_not_loaded", "at": "10s"},
                ],
            }
        ),
        clock=clock,
    )
    sampler = patient(NvmlSampler(driver, clock=clock))
    sampler.start()
    try:
        clock.advance(1)
        assert by_index(sampler.sample()[0])[1].down_reason == "hung"
        clock.advance(10)  # the hang is over; the re-initialisation due now fails
        gpus = by_index(sampler.sample()[0])
        assert not any(gpu.up for gpu in gpus.values())
        assert gpus[1].down_reason != "hung", "its opening returned"
    finally:
        sampler.close()


def test_reinit_backs_off_while_a_gpu_stays_lost() -> None:
    clock = ManualClock()
    driver = SimulatedNvml(
        parse_fleet(
            {"gpus": [{"count": 2}], "faults": [{"kind": "gpu_lost", "gpu": 0, "at": "1s"}]}
        ),
        clock=clock,
    )
    inits = 0
    original = driver.nvmlInit

    def counting_init() -> None:
        nonlocal inits
        inits += 1
        original()

    driver.nvmlInit = counting_init  # type: ignore[method-assign]
    sampler = NvmlSampler(driver, clock=clock)
    sampler.start()
    for _ in range(300):
        clock.advance(1)
        gpus = by_index(sampler.sample()[0])
        assert gpus[1].up
        assert not gpus[0].up or clock.now < 1
    # 1 start + retries after 1, 2, 5, 10, 30 s and then every 60 s: far fewer than 300
    assert 5 <= inits <= 12


def test_init_failure_at_start_is_retried() -> None:
    sampler, clock = make(
        {
            "gpus": [{}],
            "faults": [{"kind": "init_error", "error": "driver_not_loaded", "until": "3s"}],
        }
    )
    results = []
    for _ in range(10):
        clock.advance(1)
        gpus, (status, *_) = sampler.sample()
        results.append((status.success, [g.up for g in gpus]))
    assert results[0] == (False, [])
    assert results[-1] == (True, [True])


def test_missing_library_is_fatal() -> None:
    class NoLibrary:
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    sampler = NvmlSampler(NoLibrary())  # type: ignore[arg-type]
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 not found.*--simulate"):
        sampler.start()


def test_unexpected_exception_costs_only_its_reading(caplog: pytest.LogCaptureFixture) -> None:
    sampler, clock = make({"gpus": [{}]})
    driver = sampler._nvml

    def broken(handle: object) -> int:
        raise RuntimeError("struct size mismatch")

    driver.nvmlDeviceGetPcieReplayCounter = broken  # type: ignore[method-assign]
    clock.advance(1)
    (gpu,) = sampler.sample()[0]
    assert gpu.up
    assert gpu.value(PCIE_REPLAYS) is None
    assert gpu.value(POWER) is not None
    assert any("unexpected error" in r.getMessage() for r in caplog.records)


def test_processes_can_be_switched_off() -> None:
    fleet = {"gpus": [{}], "processes": [{"pid": 1, "gpu": 0}]}
    off = set(GPU_COLLECTORS) - {"processes"}
    sampler, clock = make(fleet, collectors=off, read_processes=False)
    clock.advance(1)
    assert sampler.sample()[0][0].processes is None
    # Pod attribution still needs the process lists, though no per-process series are exported.
    sampler, clock = make(fleet, collectors=off, read_processes=True)
    clock.advance(1)
    assert [p.pid for p in sampler.sample()[0][0].processes or ()] == [1]


def test_collectors_switched_off_are_not_read_and_not_reported() -> None:
    sampler, clock = make({"gpus": [{"model": "h100-sxm"}]}, collectors={"device"})
    clock.advance(1)
    (gpu,), statuses = sampler.sample()
    assert gpu.value(POWER) is not None
    assert gpu.value(CLOCKS["sm"]) is None
    assert gpu.value(ECC_CORRECTED) is None
    assert [status.name for status in statuses] == ["nvml", "device"]


def test_mps_clients_and_server_are_both_listed() -> None:
    sampler, clock = make(
        {"gpus": [{"sharing": "mps"}], "processes": [{"pid": 21, "gpu": 0}, {"pid": 22, "gpu": 0}]}
    )
    clock.advance(1)
    (gpu,) = sampler.sample()[0]
    assert gpu.processes is not None
    assert [p.pid for p in gpu.processes] == [21, 22, 4_000_000]


def test_device_limits_modes_memory_temperature_and_pcie_link() -> None:
    sampler, clock = make(
        {
            "gpus": [{"model": "h100-sxm"}, {"model": "l4"}],
            "processes": [{"pid": 5, "gpu": 0, "memory": "10GiB", "level": 0.8}],
        }
    )
    clock.advance(1)
    h100, l4 = by_index(sampler.sample()[0]).values()
    assert h100.value(MEMORY_FREE) == (
        (h100.value(MEMORY_TOTAL) or 0)
        - (h100.value(MEMORY_RESERVED) or 0)
        - (h100.value(MEMORY_USED) or 0)
    )
    assert (h100.value(POWER_LIMIT_MIN), h100.value(POWER_LIMIT_MAX)) == (175.0, 700.0)
    assert h100.value(POWER_LIMIT_DEFAULT) == h100.value(POWER_LIMIT) == 700.0
    assert h100.value(MEMORY_TEMPERATURE) == round(h100.value(TEMPERATURE) or 0) + 3
    assert l4.value(MEMORY_TEMPERATURE) is None, "GDDR: NotSupported, absent"
    assert l4.value(TEMPERATURE) is not None
    for gpu in (h100, l4):
        assert gpu.value(ENCODER) == 0.0, "no video work: 0, not absent"
        assert gpu.value(DECODER) == 0.0
        assert gpu.value(COMPUTE_MODE["default"]) == 1
        assert [gpu.value(series) for series in COMPUTE_MODE.values()].count(None) == 3
        assert gpu.value(PERSISTENCE_MODE) == 1
        assert gpu.value(ECC_AGGREGATE_CORRECTED) == gpu.value(ECC_CORRECTED) == 0
        assert gpu.value(ECC_AGGREGATE_UNCORRECTED) == 0
        assert gpu.value(PCIE_WIDTH) == gpu.value(PCIE_MAX_WIDTH) == 16
    assert (h100.value(PCIE_GENERATION), h100.value(PCIE_MAX_GENERATION)) == (5, 5)
    assert (l4.value(PCIE_GENERATION), l4.value(PCIE_MAX_GENERATION)) == (1, 4), "idle: gen 1"


def test_nvlink_per_link_and_absent_without_nvlink() -> None:
    sampler, clock = make(
        {
            "gpus": [{"model": "h100-sxm"}, {"model": "a100-sxm4-40gb"}, {"model": "l4"}],
            "processes": [{"pid": 5, "gpu": 0, "level": 0.9, "tensor_intensity": 0.8}],
        }
    )
    samples = []
    for _ in range(3):
        clock.advance(1)
        samples.append(by_index(sampler.sample()[0]))
    h100, a100, l4 = samples[-1].values()

    def links(gpu: GpuSample, template: Series) -> list[int]:
        return [link for link in range(40) if gpu.value(link_series(template, link)) is not None]

    assert links(h100, NVLINK_TRANSMIT_TOTAL) == list(range(18))
    assert links(a100, NVLINK_RECEIVE_TOTAL) == list(range(12))
    for name in ("crc_flit", "crc_data", "replay", "recovery"):
        assert links(h100, NVLINK_ERRORS[name]) == list(range(18))
        assert h100.value(link_series(NVLINK_ERRORS[name], 17)) == 0, "a healthy fabric"
    assert not any(series.family.collector == "nvlink" for series in l4.values), (
        "a PCIe card: no NVLink series at all"
    )
    # The busy H100 sends over its links; the per-link counters add up to GPM's total rate.
    sent = [
        h100_now.value(link_series(NVLINK_TRANSMIT_TOTAL, 0)) or 0
        for h100_now in (
            samples[1][0],
            samples[2][0],
        )
    ]
    assert sent[1] > sent[0] > 0
    rate = (h100.value(NVLINK_TRANSMIT) or 0) / 18
    assert sent[1] - sent[0] == pytest.approx(rate, rel=0.01)
    assert a100.value(NVLINK_TRANSMIT) is None, "no GPM before Hopper"
    assert h100.value(GRAPHICS_ACTIVE) == pytest.approx(h100.value(UTILIZATION), abs=0.02)
    assert a100.value(GRAPHICS_ACTIVE) is None, "GPM only: nothing stands in before Hopper"


def test_field_values_are_one_call_and_a_refused_field_is_not_asked_again() -> None:
    sampler, clock = make({"gpus": [{"model": "h100-sxm"}, {"model": "l4"}]})
    driver = sampler._nvml
    real = driver.nvmlDeviceGetFieldValues
    asked: list[tuple[str, list[object]]] = []

    def counting(handle: object, field_ids: list[object]) -> object:
        answer = real(handle, field_ids)
        asked.append((driver.nvmlDeviceGetName(handle), list(field_ids)))
        return answer

    driver.nvmlDeviceGetFieldValues = counting  # type: ignore[method-assign]
    for _ in range(2):
        clock.advance(1)
        sampler.sample()
    memory_temperature = (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)
    # Each cycle: throttle time (every 5 s: the first cycle only) and one call for the rest.
    h100 = [
        ids for name, ids in asked if name == "NVIDIA H100 80GB HBM3" and memory_temperature in ids
    ]
    assert len(h100) == 2
    assert len(h100[0]) == 1 + 2 * 18, "memory temperature and each link's two counters"
    l4 = [ids for name, ids in asked if name == "NVIDIA L4" and memory_temperature in ids]
    assert l4 == [[memory_temperature]], "NotSupported in its slot: not asked again"


def test_field_values_failing_cost_only_their_series(caplog: pytest.LogCaptureFixture) -> None:
    sampler, clock = make(
        {
            "gpus": [{"model": "h100-sxm"}],
            "faults": [
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetFieldValues",
                    "error": "unknown",
                    "at": "2s",
                    "until": "3s",
                }
            ],
        }
    )
    caplog.set_level(logging.WARNING)
    seen = []
    for _ in range(3):
        clock.advance(1)
        (gpu,), statuses = sampler.sample()
        status = {s.name: s.success for s in statuses}
        seen.append(
            (
                gpu.value(MEMORY_TEMPERATURE) is not None,
                gpu.value(link_series(NVLINK_RECEIVE_TOTAL, 5)) is not None,
                status["device"],
                status["nvlink"],
            )
        )
        assert gpu.value(POWER) is not None
        assert gpu.value(link_series(NVLINK_ERRORS["replay"], 5)) is not None
    assert seen == [
        (True, True, True, True),
        (False, False, False, False),
        (True, True, True, True),
    ]
    assert len([r for r in caplog.records if getattr(r, "reading", None) == "field_values"]) == 1


def test_nvlink_collector_off_asks_nothing_about_links() -> None:
    sampler, clock = make(
        {"gpus": [{"model": "h100-sxm"}]}, collectors=set(GPU_COLLECTORS) - {"nvlink"}
    )
    driver = sampler._nvml
    asked = []
    real = driver.nvmlDeviceGetNvLinkErrorCounter

    def counting(*args: object) -> object:
        asked.append(args)
        return real(*args)

    driver.nvmlDeviceGetNvLinkErrorCounter = counting  # type: ignore[method-assign]
    clock.advance(1)
    (gpu,), statuses = sampler.sample()
    assert not asked
    assert not any(series.family.collector == "nvlink" for series in gpu.values)
    assert gpu.value(MEMORY_TEMPERATURE) is not None, "the other fields are still read"
    assert "nvlink" not in [status.name for status in statuses]


def test_process_names_only_when_asked() -> None:
    fleet = {
        "gpus": [{}],
        "processes": [
            {"pid": 7, "gpu": 0, "name": "/opt/conda/bin/python3.11"},
            {"pid": 8, "gpu": 0},
        ],
    }
    sampler, clock = make(fleet)
    clock.advance(1)
    assert [p.name for p in sampler.sample()[0][0].processes or ()] == [None, None]
    sampler, clock = make(fleet, process_names=True)
    driver = sampler._nvml
    real = driver.nvmlSystemGetProcessName
    asked: list[int] = []

    def counting(pid: int) -> str:
        asked.append(pid)
        return real(pid)

    driver.nvmlSystemGetProcessName = counting  # type: ignore[method-assign]
    for _ in range(3):
        clock.advance(1)
        (gpu,) = sampler.sample()[0]
        assert [(p.pid, p.name) for p in gpu.processes or ()] == [
            (7, "/opt/conda/bin/python3.11"),
            (8, "python3"),
        ]
    assert asked == [7, 8], "asked once per process, while it stays listed"


def test_a_process_the_driver_cannot_name_has_an_empty_name() -> None:
    sampler, clock = make(
        {
            "gpus": [{}],
            "processes": [{"pid": 7, "gpu": 0}],
            "faults": [
                {"kind": "error", "function": "nvmlSystemGetProcessName", "error": "no_permission"}
            ],
        },
        process_names=True,
    )
    clock.advance(1)
    (gpu,), statuses = sampler.sample()
    assert [(p.pid, p.name) for p in gpu.processes or ()] == [(7, "")]
    assert all(status.success for status in statuses)


def test_each_collector_reports_the_longest_any_gpu_spent_and_a_failure_on_any() -> None:
    """The cycle's status per collector merges every GPU's: the longest time, and failed where a
    reading of it failed on one GPU (GPU 1's clocks here)."""
    clock = ManualClock()
    driver = SimulatedNvml(
        parse_fleet({"gpus": [{"model": "h100-sxm"}, {"model": "h100-sxm"}]}), clock=clock
    )
    clock_info = driver.nvmlDeviceGetClockInfo
    taking = {0: 0.002, 1: 0.005}

    def timed_clock_info(handle: object, *args: object) -> object:
        index = driver.nvmlDeviceGetMinorNumber(handle)
        clock.advance(taking[index])
        if index == 1 and args == (pynvml.NVML_CLOCK_MEM,):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return clock_info(handle, *args)

    driver.__dict__["nvmlDeviceGetClockInfo"] = timed_clock_info
    sampler = patient(NvmlSampler(driver, clock=clock, collectors={"device", "clocks"}))
    sampler.start()
    clock.advance(1)
    _, statuses = sampler.sample()
    by_name = {status.name: status for status in statuses}
    assert by_name["clocks"].duration_seconds == pytest.approx(3 * 0.005)
    assert not by_name["clocks"].success
    assert by_name["device"].success
    assert by_name["device"].duration_seconds == 0.0, "the manual clock stood still in it"
    sampler.close()
