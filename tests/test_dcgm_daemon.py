"""`gpuscope serve --compat.dcgm` on the real pynvml over the fake libnvidia-ml.so.1: every default
DCGM field's name, type, unit and labels from known driver answers (a Hopper with GPM, a GPU in
MIG mode, an Ampere whose minor number is not its index, an XID); the counters file as the
daemon takes it; and not one DCGM series without the flag."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Final

import pytest

from exporter.dcgm import DEFAULT_FIELDS, DRIVER_VERSION, FIELDS
from tests.dcgm_fleet import dcgm_series, declared_types
from tests.fake_nvml import (
    XID_EVENT,
    FakeDevice,
    FakeEvent,
    FakeMigInstance,
    FakeNvLink,
    FakeNvmlState,
    FakeProcess,
)
from tests.fake_nvml.node import fake_env
from tests.helpers import ROOT, daemon_command, running_daemon

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

GIB: Final = 1024**3
MIB: Final = 1024**2
H100: Final = "NVIDIA H100 80GB HBM3"
A100: Final = "NVIDIA A100-SXM4-80GB"
NODE: Final = "gpu-node-7"
GPM: Final = {1: 45.0, 5: 40.0, 10: 55.0, 2: 62.5}  # graphics, tensor, DRAM, SM (percent)
COUNTERS: Final = ROOT / "tests" / "fixtures" / "dcgm" / "default-counters.csv"


def node(*events: FakeEvent) -> FakeNvmlState:
    hopper = FakeDevice.numbered(
        0,
        name=H100,
        util_gpu_percent=37,
        util_memory_percent=12,
        memory_total_bytes=80 * GIB,
        memory_used_bytes=30 * GIB,
        power_usage_mw=412_500,
        energy_mj=123_456_789,
        temperature_c=61,
        clock_sm_mhz=1755,
        clock_mem_mhz=2619,
        gpm_supported=True,
        gpm_metrics=GPM,
        remapped_rows_correctable=1,
        remapped_rows_uncorrectable=2,
        memory_temperature_c=47,
        encoder_util_percent=3,
        decoder_util_percent=21,
        nvlinks=[
            FakeNvLink(0, tx_kib=1000, rx_kib=2000, replay=3),
            FakeNvLink(1, tx_kib=5, rx_kib=6, replay=1),
        ],
        processes=[FakeProcess(4242, 30 * GIB)],
    )
    mig = FakeDevice.numbered(
        1,
        name=H100,
        gpm_supported=True,
        mig_mode=True,
        mig_instances=[
            FakeMigInstance(
                0,
                gpu_instance=2,
                uuid="MIG-0c0ffee0-0000-4000-8000-000000000002",
                profile="3g.40gb",
                slices=3,
                memory_total_bytes=40 * GIB,
                memory_used_bytes=12 * GIB,
                gpm_metrics={5: 50.0, 10: 20.0},
            )
        ],
        processes=[FakeProcess(700, 12 * GIB, 2, 0)],
        not_supported={
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetProcessUtilization",
            "nvmlDeviceGetRemappedRows",
        },
    )
    ampere = FakeDevice.numbered(
        2,
        minor_number=6,
        util_gpu_percent=80,
        pcie_tx_kbps=1000,
        pcie_rx_kbps=4000,
        pcie_replay_count=3,
        remapped_rows_failed=1,
        events=list(events),
    )
    return FakeNvmlState(driver_version="550.54.15", devices=[hopper, mig, ampere])


def one(text: str, name: str, **labels: str) -> tuple[dict[str, str], float]:
    found = [
        (found, number)
        for _, found, number in dcgm_series(text, name)
        if labels.items() <= found.items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_every_default_field_from_the_drivers_answers(fake_lib_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "state"
    node().write(path)
    with running_daemon(
        "--compat.dcgm",
        "--collector.nvlink",  # off by default: NVLink bandwidth's total is made from its links
        f"--kubernetes.node-name={NODE}",
        "--collect.interval=200ms",
        env=fake_env(fake_lib_dir, path),
    ) as daemon:
        daemon.wait_ready()

        def complete(text: str) -> bool:
            names = {(name, labels["gpu"]) for name, labels, _ in dcgm_series(text)}
            return {
                ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0"),  # GPM needs two samples
                ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "1"),  # and on the MIG instance
                ("DCGM_FI_PROF_PCIE_TX_BYTES", "2"),  # the PCIe thread, before Hopper
            } <= names

        daemon.metrics_until(complete, 15, "GPM windows and the PCIe thread")
        node(FakeEvent(1, XID_EVENT, 48)).write(path)
        text = daemon.metrics_until(
            lambda text: one(text, "DCGM_FI_DEV_XID_ERRORS", gpu="2")[1] == 48, 10, "XID 48"
        )

    types = declared_types(text)
    assert set(types) == {field.name for field in DEFAULT_FIELDS if field.kind != "label"}
    for field in DEFAULT_FIELDS:
        if field.kind != "label":
            assert types[field.name] == field.kind, field.name

    hopper = {"gpu": "0"}
    expected = {
        "DCGM_FI_DEV_SM_CLOCK": 1755,
        "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_MEMORY_TEMP": 47,
        "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_POWER_USAGE": 412.5,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123_456_789,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        "DCGM_FI_DEV_GPU_UTIL": 37,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 12,
        "DCGM_FI_DEV_ENC_UTIL": 3,
        "DCGM_FI_DEV_DEC_UTIL": 21,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_FB_FREE": 80 * 1024 - 577 - 30 * 1024,
        "DCGM_FI_DEV_FB_USED": 30 * 1024,
        "DCGM_FI_DEV_FB_RESERVED": 577,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (1000 + 2000 + 5 + 6) * 1024,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 2,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 1,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.45,  # GPM's graphics activity, not NVML's 37%
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.40,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.55,
    }
    for name, number in expected.items():
        labels, found = one(text, name, **hopper)
        assert found == pytest.approx(number), name
        assert labels == {
            "gpu": "0",
            "UUID": FakeDevice.numbered(0).uuid,
            "pci_bus_id": FakeDevice.numbered(0).pci_bus_id,
            "device": "nvidia0",
            "modelName": H100,
            "Hostname": NODE,
            DRIVER_VERSION: "550.54.15",
            "namespace": "",
            "pod": "",
            "container": "",
            **({"err_code": "0", "err_msg": "No Error"} if name.endswith("XID_ERRORS") else {}),
        }, name

    # The GPU in MIG mode: its own series, and its instance's under the parent's identity.
    parent = FakeDevice.numbered(1).uuid
    labels, used = one(text, "DCGM_FI_DEV_FB_USED", GPU_I_ID="2")
    assert used == 12 * 1024
    assert (labels["GPU_I_PROFILE"], labels["UUID"], labels["gpu"], labels["device"]) == (
        "3g.40gb",
        parent,
        "1",
        "nvidia1",
    )
    assert one(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", GPU_I_ID="2")[1] == pytest.approx(0.5)
    assert not [
        labels for _, labels, _ in dcgm_series(text, "DCGM_FI_DEV_GPU_UTIL") if labels["gpu"] == "1"
    ]

    # The Ampere: device from its minor number; PCIe throughput from its window; an XID.
    ampere = {"gpu": "2"}
    labels, busy = one(text, "DCGM_FI_DEV_GPU_UTIL", **ampere)
    assert (labels["device"], labels["modelName"], busy) == ("nvidia6", A100, 80)
    assert one(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", **ampere)[1] == 0.8, "no GPM: NVML's"
    assert not [
        labels
        for _, labels, _ in dcgm_series(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
        if labels["gpu"] == "2"
    ], "no NVLink: absent, not 0"
    assert one(text, "DCGM_FI_PROF_PCIE_TX_BYTES", **ampere)[1] == 1000 * 1024
    assert one(text, "DCGM_FI_PROF_PCIE_RX_BYTES", **ampere)[1] == 4000 * 1024
    assert one(text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", **ampere)[1] == 3
    assert one(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", **ampere)[1] == 1
    assert not [
        labels
        for _, labels, _ in dcgm_series(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        if labels["gpu"] == "2"
    ], "no GPM before Hopper: absent, not 0"
    labels, xid = one(text, "DCGM_FI_DEV_XID_ERRORS", **ampere)
    assert (xid, labels["err_code"], labels["err_msg"]) == (48, "48", "Double Bit ECC Error")


def test_a_counters_file_chooses_and_unknown_fields_are_logged_once(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    state = node().write(tmp_path / "state")
    counters = tmp_path / "counters.csv"
    counters.write_text(
        "# mine\n"
        "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature.\n"
        "DCGM_FI_DEV_NOT_A_FIELD, gauge, Nothing.\n"
        "DCGM_FI_DEV_FB_TOTAL, gauge, Total frame buffer (in MiB).\n"
    )
    with running_daemon(
        "--compat.dcgm",
        f"--compat.dcgm-counters={counters}",
        "--collect.interval=200ms",
        env=fake_env(fake_lib_dir, state),
    ) as daemon:
        daemon.wait_ready()
        daemon.wait_cycles(3)
        text = daemon.metrics()
        log = list(daemon.log_lines)
    assert declared_types(text) == {
        "DCGM_FI_DEV_GPU_TEMP": "gauge",
        "DCGM_FI_DEV_FB_TOTAL": "gauge",
    }
    assert "# HELP DCGM_FI_DEV_GPU_TEMP Temperature.\n" in text
    assert one(text, "DCGM_FI_DEV_FB_TOTAL", gpu="0")[1] == 80 * 1024
    assert DRIVER_VERSION not in text, "a label only when the file lists it"
    ignored = [line for line in log if "DCGM_FI_DEV_NOT_A_FIELD" in line]
    assert len(ignored) == 1, log
    assert f"at={counters}:3" in ignored[0]
    assert "level=warn" in ignored[0]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("DCGM_FI_DEV_GPU_TEMP gauge Temperature.\n", ":1: expected 3 parts"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n", ":2: "),
        ("DCGM_FI_DEV_GPU_TEMP, untyped, Temperature.\n", ":1: 'untyped' is not a type"),
    ],
)
def test_a_malformed_counters_file_stops_the_daemon_with_one_line(
    tmp_path: Path, content: str, problem: str
) -> None:
    counters = tmp_path / "counters.csv"
    counters.write_text(content)
    result = subprocess.run(
        daemon_command(
            "--simulate=1",
            "--web.listen-address=127.0.0.1:0",
            "--compat.dcgm",
            f"--compat.dcgm-counters={counters}",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"gpuscope: error: invalid --compat.dcgm-counters: {counters}{problem}")


def test_a_counters_file_without_the_flag_stops_the_daemon(tmp_path: Path) -> None:
    result = subprocess.run(
        daemon_command(
            "--simulate=1", "--web.listen-address=127.0.0.1:0", f"--compat.dcgm-counters={COUNTERS}"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--compat.dcgm-counters" in line
    assert "--compat.dcgm is" in line or "--compat.dcgm serves" in line


def test_without_the_flag_not_one_dcgm_series(fake_lib_dir: Path, tmp_path: Path) -> None:
    state = node().write(tmp_path / "state")
    with running_daemon("--collect.interval=200ms", env=fake_env(fake_lib_dir, state)) as daemon:
        daemon.wait_ready()
        text = daemon.metrics_until(
            lambda text: "gpu_sm_active_ratio" in text, 10, "a cycle with GPM"
        )
    assert "DCGM_" not in text


def test_every_other_field_a_counters_file_can_ask_for(fake_lib_dir: Path, tmp_path: Path) -> None:
    state = FakeNvmlState(
        driver_version="550.54.15",
        devices=[
            FakeDevice.numbered(
                0,
                name=H100,
                gpm_supported=True,
                gpm_metrics={3: 30.0, 11: 1.0, 12: 20.0, 13: 5.0, 60: 1000.0, 61: 2000.0},
                violation_power_ns=1_500_000_000,
                violation_thermal_ns=250_000_000,
                ecc_corrected_volatile=3,
                ecc_corrected_before_load=4,
                compute_mode=3,
                pcie_generation=5,
                pcie_width=8,
                remapped_rows_pending=1,
                clock_event_reasons=0x4 | 0x20,
                nvlinks=[FakeNvLink(0, replay=3, crc_flit=2), FakeNvLink(1, replay=1)],
            )
        ],
    ).write(tmp_path / "state")
    counters = tmp_path / "counters.csv"
    counters.write_text(
        "".join(f'{field.name}, {field.kind}, "{field.help}"\n' for field in FIELDS),
        encoding="utf-8",
    )
    with running_daemon(
        "--compat.dcgm",
        f"--compat.dcgm-counters={counters}",
        "--collector.nvlink",  # off by default: the NVLink fields are made from its links
        "--collect.interval=200ms",
        env=fake_env(fake_lib_dir, state),
    ) as daemon:
        daemon.wait_ready()
        text = daemon.metrics_until(
            lambda text: bool(dcgm_series(text, "DCGM_FI_PROF_SM_OCCUPANCY")), 15, "GPM windows"
        )
    types = declared_types(text)
    assert set(types) == {field.name for field in FIELDS if field.kind != "label"}
    for field in FIELDS:
        if field.kind != "label":
            assert types[field.name] == field.kind, field.name
    expected = {
        "DCGM_FI_DEV_FB_TOTAL": 80 * 1024,
        "DCGM_FI_DEV_MAX_SM_CLOCK": 1410,
        "DCGM_FI_DEV_MAX_MEM_CLOCK": 1593,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x4 | 0x20,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x4 | 0x20,
        "DCGM_FI_DEV_PSTATE": 0,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 400,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": 100,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": 400,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": 400,
        "DCGM_FI_DEV_COMPUTE_MODE": 3,
        "DCGM_FI_DEV_PERSISTENCE_MODE": 1,
        "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": 8,
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 4,
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16,
        "DCGM_FI_DEV_MIG_MODE": 0,
        "DCGM_FI_DEV_POWER_VIOLATION": 1_500_000_000,
        "DCGM_FI_DEV_THERMAL_VIOLATION": 250_000_000,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 7,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": 1,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 4,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 2,
        "DCGM_FI_PROF_SM_OCCUPANCY": 0.30,
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.01,
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.20,
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.05,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": 1000 * MIB,
        "DCGM_FI_PROF_NVLINK_TX_BYTES": 2000 * MIB,
    }
    for name, number in expected.items():
        assert one(text, name, gpu="0")[1] == pytest.approx(number), name
    assert not dcgm_series(text, "DCGM_FI_DEV_FAN_SPEED"), "passively cooled: absent"
