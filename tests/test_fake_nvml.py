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

import pynvml
import pytest

from tests.fake_nvml import (
    LIBRARY_NAME,
    STATE_ENV,
    XID_EVENT,
    FakeDevice,
    FakeEvent,
    FakeMigInstance,
    FakeNvLink,
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
    # deeper signals: throttle time, memory health, PCIe, MIG, GPM, events
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetViolationStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlEventSetCreate",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    # NVLink, the PCIe link, power limits, modes, process names
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlSystemGetProcessName",
    # what nvitop calls beside, for the peer benchmark (benchmarks/peers.py)
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
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


def expected_nvlinks(d: FakeDevice) -> list[list[int]]:
    """What probe.read_device() must report for ``d``'s links: up to the highest listed one,
    an unlisted one inactive with nothing counted."""
    listed = {n.link: n for n in d.nvlinks}
    return [
        [link, int(n.active), n.tx_kib, n.rx_kib, n.crc_flit, n.crc_data, n.replay, n.recovery]
        if (n := listed.get(link)) is not None
        else [link, 0, 0, 0, 0, 0, 0, 0]
        for link in range(max(listed, default=-1) + 1)
    ]


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
        "power_min_limit_mw": d.power_min_limit_mw,
        "power_max_limit_mw": d.power_max_limit_mw,
        "power_default_limit_mw": d.power_default_limit_mw,
        "energy_mj": d.energy_mj,
        "temperature_c": d.temperature_c,
        "memory_temperature_c": (
            None
            if pynvml.NVML_FI_DEV_MEMORY_TEMP in d.not_supported_fields
            else d.memory_temperature_c
        ),
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
        "ecc_corrected_aggregate": d.ecc_corrected_volatile + d.ecc_corrected_before_load,
        "ecc_uncorrected_volatile": d.ecc_uncorrected_volatile,
        "ecc_uncorrected_aggregate": d.ecc_uncorrected_volatile + d.ecc_uncorrected_before_load,
        "pcie_replay_count": d.pcie_replay_count,
        "pcie_link": [d.pcie_generation, d.pcie_max_generation, d.pcie_width, d.pcie_max_width],
        "compute_mode": d.compute_mode,
        "persistence_mode": int(d.persistence_mode),
        "nvlinks": expected_nvlinks(d),
        "performance_state": d.performance_state,
        "encoder_util_percent": d.encoder_util_percent,
        "decoder_util_percent": d.decoder_util_percent,
        "power_management_limit_mw": d.power_limit_mw,
        "graphics_processes": [],
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
        ecc_corrected_before_load=40,
        ecc_uncorrected_before_load=2,
        pcie_replay_count=17,
        pcie_generation=3,
        pcie_max_generation=5,
        pcie_width=8,
        power_min_limit_mw=200_000,
        power_max_limit_mw=700_000,
        power_default_limit_mw=650_000,
        compute_mode=3,  # exclusive process
        persistence_mode=False,
        memory_temperature_c=58,
        performance_state=2,
        processes=[FakeProcess(4242, 20 * GIB), FakeProcess(4243, None)],
        mps_processes=[FakeProcess(5000, GIB, gpu_instance_id=1, compute_instance_id=0)],
        process_samples=[
            FakeProcessSample(4242, 1_700_000_000_000_000, 80, 40, 1, 2),
            FakeProcessSample(4243, 1_700_000_000_500_000, 5, 6),
        ],
    )
    # Lower-case hex and a non-zero domain: the fake must reformat like the driver. Its NVLink:
    # two links up, link 1 between them down; no memory temperature field.
    other = FakeDevice.numbered(
        1,
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000001:b7:00.0",
        nvlinks=[
            FakeNvLink(0, tx_kib=2**40, rx_kib=5, crc_flit=1, crc_data=2, replay=3, recovery=4),
            FakeNvLink(2, tx_kib=7, rx_kib=8),
        ],
        not_supported_fields={pynvml.NVML_FI_DEV_MEMORY_TEMP},
    )
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
        from tests.fake_nvml.state import (
            FakeDevice, FakeMigInstance, FakeNvLink, FakeNvmlState, FakeProcessSample
        )
        assert set(DEVICE_CALLS) == set({sorted(PER_DEVICE_EXPORTS)!r})
        path = os.environ["FAKE_NVML_STATE"]
        def write(lost):
            # A fan, a sample, a MIG instance and an NVLink link, so that every call succeeds
            # on a healthy GPU.
            sample = FakeProcessSample(pid=1, timestamp_us=1)
            mig = FakeMigInstance(slot=0, gpu_instance=7, uuid="MIG-0000-aaaa")
            gpu0 = FakeDevice.numbered(
                0,
                lost=lost,
                num_fans=1,
                nvlinks=[FakeNvLink(0)],
                process_samples=[sample],
                mig_mode=True,
                mig_instances=[mig],
            )
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


