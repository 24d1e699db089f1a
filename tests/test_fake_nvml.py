"""The fake libnvidia-ml.so.1 as the real pynvml sees it.

pynvml binds one library per process for good, so every scenario runs pynvml in a fresh
subprocess (helpers in fake_nvml.probe) and reports back through stdout or assertions.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest

from tests.fake_nvml import (
    LIBRARY_NAME,
    STATE_ENV,
    FakeDevice,
    FakeNvmlState,
    FakeProcess,
    FakeProcessSample,
    build_fake_nvml,
    exported_functions,
)
from tests.helpers import ROOT

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

GIB = 1024**3
NVML_MEMORY_V2 = 0x02000028

# What pynvml 13 calls for the metrics gpuscope needs (see the fake's header comment).
EXPECTED_EXPORTS = {
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetMinorNumber",
}
PER_DEVICE_EXPORTS = {name for name in EXPECTED_EXPORTS if name.startswith("nvmlDevice")} - {
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
}


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "nvml-state"


def run_python(
    code: str, *, lib_dir: Path | None, state: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that can import tests.fake_nvml and its probe."""
    env = {
        k: v for k, v in os.environ.items() if k not in {"LD_LIBRARY_PATH", STATE_ENV, "PYTHONPATH"}
    }
    env["PYTHONPATH"] = str(ROOT)  # the repository, for tests.fake_nvml
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    if state is not None:
        env[STATE_ENV] = str(state)
    prelude = "import json, os, pynvml\nfrom tests.fake_nvml.probe import *\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"snippet failed:\n{result.stdout}\n{result.stderr}"
    return result


def read_all(lib_dir: Path, state: Path | None) -> dict[str, object]:
    out = run_python(
        "pynvml.nvmlInit(); print(json.dumps(read_system()))", lib_dir=lib_dir, state=state
    )
    readings: dict[str, object] = json.loads(out.stdout)
    return readings


def expected_device(d: FakeDevice) -> dict[str, object]:
    """What probe.read_device() must report for ``d``."""
    domain, bus, dev_fn = d.pci_bus_id.split(":")
    dom, b, dv = int(domain, 16), int(bus, 16), int(dev_fn.split(".")[0], 16)
    free = d.memory_total_bytes - d.memory_reserved_bytes - d.memory_used_bytes

    def procs(ps: list[FakeProcess]) -> list[list[object]]:
        return [[p.pid, p.used_memory_bytes, p.gpu_instance_id, p.compute_instance_id] for p in ps]

    return {
        "name": d.name,
        "uuid": d.uuid,
        "pci_bus_id": f"{dom:08X}:{b:02X}:{dv:02X}.0",
        "pci_bus_id_legacy": f"{dom & 0xFFFF:04X}:{b:02X}:{dv:02X}.0",
        "pci_domain_bus_device": [dom, b, dv],
        "pci_device_id": d.pci_device_id,
        "pci_subsystem_id": d.pci_subsystem_id,
        "minor_number": d.minor_number,
        "util_gpu_percent": d.util_gpu_percent,
        "util_memory_percent": d.util_memory_percent,
        "memory_v2": [
            NVML_MEMORY_V2,
            d.memory_total_bytes,
            d.memory_reserved_bytes,
            d.memory_used_bytes,
            free,
        ],
        "memory_v1": [d.memory_total_bytes, d.memory_reserved_bytes + d.memory_used_bytes, free],
        "power_usage_mw": d.power_usage_mw,
        "power_limit_mw": d.power_limit_mw,
        "energy_mj": d.energy_mj,
        "temperature_c": d.temperature_c,
        **{
            f"{prefix}clock_{domain}_mhz": getattr(d, f"{prefix}clock_{domain}_mhz")
            for prefix in ("", "max_")
            for domain in ("graphics", "sm", "mem", "video")
        },
        "clock_event_reasons": d.clock_event_reasons,
        "clock_throttle_reasons": d.clock_event_reasons,
        "num_fans": d.num_fans,
        "fan_speeds": [d.fan_speed_percent] * d.num_fans,
        "ecc_corrected_volatile": d.ecc_corrected_volatile,
        "ecc_corrected_aggregate": d.ecc_corrected_volatile,
        "ecc_uncorrected_volatile": d.ecc_uncorrected_volatile,
        "ecc_uncorrected_aggregate": d.ecc_uncorrected_volatile,
        "pcie_replay_count": d.pcie_replay_count,
        "performance_state": d.performance_state,
        "processes": procs(d.processes),
        "processes_v2": procs(d.processes),
        "mps_processes": procs(d.mps_processes),
        "samples": [
            [s.pid, s.timestamp_us, s.sm_util, s.mem_util, s.enc_util, s.dec_util]
            for s in d.process_samples
        ],
    }


