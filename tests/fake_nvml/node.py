"""A node on the fake driver for the subprocess tests (tests/test_nvml_backend.py,
test_nvml_deeper.py, test_faults.py, test_resilience.py): the environment that puts the fake
libnvidia-ml.so.1 under `gpuscope serve`, a two-GPU node's state, and what those tests read back
from the daemon."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.fake_nvml.state import (
    STATE_ENV,
    FakeDevice,
    FakeNvmlState,
    FakeProcess,
    FakeProcessSample,
)
from tests.helpers import series, value

if TYPE_CHECKING:
    from pathlib import Path

    from tests.helpers import Daemon

GIB = 1024**3


def fake_env(lib_dir: Path, state: Path) -> dict[str, str]:
    """The environment of a daemon on the fake driver in `lib_dir`, answering from `state`."""
    return {"LD_LIBRARY_PATH": str(lib_dir), STATE_ENV: str(state)}


def node_state(*, lost: bool = False) -> FakeNvmlState:
    """A busy H100 with two processes, and a fanned GPU 1 (fallen off the bus when `lost`)."""
    return FakeNvmlState(
        driver_version="550.54.15",
        cuda_version=12040,
        devices=[
            FakeDevice.numbered(
                0,
                name="NVIDIA H100 80GB HBM3",
                util_gpu_percent=37,
                util_memory_percent=12,
                memory_total_bytes=80 * GIB,
                memory_used_bytes=30 * GIB,
                power_usage_mw=412_500,
                power_limit_mw=700_000,
                energy_mj=123_456_789,
                temperature_c=61,
                clock_sm_mhz=1755,
                clock_event_reasons=0x4 | 0x20,
                ecc_corrected_volatile=3,
                performance_state=0,
                processes=[FakeProcess(4242, 20 * GIB), FakeProcess(4343, 10 * GIB)],
                process_samples=[
                    FakeProcessSample(4242, 2_000_000_000_000_000, sm_util=30, mem_util=9),
                    FakeProcessSample(4242, 2_000_000_000_100_000, sm_util=20, mem_util=5),
                ],
            ),
            FakeDevice.numbered(1, num_fans=2, fan_speed_percent=55, lost=lost),
        ],
    )


def gpu_up(daemon: Daemon, gpu: str) -> float:
    return value(daemon.metrics(), "gpu_up", gpu=gpu)


def xids(daemon: Daemon, gpu: str, xid: str) -> float:
    """Times the daemon counted an XID on a GPU (0 while it has no series)."""
    found = series(daemon.metrics(), "gpu_xid_errors_total", gpu=gpu, xid=xid)
    return next(iter(found.values())) if found else 0.0


def watching(daemon: Daemon) -> int:
    """Event sets the daemon's event thread has created (one per NVML initialisation)."""
    return sum("watching XID and ECC events" in line for line in daemon.log_lines)
