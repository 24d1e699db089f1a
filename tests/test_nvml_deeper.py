"""Deeper signals on the production path: `gpuscope serve` on the real pynvml over the fake
libnvidia-ml.so.1 — GPM, MIG instances appearing and vanishing, XID and ECC events through the
event thread (across a lost GPU and re-initialisation), throttle time, memory health, PCIe
throughput on GPUs without GPM, NVLink per link and the field values, process names, and
absence where the driver cannot give them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pynvml
import pytest

from tests.fake_nvml import (
    DOUBLE_BIT_ECC_EVENT,
    XID_EVENT,
    FakeDevice,
    FakeEvent,
    FakeMigInstance,
    FakeNvLink,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
)
from tests.fake_nvml.node import fake_env, watching, xids
from tests.helpers import assert_promtool_accepts, eventually, running_daemon, series, value

if TYPE_CHECKING:
    from pathlib import Path

    from tests.helpers import Daemon

pytestmark = pytest.mark.slow
GIB = 1024**3
MIB = 1024**2
H100 = "NVIDIA H100 80GB HBM3"
GPM = {  # NVML_GPM_METRIC_* -> value (percent or MiB/s)
    2: 62.5,
    3: 30.0,
    5: 40.0,
    10: 55.0,
    11: 1.0,
    12: 20.0,
    13: 5.0,
    20: 100.0,
    21: 300.0,
    60: 1000.0,
    61: 2000.0,
}


def instances(*, changed: bool = False) -> list[FakeMigInstance]:
    """A 3g.40gb instance in slot 0 and, before the change, an unnamed 1g one in slot 2;
    after it, slot 2 is empty and a new 2g.20gb instance sits in slot 1."""
    big = FakeMigInstance(
        0,
        gpu_instance=2,
        uuid="MIG-0c0ffee0-0000-4000-8000-000000000002",
        profile="3g.40gb",
        slices=3,
        memory_total_bytes=40 * GIB,
        memory_used_bytes=12 * GIB,
        gpm_metrics={2: 75.0, 5: 50.0, 20: 10.0},
    )
    if changed:
        return [
            big,
            FakeMigInstance(
                1,
                gpu_instance=3,
                uuid="MIG-0c0ffee0-0000-4000-8000-000000000003",
                profile="2g.20gb",
                slices=2,
                memory_total_bytes=20 * GIB,
            ),
        ]
    # Named without its profile: the profile comes from its slices and memory, via the catalog.
    small = FakeMigInstance(
        2,
        gpu_instance=9,
        uuid="MIG-0c0ffee0-0000-4000-8000-000000000009",
        profile="-",
        slices=1,
        memory_total_bytes=10 * GIB,
        memory_used_bytes=GIB,
        gpm_metrics={2: 10.0},
    )
    return [big, small]


def deeper_state(*, changed: bool = False, events: tuple[FakeEvent, ...] = ()) -> FakeNvmlState:
    hopper = FakeDevice.numbered(
        0,
        name=H100,
        gpm_supported=True,
        gpm_metrics=GPM,
        violation_power_ns=1_500_000_000,
        violation_thermal_ns=250_000_000,
        violation_app_clocks_ns=2_000_000_000,
        remapped_rows_uncorrectable=2,
        remapped_rows_pending=1,
        events=list(events),
    )
    mig = FakeDevice.numbered(
        1,
        name=H100,
        gpm_supported=True,
        mig_mode=True,
        mig_instances=instances(changed=changed),
        processes=[FakeProcess(700, 12 * GIB, 2, 0), FakeProcess(701, GIB, 9, 0)],
        # as on a real GPU in MIG mode, and not with MIG on: row remapping
        not_supported={
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetProcessUtilization",
            "nvmlDeviceGetRemappedRows",
        },
        remapped_rows_uncorrectable=7,
    )
    ampere = FakeDevice.numbered(2, pcie_tx_kbps=1000, pcie_rx_kbps=4000)
    return FakeNvmlState(devices=[hopper, mig, ampere])


def mig_uuids(daemon: Daemon) -> set[str]:
    return {
        dict(labels)["uuid"]
        for labels in series(daemon.metrics(), "gpu_up", gpu="1")
        if "gpu_instance" in dict(labels)
    }


def test_gpm_mig_throttle_and_health_through_real_pynvml(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    state = deeper_state().write(tmp_path / "state")
    with running_daemon(
        "--collect.interval=200ms", "--collector.processes", env=fake_env(fake_lib_dir, state)
    ) as daemon:
        daemon.wait_ready()

        def complete(text: str) -> bool:
            return all(
                series(text, name, **labels)
                for name, labels in (
                    ("gpu_pcie_transmit_bytes_per_second", {"gpu": "2"}),  # the PCIe thread
                    ("gpu_sm_active_ratio", {"gpu": "0"}),  # GPM needs two samples
                    ("gpu_sm_active_ratio", {"gpu_instance": "9"}),
                )
            )

        eventually(lambda: complete(daemon.metrics()), 10, "GPM windows and the PCIe thread")
        text = daemon.metrics()

        # Layout change: slot 2 destroyed, slot 1 created.
        deeper_state(changed=True).write(state)
        eventually(
            lambda: (
                mig_uuids(daemon)
                == {
                    "MIG-0c0ffee0-0000-4000-8000-000000000002",
                    "MIG-0c0ffee0-0000-4000-8000-000000000003",
                }
            ),
            10,
            "the new MIG layout",
        )

    gpu0 = {"gpu": "0", "uuid": FakeDevice.numbered(0).uuid}
    assert value(text, "gpu_sm_active_ratio", **gpu0) == pytest.approx(0.625)
    assert value(text, "gpu_sm_occupancy_ratio", **gpu0) == pytest.approx(0.30)
    assert value(text, "gpu_tensor_active_ratio", **gpu0) == pytest.approx(0.40)
    assert value(text, "gpu_dram_active_ratio", **gpu0) == pytest.approx(0.55)
    assert value(text, "gpu_fp64_active_ratio", **gpu0) == pytest.approx(0.01)
    assert value(text, "gpu_fp32_active_ratio", **gpu0) == pytest.approx(0.20)
    assert value(text, "gpu_fp16_active_ratio", **gpu0) == pytest.approx(0.05)
    assert value(text, "gpu_pcie_transmit_bytes_per_second", **gpu0) == 100 * MIB
    assert value(text, "gpu_pcie_receive_bytes_per_second", **gpu0) == 300 * MIB
    assert value(text, "gpu_nvlink_receive_bytes_per_second", **gpu0) == 1000 * MIB
    assert value(text, "gpu_nvlink_transmit_bytes_per_second", **gpu0) == 2000 * MIB
    assert value(text, "gpu_sm_active_seconds_total", **gpu0) > 0
    assert value(text, "gpu_throttle_seconds_total", reason="power", **gpu0) == 1.5
    assert value(text, "gpu_throttle_seconds_total", reason="thermal", **gpu0) == 0.25
    assert value(text, "gpu_throttle_seconds_total", reason="app_clocks", **gpu0) == 2.0
    assert value(text, "gpu_throttle_seconds_total", reason="sync_boost", **gpu0) == 0
    assert len(series(text, "gpu_throttle_seconds_total", **gpu0)) == 8
    assert value(text, "gpu_remapped_rows", cause="uncorrectable", **gpu0) == 2
    assert value(text, "gpu_remapped_rows_pending", **gpu0) == 1
    assert value(text, "gpu_retired_pages", cause="double_bit", **gpu0) == 0
    assert value(text, "gpu_mig_mode_enabled", **gpu0) == 0

    # The GPU in MIG mode: itself, plus one GPU per instance.
    parent = FakeDevice.numbered(1).uuid
    assert value(text, "gpu_mig_mode_enabled", uuid=parent) == 1
    assert not series(text, "gpu_utilization_ratio", gpu="1"), "no utilization in MIG mode"
    assert not series(text, "gpu_remapped_rows", gpu="1")
    assert not series(text, "gpu_processes", uuid=parent), "processes are listed per instance"
    big = {"gpu": "1", "mig_profile": "3g.40gb", "gpu_instance": "2"}
    small = {"gpu": "1", "mig_profile": "1g.10gb", "gpu_instance": "9"}
    (info,) = series(text, "gpu_info", **big)
    assert dict(info)["parent_uuid"] == parent
    assert dict(info)["model"] == H100
    assert value(text, "gpu_up", **big) == 1
    assert value(text, "gpu_memory_used_bytes", **big) == 12 * GIB
    assert value(text, "gpu_memory_total_bytes", **big) == 40 * GIB
    assert value(text, "gpu_processes", **big) == 1
    assert value(text, "gpu_process_memory_used_bytes", pid="700", **big) == 12 * GIB
    assert not series(text, "gpu_process_utilization_ratio", gpu="1")
    assert value(text, "gpu_sm_active_ratio", **big) == pytest.approx(0.75)
    assert value(text, "gpu_tensor_active_ratio", **big) == pytest.approx(0.50)
    assert value(text, "gpu_sm_active_ratio", **small) == pytest.approx(0.10)
    assert not series(text, "gpu_tensor_active_ratio", **small), "a metric GPM lacks: absent"
    assert value(text, "gpu_process_memory_used_bytes", pid="701", **small) == GIB

    # A GPU without GPM: PCIe throughput from the reader thread, no GPM series.
    assert value(text, "gpu_pcie_transmit_bytes_per_second", gpu="2") == 1000 * 1024
    assert value(text, "gpu_pcie_receive_bytes_per_second", gpu="2") == 4000 * 1024
    assert not series(text, "gpu_sm_active_ratio", gpu="2")
    assert not series(text, "gpu_nvlink_transmit_bytes_per_second", gpu="2")

    assert_promtool_accepts(text)


def test_xid_raised_twice_counts_two_and_the_event_thread_survives_a_lost_gpu(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "state"

    def write(*events: FakeEvent, lost: bool = False, ecc: int = 0) -> None:
        gpu0 = FakeDevice.numbered(0, events=list(events), ecc_uncorrected_volatile=ecc)
        gpu1 = FakeDevice.numbered(1, lost=lost, events=list(events))
        FakeNvmlState(devices=[gpu0, gpu1]).write(path)

    # Queued before gpuscope registered: the driver never delivers it.
    early = FakeEvent(1, XID_EVENT, 13)
    write(early)
    with running_daemon("--collect.interval=100ms", env=fake_env(fake_lib_dir, path)) as daemon:
        daemon.wait_ready()
        eventually(lambda: watching(daemon) == 1, 10, "the event set")
        first = FakeEvent(2, XID_EVENT, 79)
        write(early, first)
        eventually(lambda: xids(daemon, "0", "79") == 1, 10, "the first XID 79")
        second = FakeEvent(3, XID_EVENT, 79)
        write(early, first, second)
        eventually(lambda: xids(daemon, "0", "79") == 2, 10, "the second XID 79")
        text = daemon.metrics()
        assert value(text, "gpu_last_xid_timestamp_seconds", gpu="0") > time.time() - 60
        assert xids(daemon, "0", "13") == 0, "an event from before registration"

        ecc = FakeEvent(4, DOUBLE_BIT_ECC_EVENT)
        write(early, first, second, ecc, ecc=5)
        eventually(
            lambda: (
                value(daemon.metrics(), "gpu_ecc_errors_total", gpu="0", type="uncorrected") == 5
            ),
            10,
            "the ECC counter after the ECC event",
        )

        # GPU 1 falls off the bus and comes back: NVML re-initialises, the thread carries on.
        write(early, first, second, ecc, lost=True, ecc=5)
        eventually(lambda: value(daemon.metrics(), "gpu_up", gpu="1") == 0, 10, "GPU 1 down")
        write(early, first, second, ecc, ecc=5)
        eventually(
            lambda: value(daemon.metrics(), "gpu_up", gpu="1") == 1,
            40,  # re-initialisation backs off 1, 2, 5, 10 s: a loaded machine may miss the first
            "GPU 1 back",
        )
        eventually(lambda: watching(daemon) == 2, 10, "a new event set after re-init")
        write(early, first, second, ecc, FakeEvent(5, XID_EVENT, 48), ecc=5)
        eventually(lambda: xids(daemon, "1", "48") == 1, 10, "an XID after re-init")
        assert xids(daemon, "0", "79") == 2, "counters survive re-init; nothing is re-delivered"
        assert daemon.process.poll() is None


def test_absent_when_the_driver_lacks_the_deeper_functions(tmp_path: Path) -> None:
    old_driver = build_fake_nvml(
        tmp_path / "old-driver",
        omit=[
            "nvmlGpmQueryDeviceSupport",
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlEventSetCreate",
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetViolationStatus",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetRetiredPages",
            "nvmlDeviceGetPcieThroughput",
        ],
    )
    state = deeper_state().write(tmp_path / "state")
    with running_daemon("--collect.interval=100ms", env=fake_env(old_driver, state)) as daemon:
        daemon.wait_ready()
        text = daemon.wait_cycles(5)  # time for GPM windows and PCIe figures, were they there
    for name in (
        "gpu_sm_active_ratio",
        "gpu_pcie_transmit_bytes_per_second",
        "gpu_throttle_seconds_total",
        "gpu_remapped_rows",
        "gpu_retired_pages",
        "gpu_mig_mode_enabled",
        "gpu_xid_errors_total",
    ):
        assert not series(text, name), f"{name}: a missing function means absent, not 0"
    assert len(series(text, "gpu_up")) == 3, "no MIG instances without the MIG functions"
    assert value(text, "gpu_power_watts", gpu="0") == pytest.approx(62.0)
    assert value(text, "gpuscope_collector_success", collector="nvml") == 1
    log = "\n".join(daemon.log_lines)
    assert "cannot create an NVML event set" in log


def nvlink_state() -> FakeNvmlState:
    """GPU 0: an H100 with NVLink links 0 and 2 up (1 down) and no memory temperature field, so
    that one field answers NotSupported in a call whose others answer; GPU 1: a card without
    NVLink. Its processes have names."""
    h100 = FakeDevice.numbered(
        0,
        name=H100,
        nvlinks=[
            FakeNvLink(0, tx_kib=1000, rx_kib=2000, crc_flit=1, crc_data=2, replay=3, recovery=4),
            FakeNvLink(1, active=False),
            FakeNvLink(2, tx_kib=5, rx_kib=6),
        ],
        not_supported_fields={pynvml.NVML_FI_DEV_MEMORY_TEMP},
        power_min_limit_mw=200_000,
        power_max_limit_mw=700_000,
        power_default_limit_mw=700_000,
        power_limit_mw=500_000,
        compute_mode=pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        encoder_util_percent=0,
        decoder_util_percent=25,
        pcie_generation=5,
        pcie_max_generation=5,
        ecc_corrected_volatile=3,
        ecc_corrected_before_load=40,
        processes=[FakeProcess(4242, 20 * GIB), FakeProcess(4343, GIB)],
    )
    card = FakeDevice.numbered(
        1,
        name="NVIDIA L40S",
        memory_temperature_c=58,
        memory_used_bytes=GIB,
        persistence_mode=False,
        pcie_width=8,
    )
    return FakeNvmlState(devices=[h100, card], process_names={4242: "/usr/bin/python3"})


def test_nvlink_fields_limits_and_modes_through_real_pynvml(
    fake_lib_dir: Path, tmp_path: Path
) -> None:
    state = nvlink_state().write(tmp_path / "state")
    with running_daemon(
        "--collect.interval=100ms", "--collector.nvlink", env=fake_env(fake_lib_dir, state)
    ) as daemon:
        daemon.wait_ready()
        text = daemon.wait_cycles(2)
        log = "\n".join(daemon.log_lines)

    gpu0, gpu1 = {"gpu": "0"}, {"gpu": "1"}
    # Per link, on the two links that are up; the one down has no series.
    assert value(text, "gpu_nvlink_transmit_bytes_total", link="0", **gpu0) == 1000 * 1024
    assert value(text, "gpu_nvlink_receive_bytes_total", link="0", **gpu0) == 2000 * 1024
    assert value(text, "gpu_nvlink_transmit_bytes_total", link="2", **gpu0) == 5 * 1024
    assert value(text, "gpu_nvlink_receive_bytes_total", link="2", **gpu0) == 6 * 1024
    errors = {
        (dict(labels)["link"], dict(labels)["type"]): count
        for labels, count in series(text, "gpu_nvlink_errors_total", **gpu0).items()
    }
    assert errors == {
        ("0", "crc_flit"): 1,
        ("0", "crc_data"): 2,
        ("0", "replay"): 3,
        ("0", "recovery"): 4,
        ("2", "crc_flit"): 0,
        ("2", "crc_data"): 0,
        ("2", "replay"): 0,
        ("2", "recovery"): 0,
    }
    assert not series(text, "gpu_nvlink_transmit_bytes_total", link="1")
    # The card without NVLink: none of it; its memory temperature from the same kind of call.
    for name in ("gpu_nvlink_transmit_bytes_total", "gpu_nvlink_errors_total"):
        assert not series(text, name, **gpu1), name
    assert value(text, "gpu_memory_temperature_celsius", **gpu1) == 58
    assert not series(text, "gpu_memory_temperature_celsius", **gpu0), "NotSupported in its slot"
    assert "reading=memory_temperature" in log

    assert value(text, "gpu_power_limit_min_watts", **gpu0) == 200
    assert value(text, "gpu_power_limit_max_watts", **gpu0) == 700
    assert value(text, "gpu_power_limit_default_watts", **gpu0) == 700
    assert value(text, "gpu_power_limit_watts", **gpu0) == 500
    assert value(text, "gpu_compute_mode_info", mode="exclusive_process", **gpu0) == 1
    assert len(series(text, "gpu_compute_mode_info", **gpu0)) == 1
    assert value(text, "gpu_compute_mode_info", mode="default", **gpu1) == 1
    assert value(text, "gpu_persistence_mode_enabled", **gpu0) == 1
    assert value(text, "gpu_persistence_mode_enabled", **gpu1) == 0
    assert value(text, "gpu_encoder_utilization_ratio", **gpu0) == 0
    assert value(text, "gpu_decoder_utilization_ratio", **gpu0) == pytest.approx(0.25)
    assert value(text, "gpu_pcie_link_generation", **gpu0) == 5
    assert value(text, "gpu_pcie_link_max_generation", **gpu1) == 4
    assert value(text, "gpu_pcie_link_width", **gpu1) == 8
    assert value(text, "gpu_pcie_link_max_width", **gpu1) == 16
    assert value(text, "gpu_ecc_errors_total", type="corrected", **gpu0) == 3
    assert value(text, "gpu_ecc_errors_aggregate_total", type="corrected", **gpu0) == 43
    default = FakeDevice()
    assert value(text, "gpu_memory_free_bytes", **gpu1) == (
        default.memory_total_bytes - default.memory_reserved_bytes - GIB
    )
    assert value(text, "gpuscope_collector_success", collector="nvlink") == 1
    assert value(text, "gpuscope_collector_success", collector="device") == 1
    # Without --collect.process-names, per-process series have no process_name.
    for labels in series(text, "gpu_process_memory_used_bytes", **gpu0):
        assert "process_name" not in dict(labels)
    assert_promtool_accepts(text)


def test_process_names_with_the_flag(fake_lib_dir: Path, tmp_path: Path) -> None:
    state = nvlink_state().write(tmp_path / "state")
    with running_daemon(
        "--collect.interval=100ms",
        "--collector.processes",
        "--collect.process-names",
        env=fake_env(fake_lib_dir, state),
    ) as daemon:
        daemon.wait_ready()
        text = daemon.wait_cycles(2)
    names = {
        dict(labels)["pid"]: dict(labels)["process_name"]
        for labels in series(text, "gpu_process_memory_used_bytes", gpu="0")
    }
    assert names == {"4242": "/usr/bin/python3", "4343": ""}, "the driver could not name 4343"
    (labels,) = series(text, "gpu_processes", gpu="0")
    assert "process_name" not in dict(labels), "only the per-process series carry it"
    assert_promtool_accepts(text)