def test_exports_exactly_the_functions_pynvml_needs(fake_lib_dir: Path) -> None:
    assert set(exported_functions()) == EXPECTED_EXPORTS
    lib = fake_lib_dir / LIBRARY_NAME
    out = run_python(
        f"""
        import ctypes
        lib = ctypes.CDLL({str(lib)!r})
        print(json.dumps([n for n in {sorted(EXPECTED_EXPORTS)!r} if not hasattr(lib, n)]))
        """,
        lib_dir=None,
    )
    assert json.loads(out.stdout) == []


def test_reads_back_every_value(fake_lib_dir: Path, state_file: Path) -> None:
    busy = FakeDevice.numbered(
        0,
        minor_number=3,
        util_gpu_percent=87,
        util_memory_percent=45,
        memory_used_bytes=30 * GIB,
        power_usage_mw=312_345,
        power_limit_mw=350_000,
        energy_mj=987_654_321_000,  # beyond 32 bits
        temperature_c=71,
        clock_graphics_mhz=1395,
        clock_sm_mhz=1380,
        clock_mem_mhz=1512,
        clock_video_mhz=1100,
        max_clock_video_mhz=1305,
        clock_event_reasons=0x4 | 0x40,
        num_fans=2,
        fan_speed_percent=55,
        ecc_corrected_volatile=3,
        ecc_uncorrected_volatile=1,
        pcie_replay_count=17,
        performance_state=2,
        processes=[FakeProcess(4242, 20 * GIB), FakeProcess(4243, None)],
        mps_processes=[FakeProcess(5000, GIB, gpu_instance_id=1, compute_instance_id=0)],
        process_samples=[
            FakeProcessSample(4242, 1_700_000_000_000_000, 80, 40, 1, 2),
            FakeProcessSample(4243, 1_700_000_000_500_000, 5, 6),
        ],
    )
    # Lower-case hex and a non-zero domain: the fake must reformat like the driver.
    other = FakeDevice.numbered(1, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000001:b7:00.0")
    state = FakeNvmlState(driver_version="570.86.15", cuda_version=12080, devices=[busy, other])
    state.write(state_file)

    readings = read_all(fake_lib_dir, state_file)

    assert readings == {
        "driver_version": "570.86.15",
        "nvml_version": "12.570.86.15",
        "cuda_version": 12080,
        "devices": [expected_device(busy), expected_device(other)],
    }


def test_builtin_default_matches_fake_device_defaults(fake_lib_dir: Path) -> None:
    """Without $FAKE_NVML_STATE the C defaults serve one GPU equal to FakeDevice()."""
    readings = read_all(fake_lib_dir, state=None)

    state = FakeNvmlState()
    assert readings == {
        "driver_version": state.driver_version,
        "nvml_version": f"{state.cuda_version // 1000}.{state.driver_version}",
        "cuda_version": state.cuda_version,
        "devices": [expected_device(FakeDevice())],
    }


def test_state_changes_are_seen_without_reinit(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState().write(state_file)
    # Same-sized rewrites in quick succession: mtime granularity must not hide any of them.
    run_python(
        """
        from tests.fake_nvml.state import FakeDevice, FakeNvmlState
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for watts in [100, 200, 300, 400] * 5:
            FakeNvmlState(devices=[FakeDevice(power_usage_mw=watts * 1000)]).write(
                os.environ["FAKE_NVML_STATE"]
            )
            assert pynvml.nvmlDeviceGetPowerUsage(h) == watts * 1000
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_lost_gpu_fails_until_reinit(fake_lib_dir: Path, state_file: Path) -> None:
    run_python(
        f"""
        from tests.fake_nvml.state import FakeDevice, FakeNvmlState, FakeProcessSample
        assert set(DEVICE_CALLS) == set({sorted(PER_DEVICE_EXPORTS)!r})
        path = os.environ["FAKE_NVML_STATE"]
        def write(lost):
            # A fan and a sample, so that every call succeeds on a healthy GPU.
            sample = FakeProcessSample(pid=1, timestamp_us=1)
            gpu0 = FakeDevice.numbered(0, lost=lost, num_fans=1, process_samples=[sample])
            FakeNvmlState(devices=[gpu0, FakeDevice.numbered(1)]).write(path)

        write(lost=False)
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        healthy = pynvml.nvmlDeviceGetHandleByIndex(1)
        write(lost=True)
        for call in DEVICE_CALLS.values():
            expect_error(pynvml.NVMLError_GpuIsLost, call, h)
        expect_error(pynvml.NVMLError_GpuIsLost, pynvml.nvmlDeviceGetHandleByIndex, 0)
        assert pynvml.nvmlDeviceGetCount() == 2
        assert pynvml.nvmlDeviceGetMinorNumber(healthy) == 1

        write(lost=False)  # back on the bus, but the old handle stays dead until re-init
        expect_error(pynvml.NVMLError_GpuIsLost, pynvml.nvmlDeviceGetName, h)
        expect_error(pynvml.NVMLError_GpuIsLost, pynvml.nvmlDeviceGetHandleByIndex, 0)

        pynvml.nvmlShutdown()
        pynvml.nvmlInit()
        fresh = pynvml.nvmlDeviceGetHandleByIndex(0)
        for call in DEVICE_CALLS.values():
            call(fresh)
        expect_error(pynvml.NVMLError_GpuIsLost, pynvml.nvmlDeviceGetName, h)
        # A handle of a GPU that never went away keeps working across re-init.
        assert pynvml.nvmlDeviceGetMinorNumber(healthy) == 1
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_omitted_functions_are_missing_like_an_old_driver(tmp_path: Path, state_file: Path) -> None:
    lib_dir = build_fake_nvml(
        tmp_path / "old-driver",
        omit=["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3"],
    )
    FakeNvmlState().write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        expect_error(
            pynvml.NVMLError_FunctionNotFound, pynvml.nvmlDeviceGetCurrentClocksEventReasons, h
        )
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 1
        expect_error(
            pynvml.NVMLError_FunctionNotFound, pynvml.nvmlDeviceGetComputeRunningProcesses_v3, h
        )
        # pynvml's unversioned wrapper turns FunctionNotFound into an error that is NOT
        # an NVMLError subclass.
        expect_error(
            pynvml.NVMLLibraryMismatchError, pynvml.nvmlDeviceGetComputeRunningProcesses, h
        )
        assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h) == []
        """,
        lib_dir=lib_dir,
        state=state_file,
    )


def test_build_rejects_unknown_omit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nvmlDeviceGetBogus"):
        build_fake_nvml(tmp_path, omit=["nvmlDeviceGetBogus"])


def test_init_error_driver_not_loaded(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState(init_error=9).write(state_file)
    run_python(
        """
        expect_error(pynvml.NVMLError_DriverNotLoaded, pynvml.nvmlInit)
        expect_error(pynvml.NVMLError_Uninitialized, pynvml.nvmlDeviceGetCount)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_process_utilization_not_found_without_newer_samples(
    fake_lib_dir: Path, state_file: Path
) -> None:
    samples = [FakeProcessSample(10, 1_000, 50, 5), FakeProcessSample(11, 2_000, 60, 6)]
    FakeNvmlState(
        devices=[FakeDevice.numbered(0, process_samples=samples), FakeDevice.numbered(1)]
    ).write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        get = pynvml.nvmlDeviceGetProcessUtilization
        assert [s.pid for s in get(h, 0)] == [10, 11]
        assert [(s.pid, s.timeStamp, s.smUtil) for s in get(h, 1_000)] == [(11, 2_000, 60)]
        expect_error(pynvml.NVMLError_NotFound, get, h, 2_000)
        expect_error(pynvml.NVMLError_NotFound, get, pynvml.nvmlDeviceGetHandleByIndex(1), 0)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_not_supported_is_per_function(fake_lib_dir: Path, state_file: Path) -> None:
    devices = [
        FakeDevice.numbered(0, not_supported=set(PER_DEVICE_EXPORTS)),
        FakeDevice.numbered(1, not_supported={"nvmlDeviceGetPowerUsage"}),
    ]
    FakeNvmlState(devices=devices).write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        for call in DEVICE_CALLS.values():
            expect_error(pynvml.NVMLError_NotSupported, call, h0)
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceGetPowerUsage, h1)
        assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h1) == 400_000
        # No fans (SXM) reads as NOT_SUPPORTED too, as on a passively cooled board.
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceGetFanSpeed_v2, h1, 0)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed"
)
def test_library_not_on_path(tmp_path: Path) -> None:
    run_python("expect_error(pynvml.NVMLError_LibraryNotFound, pynvml.nvmlInit)", lib_dir=tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        ("garbage\n", "expected 'fake_nvml_state 1'"),
        ("fake_nvml_state 1\ndevice\nfan_rpm 3\n", "unknown key 'fan_rpm'"),
        ("fake_nvml_state 1\ndevice\nutil_gpu_percent 101\n", "'util_gpu_percent' needs"),
        ("fake_nvml_state 1\ndevice\npower_usage_mw -1\n", "'power_usage_mw' needs"),
        ("fake_nvml_state 1\ndevice\nmemory_used_bytes 99999999999999\n", "exceeds total"),
        ("fake_nvml_state 1\ndevice\nprocess 12 lots 0 0\n", "bad process"),
    ],
)
def test_bad_state_file_fails_init(
    fake_lib_dir: Path, state_file: Path, content: str | None, message: str
) -> None:
    if content is not None:
        state_file.write_text(content)
    result = run_python(
        "expect_error(pynvml.NVMLError_Unknown, pynvml.nvmlInit)",
        lib_dir=fake_lib_dir,
        state=state_file,
    )
    [line] = result.stderr.splitlines()
    assert line.startswith("fake-nvml: ")
    assert message in line