def mig_gpu(**overrides: object) -> FakeDevice:
    """An H100 in MIG mode: a 3g.40gb instance in slot 0, a 1g.10gb one in slot 2."""
    values: dict[str, object] = {
        "name": "NVIDIA H100 80GB HBM3",
        "gpm_supported": True,
        "mig_mode": True,
        "gpm_metrics": {2: 40.0},
        "mig_instances": [
            FakeMigInstance(
                0,
                gpu_instance=2,
                uuid="MIG-aaaa-0002",
                profile="3g.40gb",
                slices=3,
                memory_total_bytes=40 * GIB,
                memory_used_bytes=12 * GIB,
                gpm_metrics={2: 75.5, 5: 50.0},
            ),
            FakeMigInstance(2, gpu_instance=9, uuid="MIG-aaaa-0009", profile="-", slices=1),
        ],
        "processes": [FakeProcess(70, 12 * GIB, 2, 0), FakeProcess(71, GIB, 9, 0)],
    }
    return FakeDevice.numbered(0, **(values | overrides))


def test_gpm_samples_and_metrics(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState(devices=[mig_gpu(), FakeDevice.numbered(1)]).write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        h, old = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
        assert pynvml.nvmlGpmQueryDeviceSupport(old).isSupportedDevice == 0
        a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlGpmSampleGet, old, a)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        request.sample1, request.sample2 = a, b
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlGpmMetricsGet, request)

        pynvml.nvmlGpmSampleGet(h, a)
        pynvml.nvmlGpmSampleGet(h, b)
        pynvml.nvmlGpmMetricsGet(request)
        assert (request.metrics[0].nvmlReturn, request.metrics[0].value) == (0, 40.0)
        assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED

        pynvml.nvmlGpmMigSampleGet(h, 2, a)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlGpmMetricsGet, request)
        pynvml.nvmlGpmMigSampleGet(h, 2, b)
        pynvml.nvmlGpmMetricsGet(request)
        assert [m.value for m in request.metrics[:2]] == [75.5, 50.0]
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlGpmMigSampleGet, h, 5, a)

        request.version = 2
        expect_error(pynvml.NVMLError_ArgumentVersionMismatch, pynvml.nvmlGpmMetricsGet, request)
        pynvml.nvmlGpmSampleFree(a)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlGpmSampleFree, a)
        pynvml.nvmlGpmSampleFree(b)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_mig_devices(fake_lib_dir: Path, state_file: Path) -> None:
    FakeNvmlState(devices=[mig_gpu(), FakeDevice.numbered(1)]).write(state_file)
    run_python(
        """
        from tests.fake_nvml.state import FakeDevice, FakeNvmlState
        from tests.test_fake_nvml import mig_gpu
        pynvml.nvmlInit()
        h, plain = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
        assert pynvml.nvmlDeviceGetMigMode(plain) == [0, 0]
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, plain, 0)

        big = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        expect_error(pynvml.NVMLError_NotFound, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 1)
        small = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)
        assert pynvml.nvmlDeviceGetName(big) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
        assert pynvml.nvmlDeviceGetName(small) == "NVIDIA H100 80GB HBM3 MIG"
        assert pynvml.nvmlDeviceGetUUID(big) == "MIG-aaaa-0002"
        assert pynvml.nvmlDeviceGetGpuInstanceId(big) == 2
        assert pynvml.nvmlDeviceGetComputeInstanceId(big) == 0
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetGpuInstanceId, h)
        attributes = pynvml.nvmlDeviceGetAttributes_v2(small)
        assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (1, 10 * 1024)
        memory = pynvml.nvmlDeviceGetMemoryInfo(big, version=pynvml.nvmlMemory_v2)
        assert (memory.total, memory.used) == (40 * 2**30, 12 * 2**30)
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(big)] == [70]
        assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)] == [70, 71]
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceGetPowerUsage, big)

        # The layout changes: slot 2 destroyed, a new instance in slot 1.
        layout = mig_gpu()
        layout.mig_instances[1].slot = 1
        layout.mig_instances[1].uuid = "MIG-bbbb-0001"
        FakeNvmlState(devices=[layout, FakeDevice.numbered(1)]).write(os.environ["FAKE_NVML_STATE"])
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetUUID, small)
        expect_error(pynvml.NVMLError_NotFound, pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 2)
        fresh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
        assert pynvml.nvmlDeviceGetUUID(fresh) == "MIG-bbbb-0001"
        assert pynvml.nvmlDeviceGetUUID(big) == "MIG-aaaa-0002"
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_events_wait_time_out_and_deliver_what_came_after_registration(
    fake_lib_dir: Path, state_file: Path
) -> None:
    queued = FakeEvent(1, XID_EVENT, 31)  # before registration: never delivered
    FakeNvmlState(devices=[FakeDevice.numbered(0, events=[queued])]).write(state_file)
    run_python(
        """
        import ctypes
        from tests.fake_nvml.state import FakeDevice, FakeEvent, FakeNvmlState
        path = os.environ["FAKE_NVML_STATE"]
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetSupportedEventTypes(h) == 0xB
        events = pynvml.nvmlEventSetCreate()
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceRegisterEvents, h, 0x10, events)
        pynvml.nvmlDeviceRegisterEvents(h, 0xB, events)
        expect_error(pynvml.NVMLError_Timeout, pynvml.nvmlEventSetWait_v2, events, 50)

        queue = [FakeEvent(1, 0x8, 31), FakeEvent(2, 0x8, 79), FakeEvent(3, 0x2, 0)]
        FakeNvmlState(devices=[FakeDevice.numbered(0, events=queue)]).write(path)
        data = pynvml.nvmlEventSetWait_v2(events, 1000)
        assert (data.eventType, data.eventData) == (0x8, 79)
        address = lambda handle: ctypes.cast(handle, ctypes.c_void_p).value
        assert address(data.device) == address(h)
        data = pynvml.nvmlEventSetWait_v2(events, 1000)
        assert (data.eventType, data.eventData) == (0x2, 0)
        expect_error(pynvml.NVMLError_Timeout, pynvml.nvmlEventSetWait_v2, events, 20)
        pynvml.nvmlEventSetFree(events)
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlEventSetWait_v2, events, 20)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_throttle_time_memory_health_and_pcie(fake_lib_dir: Path, state_file: Path) -> None:
    device = FakeDevice.numbered(
        0,
        violation_power_ns=1_500_000_000,
        violation_thermal_ns=250_000_000,
        violation_app_clocks_ns=2_000_000_000,
        remapped_rows_correctable=1,
        remapped_rows_uncorrectable=2,
        remapped_rows_pending=1,
        retired_pages_single_bit=3,
        retired_pages_double_bit=1,
        retired_pages_pending=1,
        pcie_tx_kbps=1000,
        pcie_rx_kbps=2000,
    )
    FakeNvmlState(devices=[device]).write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        status = pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)
        assert status.violationTime == 1_500_000_000
        assert status.referenceTime > 1_600_000_000_000_000
        assert pynvml.nvmlDeviceGetViolationStatus(h, 10).violationTime == 2_000_000_000
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetViolationStatus, h, 7)
        values = pynvml.nvmlDeviceGetFieldValues(h, [74, 269, 75, 1])
        assert [v.nvmlReturn for v in values] == [0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
        assert [v.value.ullVal for v in values[:3]] == [1_500_000_000, 250_000_000, 250_000_000]
        assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        assert pynvml.nvmlDeviceGetRemappedRows(h) == (1, 2, 1, 0)
        assert len(pynvml.nvmlDeviceGetRetiredPages(h, 0)) == 3
        assert len(pynvml.nvmlDeviceGetRetiredPages(h, 1)) == 1
        assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 1
        assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1000
        assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 2000
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


def test_nvlink_field_values_and_process_names(fake_lib_dir: Path, state_file: Path) -> None:
    """Per-link NVLink state, data and error counters; field values answering slot by slot;
    a GPU without NVLink; process names."""
    sxm = FakeDevice.numbered(
        0,
        memory_temperature_c=61,
        nvlinks=[FakeNvLink(0, tx_kib=100, rx_kib=200, replay=5), FakeNvLink(2, tx_kib=1)],
    )
    pcie = FakeDevice.numbered(
        1, name="NVIDIA L4", not_supported_fields={pynvml.NVML_FI_DEV_MEMORY_TEMP}
    )
    FakeNvmlState(devices=[sxm, pcie], process_names={4242: "/usr/bin/python3"}).write(state_file)
    run_python(
        """
        pynvml.nvmlInit()
        sxm, pcie = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        tx, rx = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        assert [pynvml.nvmlDeviceGetNvLinkState(sxm, link) for link in range(3)] == [1, 0, 1]
        expect_error(pynvml.NVMLError_InvalidArgument, pynvml.nvmlDeviceGetNvLinkState, sxm, 3)
        expect_error(pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceGetNvLinkState, pcie, 0)
        replay = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
        assert pynvml.nvmlDeviceGetNvLinkErrorCounter(sxm, 0, replay) == 5
        assert pynvml.nvmlDeviceGetNvLinkErrorCounter(sxm, 1, replay) == 0
        expect_error(
            pynvml.NVMLError_NotSupported,
            pynvml.nvmlDeviceGetNvLinkErrorCounter, sxm, 0, pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA,
        )
        expect_error(
            pynvml.NVMLError_NotSupported, pynvml.nvmlDeviceGetNvLinkErrorCounter, pcie, 0, replay
        )

        # One call, each slot answering alone.
        asked = [82, (tx, 0), (rx, 0), (tx, 1), (tx, 2), (tx, 3), (tx, 0xFFFFFFFF), 1]
        values = pynvml.nvmlDeviceGetFieldValues(sxm, asked)
        assert [v.nvmlReturn for v in values] == [0, 0, 0, 0, 0, 2, 0, 3]
        assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        assert values[0].value.uiVal == 61
        assert [v.value.ullVal for v in values[1:5]] == [100, 200, 0, 1]
        assert values[6].value.ullVal == 101, "scope UINT_MAX: every link summed"
        values = pynvml.nvmlDeviceGetFieldValues(pcie, [82, (tx, 0), 74])
        assert [v.nvmlReturn for v in values] == [3, 3, 0], "NotSupported slot by slot"

        assert pynvml.nvmlSystemGetProcessName(4242) == "/usr/bin/python3"
        expect_error(pynvml.NVMLError_NotFound, pynvml.nvmlSystemGetProcessName, 4243)
        """,
        lib_dir=fake_lib_dir,
        state=state_file,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("gpm_metric 999 1.0", "bad gpm_metric"),
        ("gpm_metric 2 lots", "bad gpm_metric"),
        ("mig 9 1 0 1 10 0 MIG-x 1g.10gb", "bad mig"),
        ("mig 0 1 0 1 10 20 MIG-x 1g.10gb", "uses more memory"),
        ("mig 0 1 0 1 10 0 GPU-x 1g.10gb", "does not start with MIG-"),
        ("mig_gpm_metric 4 2 1.0", "bad mig_gpm_metric"),
        ("event 1 8", "bad event"),
        ("nvlink 36 1 0 0 0 0 0 0", "bad nvlink"),
        ("nvlink 0 2 0 0 0 0 0 0", "bad nvlink"),
        ("nvlink 0 1 0 0 0 0 0 0\nnvlink 0 0 0 0 0 0 0 0", "link 0 listed twice"),
        ("not_supported_field memory", "bad not_supported_field"),
        ("process_name 12", "bad process_name"),
    ],
)
def test_bad_deeper_state_lines(
    fake_lib_dir: Path, state_file: Path, line: str, message: str
) -> None:
    state_file.write_text(f"fake_nvml_state 1\ndevice\n{line}\n")
    result = run_python(
        "expect_error(pynvml.NVMLError_Unknown, pynvml.nvmlInit)",
        lib_dir=fake_lib_dir,
        state=state_file,
    )
    assert message in result.stderr
