"""The simulator: determinism, physics that move like a real GPU's, faults (fleet files are
tests/test_fleet_file.py's)."""

from __future__ import annotations

import pynvml
import pytest

from exporter.simulator import SimulatedNvml, default_fleet
from exporter.simulator.behaviour import demand, noise
from exporter.simulator.fleet import SimProcess, parse_fleet
from tests.helpers import ManualClock

pytestmark = pytest.mark.timeout(60)


def simulator(document: dict[str, object], clock: ManualClock) -> SimulatedNvml:
    nvml = SimulatedNvml(parse_fleet(document), clock=clock, wall=lambda: 1_700_000_000 + clock())
    nvml.nvmlInit()
    return nvml


def test_noise_is_deterministic_and_uniformish() -> None:
    assert noise(1, 2, 3) == noise(1, 2, 3)
    assert noise(1, 2, 3) != noise(1, 2, 4)
    values = [noise(7, n) for n in range(10_000)]
    assert min(values) >= 0.0
    assert max(values) < 1.0
    assert 0.48 < sum(values) / len(values) < 0.52


@pytest.mark.parametrize("pattern", ["idle", "steady", "bursty", "sawtooth", "input_starved"])
def test_patterns_stay_in_range(pattern: str) -> None:
    process = SimProcess(
        pid=1, gpu=0, memory_bytes=0, pattern=pattern, level=0.9, period=10, duty=0.3
    )
    values = [demand(process, 3, t / 4) for t in range(2000)]
    assert all(0.0 <= v <= 1.0 for v in values)
    mean = sum(values) / len(values)
    expected = {
        "idle": (0, 0),
        "steady": (0.85, 0.95),
        "bursty": (0.1, 0.5),
        "sawtooth": (0.4, 0.5),
        "input_starved": (0.2, 0.3),
    }
    low, high = expected[pattern]
    assert low <= mean <= high, (pattern, mean)


def test_same_seed_same_readings() -> None:
    def readings() -> list[tuple[int, int, int]]:
        clock = ManualClock()
        nvml = SimulatedNvml(default_fleet(4, seed=11), clock=clock, wall=lambda: 1.7e9 + clock())
        nvml.nvmlInit()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
        out = []
        for _ in range(30):
            clock.advance(1.0)
            for handle in handles:
                out.append(
                    (
                        nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                        nvml.nvmlDeviceGetPowerUsage(handle),
                        nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                    )
                )
        return out

    assert readings() == readings()


def test_power_and_temperature_follow_load() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"model": "h100-sxm"}],
            "processes": [
                {
                    "pid": 10,
                    "gpu": 0,
                    "memory": "10GiB",
                    "pattern": "steady",
                    "level": 0.95,
                    "start": "60s",
                }
            ],
        },
        clock,
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    idle_power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
    idle_temperature = nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert idle_power == pytest.approx(70, abs=1)  # the catalog's idle draw
    assert nvml.nvmlDeviceGetPerformanceState(handle) == 8
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & pynvml.nvmlClocksEventReasonGpuIdle
    energy_before = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)

    clock.advance(61.0)
    first = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
    clock.advance(10.0)
    settled = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
    assert idle_power < first <= settled <= 700
    assert settled > 500
    temperatures = []
    for _ in range(120):
        clock.advance(1.0)
        temperatures.append(nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    assert temperatures[0] < temperatures[30] < temperatures[60], "heats up over a minute"
    assert max(temperatures[60:]) - min(temperatures[60:]) <= 8, "then settles"
    assert temperatures[-1] > idle_temperature + 20
    assert nvml.nvmlDeviceGetPerformanceState(handle) == 0
    assert nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 1980
    # energy grows by about power x time (mJ)
    energy_after = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert 60_000 * 70 < energy_after - energy_before < 191 * 700_000


def test_poor_cooling_throttles_under_sustained_load() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"model": "h100-sxm", "cooling": "poor"}],
            "processes": [
                {
                    "pid": 10,
                    "gpu": 0,
                    "memory": "10GiB",
                    "pattern": "steady",
                    "level": 1.0,
                    "start": "1s",
                }
            ],
        },
        clock,
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(300):
        clock.advance(1.0)
        nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert reasons & pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) < 1980


def test_time_slicing_splits_the_gpu_between_processes() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"model": "l4"}],
            "processes": [
                {"pid": 10, "gpu": 0, "memory": "4GiB", "pattern": "steady", "level": 0.9},
                {"pid": 11, "gpu": 0, "memory": "6GiB", "pattern": "steady", "level": 0.9},
            ],
        },
        clock,
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    clock.advance(1.0)
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    shares = {s.pid: s.smUtil for s in nvml.nvmlDeviceGetProcessUtilization(handle, 0)}
    assert set(shares) == {10, 11}
    assert 95 <= sum(shares.values()) <= 101
    processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert {(p.pid, p.usedGpuMemory) for p in processes} == {(10, 4 * 2**30), (11, 6 * 2**30)}
    memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert memory.used == 10 * 2**30
    assert memory.total == memory.used + memory.free + memory.reserved