def test_lifecycle_and_argument_errors(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState().write(state_file)
    run_python(
        """
        import ctypes
        pynvml.nvmlInit()
        pynvml.nvmlInit()  # reference counted: one shutdown leaves it initialised
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 1

        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetHandleByIndex, 1)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetName, None)
        bogus = ctypes.cast(ctypes.c_void_p(0xDEADBEEF), pynvml.c_nvmlDevice_t)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetName, bogus)
        expect_error(
            pynvml.NVMLError_ArgumentVersionMismatch,
            pynvml.nvmlDeviceGetMemoryInfo, h, 0x01000028,
        )
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetClockInfo, h, 9)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetTotalEccErrors, h, 5, 0)
        assert str(pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)) == (
            "Argument version mismatch"
        )

        pynvml.nvmlShutdown()
        expect_error(pynvml.NVMLError_Uninitialized, pynvml.nvmlDeviceGetCount)
        expect_error(pynvml.NVMLError_Uninitialized, pynvml.nvmlSystemGetDriverVersion)
        expect_error(pynvml.NVMLError_Uninitialized, pynvml.nvmlDeviceGetName, h)
        expect_error(pynvml.NVMLError_Uninitialized, pynvml.nvmlShutdown)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_loaded_by_absolute_path_in_process(fake_lib_dir: Path, state_file: Path) -> None:
    """ctypes.CDLL(path) before nvmlInit works without LD_LIBRARY_PATH: the soname matches."""
    FakeNvmlState().write(state_file)
    run_python(
        f"""
        import ctypes
        ctypes.CDLL({str(fake_lib_dir / LIBRARY_NAME)!r})
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 1
        """,
        lib_dir=None,
        state=state_file,
    )


def test_concurrent_calls_while_state_changes(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState().write(state_file)
    run_python(
        """
        import threading
        from tests.fake_nvml.state import FakeDevice, FakeNvmlState, FakeProcess
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        errors = []

        def hammer():
            try:
                for _ in range(300):
                    read_device(h)
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        for i in range(30):
            procs = [FakeProcess(100 + j, j) for j in range(i % 7)]
            FakeNvmlState(devices=[FakeDevice(processes=procs)]).write(os.environ["FAKE_NVML_STATE"])
        for t in threads:
            t.join()
        assert not errors, errors
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_state_rejects_ambiguous_devices() -> None:
    with pytest.raises(ValueError, match="numbered"):
        FakeNvmlState(devices=[FakeDevice(), FakeDevice()]).to_text()
    with pytest.raises(ValueError, match="single-line"):
        FakeNvmlState(devices=[FakeDevice(name="A100\nlost 1")]).to_text()
