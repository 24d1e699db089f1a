"""The production NVML path: `gpuscope serve` (no --simulate) on the real pynvml over the fake
libnvidia-ml.so.1. Values read and the library absent; the driver's faults (a GPU lost mid-run,
a function missing, initialisation failing) are in tests/test_faults.py."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.fake_nvml import STATE_ENV
from tests.fake_nvml.node import GIB, fake_env, node_state
from tests.helpers import ROOT, daemon_command, running_daemon, series, value

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow


def test_values_read_through_real_pynvml(fake_lib_dir: Path, tmp_path: Path) -> None:
    state = node_state().write(tmp_path / "state")
    # One cycle only: the fake's per-process samples are fixed, so a second cycle would rightly
    # find nothing newer (process utilization is per sampling window).
    with running_daemon(
        "--collect.interval=10m", "--collector.processes", env=fake_env(fake_lib_dir, state)
    ) as daemon:
        daemon.wait_ready()
        text = daemon.metrics()
    gpu0 = {"gpu": "0"}
    assert value(text, "gpu_utilization_ratio", **gpu0) == pytest.approx(0.37)
    assert value(text, "gpu_memory_utilization_ratio", **gpu0) == pytest.approx(0.12)
    assert value(text, "gpu_memory_used_bytes", **gpu0) == 30 * GIB
    assert value(text, "gpu_memory_total_bytes", **gpu0) == 80 * GIB
    assert value(text, "gpu_power_watts", **gpu0) == pytest.approx(412.5)
    assert value(text, "gpu_power_limit_watts", **gpu0) == pytest.approx(700.0)
    assert value(text, "gpu_energy_joules_total", **gpu0) == pytest.approx(123_456.789)
    assert value(text, "gpu_temperature_celsius", **gpu0) == 61
    assert value(text, "gpu_clock_hertz", clock="sm", **gpu0) == 1755e6
    assert value(text, "gpu_clock_event_active", reason="sw_power_cap", **gpu0) == 1
    assert value(text, "gpu_clock_event_active", reason="sw_thermal_slowdown", **gpu0) == 1
    assert value(text, "gpu_clock_event_active", reason="gpu_idle", **gpu0) == 0
    assert value(text, "gpu_ecc_errors_total", type="corrected", **gpu0) == 3
    assert value(text, "gpu_processes", **gpu0) == 2
    assert value(text, "gpu_process_memory_used_bytes", pid="4242", **gpu0) == 20 * GIB
    assert value(text, "gpu_process_utilization_ratio", pid="4242", **gpu0) == pytest.approx(0.25)
    assert value(text, "gpu_process_utilization_ratio", pid="4343", **gpu0) == 0.0
    assert value(text, "gpu_busy_seconds_total", **gpu0) == 0, "nothing to integrate yet"
    info = series(text, "gpu_info", gpu="0")
    (labels,) = info
    assert dict(labels)["driver_version"] == "550.54.15"
    assert dict(labels)["cuda_version"] == "12.4"
    assert dict(labels)["model"] == "NVIDIA H100 80GB HBM3"
    assert value(text, "gpu_fan_speed_ratio", gpu="1", fan="1") == pytest.approx(0.55)
    assert not series(text, "gpu_fan_speed_ratio", gpu="0"), "passive GPU: no fan series"
    assert value(text, "gpuscope_collector_success", collector="nvml") == 1


def test_library_absent_is_a_one_line_error(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        # A real NVIDIA driver is installed (a GPU machine): the library cannot be made absent
        # here, and this test is about machines without one.
        pytest.skip("a real libnvidia-ml is installed on this machine")
    env = {key: val for key, val in os.environ.items() if key not in {"LD_LIBRARY_PATH", STATE_ENV}}
    result = subprocess.run(
        daemon_command("--web.listen-address=127.0.0.1:0"),
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("gpuscope: error: NVML library libnvidia-ml.so.1 not found")
    assert "--simulate" in lines[-1]


def test_a_bad_process_names_value_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        daemon_command("--web.listen-address=127.0.0.1:0", "--collect.process-names=maybe"),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--collect.process-names" in line
    assert "maybe" in line