def test_process_utilization_not_found_when_nobody_is_busy() -> None:
    clock = ManualClock()
    nvml = simulator(
        {"gpus": [{"model": "l4"}], "processes": [{"pid": 10, "gpu": 0, "pattern": "idle"}]}, clock
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetProcessUtilization(handle, 0)


def test_mps_clients_are_listed_separately_from_the_server() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"model": "a100-sxm4-80gb", "sharing": "mps"}],
            "processes": [
                {"pid": 10, "gpu": 0, "memory": "4GiB"},
                {"pid": 11, "gpu": 0, "memory": "4GiB"},
            ],
        },
        clock,
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [4_000_000]
    assert {p.pid for p in nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)} == {10, 11}


def test_processes_start_and_stop_on_schedule() -> None:
    clock = ManualClock()
    nvml = simulator(
        {"gpus": [{}], "processes": [{"pid": 10, "gpu": 0, "start": "10s", "stop": "20s"}]}, clock
    )
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for t in (5, 15, 25):
        clock.now = t
        seen.append([p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)])
    assert seen == [[], [10], []]


def test_lost_gpu_needs_a_new_handle_after_it_returns() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"count": 2}],
            "faults": [{"kind": "gpu_lost", "gpu": 1, "at": "10s", "until": "20s"}],
        },
        clock,
    )
    old = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceGetPowerUsage(old)
    clock.now = 12
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(old)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0))  # the other GPU is fine
    clock.now = 25
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(old)
    nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(1))


def test_error_faults_init_faults_and_ecc() -> None:
    clock = ManualClock()
    fleet = parse_fleet(
        {
            "gpus": [{"count": 2}],
            "faults": [
                {"kind": "init_error", "error": "driver_not_loaded", "until": "5s"},
                {
                    "kind": "error",
                    "gpu": 0,
                    "function": "nvmlDeviceGetPcieReplayCounter",
                    "error": "not_supported",
                },
                {
                    "kind": "error",
                    "function": "nvmlDeviceGetTotalEnergyConsumption",
                    "error": "function_not_found",
                    "at": "8s",
                },
                {"kind": "ecc", "gpu": 1, "at": "9s", "corrected": 4, "uncorrected": 1},
            ],
        }
    )
    nvml = SimulatedNvml(fleet, clock=clock)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    clock.now = 6
    nvml.nvmlInit()
    first, second = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPcieReplayCounter(first)
    assert nvml.nvmlDeviceGetPcieReplayCounter(second) == 0
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(first) > 0
    clock.now = 9
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetTotalEnergyConsumption(second)
    assert nvml.nvmlDeviceGetTotalEccErrors(second, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, 0) == 4
    assert (
        nvml.nvmlDeviceGetTotalEccErrors(second, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 0) == 1
    )
    assert (
        nvml.nvmlDeviceGetTotalEccErrors(first, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 0) == 0
    )


def test_returns_pynvml_structs() -> None:
    clock = ManualClock()
    nvml = simulator({"gpus": [{"model": "NVIDIA L4"}]}, clock)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(nvml.nvmlDeviceGetUtilizationRates(handle), pynvml.c_nvmlUtilization_t)
    assert isinstance(
        nvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2), pynvml.c_nvmlMemory_v2_t
    )
    assert isinstance(nvml.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert nvml.nvmlDeviceGetPciInfo_v3(handle).busId == "00000000:18:00.0"  # pynvml decodes
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA L4"
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetPowerUsage(object())


def test_default_fleet_mixes_workloads() -> None:
    fleet = default_fleet(8)
    assert len(fleet.gpus) == 8
    assert len({gpu.uuid for gpu in fleet.gpus}) == 8
    assert {p.pattern for p in fleet.processes} == {
        "steady",
        "bursty",
        "sawtooth",
        "idle",
        "input_starved",
    }


def test_nvlink_and_field_values_answer_as_a_driver_does() -> None:
    clock = ManualClock()
    nvml = simulator(
        {
            "gpus": [{"model": "a100-sxm4-80gb"}, {"model": "l4"}],
            "processes": [{"pid": 9, "gpu": 0, "level": 0.9, "name": "/usr/bin/torchrun"}],
        },
        clock,
    )
    a100, l4 = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert [nvml.nvmlDeviceGetNvLinkState(a100, link) for link in range(12)] == [1] * 12
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(a100, 12)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(l4, 0)
    replay = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    assert nvml.nvmlDeviceGetNvLinkErrorCounter(a100, 11, replay) == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkErrorCounter(l4, 0, replay)

    clock.advance(2)
    tx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    values = nvml.nvmlDeviceGetFieldValues(
        a100, [pynvml.NVML_FI_DEV_MEMORY_TEMP, (tx, 0), (tx, 11), (tx, 12), 1]
    )
    assert [v.nvmlReturn for v in values] == [
        pynvml.NVML_SUCCESS,
        pynvml.NVML_SUCCESS,
        pynvml.NVML_SUCCESS,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,  # past its last link
        pynvml.NVML_ERROR_NOT_SUPPORTED,  # a field nothing declares
    ]
    assert [v.scopeId for v in values] == [0, 0, 11, 12, 0]
    assert values[1].value.ullVal == values[2].value.ullVal > 0, "traffic spread over the links"
    values = nvml.nvmlDeviceGetFieldValues(l4, [pynvml.NVML_FI_DEV_MEMORY_TEMP, (tx, 0)])
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2, "GDDR, PCIe"

    assert nvml.nvmlSystemGetProcessName(9) == "/usr/bin/torchrun"
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlSystemGetProcessName(10)
