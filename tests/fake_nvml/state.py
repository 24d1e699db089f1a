"""The state the fake NVML library serves, and its on-disk form.

The library reads the file named by ``$FAKE_NVML_STATE`` at ``nvmlInit`` and re-reads it
whenever it changes, so rewriting the file changes what a running client sees.  Scalar
``FakeDevice`` fields are written as ``<field name> <value>`` lines; the C side knows the
same names (``device_fields[]`` in fake_nvml.c) and rejects unknown keys, so the two cannot
drift apart silently.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_ENV = "FAKE_NVML_STATE"
FORMAT_HEADER = "fake_nvml_state 1"

MIB = 1024**2
GIB = 1024**3
NOT_IN_MIG = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG mode

# Bus ids of the eight GPUs in a DGX A100, so numbered devices look like a real node.
_DGX_A100_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_UUID_PREFIX = "GPU-6a9f2c1e-5b3d-4e8a-9c71-0d2e4f6a"


def _uuid(index: int) -> str:
    return f"{_UUID_PREFIX}{index:04x}"


def _pci_bus_id(index: int) -> str:
    bus = _DGX_A100_BUSES[index] if index < len(_DGX_A100_BUSES) else 0xC0 + index
    return f"00000000:{bus:02X}:00.0"


@dataclass
class FakeProcess:
    """A process with a compute context (or an MPS client) on a GPU."""

    pid: int
    used_memory_bytes: int | None = 0  # None: NVML_VALUE_NOT_AVAILABLE (pynvml gives None)
    gpu_instance_id: int = NOT_IN_MIG
    compute_instance_id: int = NOT_IN_MIG


@dataclass
class FakeProcessSample:
    """One nvmlProcessUtilizationSample_t; returned when newer than the caller's timestamp."""

    pid: int
    timestamp_us: int
    sm_util: int = 0
    mem_util: int = 0
    enc_util: int = 0
    dec_util: int = 0


@dataclass
class FakeMigInstance:
    """A MIG device in `slot` (0..6) of its GPU; named "<GPU name> MIG <profile>"."""

    slot: int
    gpu_instance: int
    uuid: str
    profile: str = "1g.10gb"  # "-": a name without the profile, so only the attributes tell
    compute_instance: int = 0
    slices: int = 1
    memory_total_bytes: int = 10 * GIB
    memory_used_bytes: int = 0
    gpm_metrics: dict[int, float] = field(default_factory=dict)


@dataclass
class FakeEvent:
    """An event the driver has queued; delivered to sets registered before it (by `seq`)."""

    seq: int
    type: int  # nvmlEventType* bit, e.g. 0x8 = XID critical error
    data: int = 0  # the XID for an XID event


@dataclass
class FakeNvLink:
    """One NVLink link of a GPU: its data counters (KiB, as the field values count them) and
    its data-link error counters."""

    link: int
    active: bool = True
    tx_kib: int = 0
    rx_kib: int = 0
    crc_flit: int = 0
    crc_data: int = 0
    replay: int = 0
    recovery: int = 0


XID_EVENT = 0x8
SINGLE_BIT_ECC_EVENT = 0x1
DOUBLE_BIT_ECC_EVENT = 0x2


@dataclass
class FakeDevice:
    """One GPU; defaults are an idle NVIDIA A100-SXM4-80GB. Index = position in the list."""

    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = _uuid(0)
    pci_bus_id: str = _pci_bus_id(0)
    pci_device_id: int = 0x20B210DE  # device << 16 | vendor
    pci_subsystem_id: int = 0x147F10DE
    minor_number: int = 0
    util_gpu_percent: int = 0
    util_memory_percent: int = 0
    memory_total_bytes: int = 80 * GIB
    memory_reserved_bytes: int = 577 * MIB
    memory_used_bytes: int = 0  # free = total - reserved - used
    power_usage_mw: int = 62_000
    power_limit_mw: int = 400_000
    power_min_limit_mw: int = 100_000
    power_max_limit_mw: int = 400_000
    power_default_limit_mw: int = 400_000
    energy_mj: int = 35_000_000
    temperature_c: int = 32
    memory_temperature_c: int = 35  # the NVML_FI_DEV_MEMORY_TEMP field (HBM)
    clock_graphics_mhz: int = 210
    clock_sm_mhz: int = 210
    clock_mem_mhz: int = 1593
    clock_video_mhz: int = 795
    max_clock_graphics_mhz: int = 1410
    max_clock_sm_mhz: int = 1410
    max_clock_mem_mhz: int = 1593
    max_clock_video_mhz: int = 1290
    clock_event_reasons: int = 0x1  # GpuIdle
    num_fans: int = 0  # SXM boards are passively cooled: fan speed is NOT_SUPPORTED
    fan_speed_percent: int = 0
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    # errors from before the driver loaded: the aggregate counts are volatile + these
    ecc_corrected_before_load: int = 0
    ecc_uncorrected_before_load: int = 0
    pcie_replay_count: int = 0
    pcie_generation: int = 1  # an idle A100 trains its link down
    pcie_max_generation: int = 4
    pcie_width: int = 16
    pcie_max_width: int = 16
    compute_mode: int = 0  # NVML_COMPUTEMODE_DEFAULT
    persistence_mode: bool = True
    performance_state: int = 0
    encoder_util_percent: int = 0  # video engines: read by nvitop (benchmarks/peers.py)
    decoder_util_percent: int = 0
    lost: bool = False  # every per-device call raises GPU_IS_LOST; sticky until re-init
    hang: bool = False  # every per-device call blocks until this is cleared again
    gpm_supported: bool = False
    mig_mode: bool = False
    # nanoseconds per perf policy: nvmlDeviceGetViolationStatus and the matching field values
    violation_power_ns: int = 0
    violation_thermal_ns: int = 0
    violation_sync_boost_ns: int = 0
    violation_board_limit_ns: int = 0
    violation_low_utilization_ns: int = 0
    violation_reliability_ns: int = 0
    violation_app_clocks_ns: int = 0
    violation_base_clocks_ns: int = 0
    remapped_rows_correctable: int = 0
    remapped_rows_uncorrectable: int = 0
    remapped_rows_pending: int = 0
    remapped_rows_failed: int = 0
    retired_pages_single_bit: int = 0
    retired_pages_double_bit: int = 0
    retired_pages_pending: int = 0
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    supported_events: int = XID_EVENT | SINGLE_BIT_ECC_EVENT | DOUBLE_BIT_ECC_EVENT
    # Exported symbol names (e.g. "nvmlDeviceGetFanSpeed_v2") answering NOT_SUPPORTED.
    not_supported: set[str] = field(default_factory=set)
    # Field ids (NVML_FI_DEV_*) answering NOT_SUPPORTED in their own slot of a field-value call.
    not_supported_fields: set[int] = field(default_factory=set)
    nvlinks: list[FakeNvLink] = field(default_factory=list)  # none: a GPU without NVLink
    processes: list[FakeProcess] = field(default_factory=list)
    mps_processes: list[FakeProcess] = field(default_factory=list)
    process_samples: list[FakeProcessSample] = field(default_factory=list)
    gpm_metrics: dict[int, float] = field(default_factory=dict)  # NVML_GPM_METRIC_* -> value
    mig_instances: list[FakeMigInstance] = field(default_factory=list)
    events: list[FakeEvent] = field(default_factory=list)

    @classmethod
    def numbered(cls, index: int, **overrides: Any) -> FakeDevice:
        """A device with the UUID, bus id and minor number of GPU ``index`` in a node."""
        values: dict[str, Any] = {
            "uuid": _uuid(index),
            "pci_bus_id": _pci_bus_id(index),
            "minor_number": index,
        }
        return cls(**(values | overrides))


_LIST_FIELDS = frozenset(
    {
        "not_supported",
        "processes",
        "mps_processes",
        "process_samples",
        "gpm_metrics",
        "mig_instances",
        "events",
        "not_supported_fields",
        "nvlinks",
    }
)


def _scalar(name: str, value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    text = str(value)
    if "\n" in text or "\r" in text or text != text.strip():
        msg = f"{name}={value!r}: values must be single-line without surrounding blanks"
        raise ValueError(msg)
    return text


def _process_line(key: str, proc: FakeProcess) -> str:
    memory = "na" if proc.used_memory_bytes is None else proc.used_memory_bytes
    return f"{key} {proc.pid} {memory} {proc.gpu_instance_id} {proc.compute_instance_id}"


def _device_lines(device: FakeDevice) -> list[str]:
    lines = ["device"]
    lines += [
        f"{f.name} {_scalar(f.name, getattr(device, f.name))}"
        for f in dataclasses.fields(device)
        if f.name not in _LIST_FIELDS
    ]
    lines += [f"not_supported {_scalar('not_supported', n)}" for n in sorted(device.not_supported)]
    lines += [_process_line("process", p) for p in device.processes]
    lines += [_process_line("mps_process", p) for p in device.mps_processes]
    lines += [
        f"sample {s.pid} {s.timestamp_us} {s.sm_util} {s.mem_util} {s.enc_util} {s.dec_util}"
        for s in device.process_samples
    ]
    lines += [f"gpm_metric {metric} {value!r}" for metric, value in device.gpm_metrics.items()]
    for mig in device.mig_instances:
        lines.append(
            f"mig {mig.slot} {mig.gpu_instance} {mig.compute_instance} {mig.slices} "
            f"{mig.memory_total_bytes} {mig.memory_used_bytes} {_scalar('uuid', mig.uuid)} "
            f"{_scalar('profile', mig.profile)}"
        )
        lines += [
            f"mig_gpm_metric {mig.gpu_instance} {metric} {value!r}"
            for metric, value in mig.gpm_metrics.items()
        ]
    lines += [f"event {e.seq} {e.type} {e.data}" for e in device.events]
    lines += [f"not_supported_field {n}" for n in sorted(device.not_supported_fields)]
    lines += [
        f"nvlink {n.link} {int(n.active)} {n.tx_kib} {n.rx_kib} {n.crc_flit} {n.crc_data} "
        f"{n.replay} {n.recovery}"
        for n in device.nvlinks
    ]
    return lines


@dataclass
class FakeNvmlState:
    """The whole fake system: driver, CUDA version, GPUs, and how nvmlInit behaves."""

    driver_version: str = "550.54.15"
    cuda_version: int = 12040  # as nvmlSystemGetCudaDriverVersion reports: 1000*major + 10*minor
    devices: list[FakeDevice] = field(default_factory=lambda: [FakeDevice()])
    init_error: int = 0  # nvmlReturn_t for nvmlInit to fail with, e.g. 9 = DRIVER_NOT_LOADED
    event_wait_error: int = 0  # nvmlReturn_t every nvmlEventSetWait_v2 fails with, e.g. 999
    # What nvmlSystemGetProcessName says per pid (others: NOT_FOUND).
    process_names: dict[int, str] = field(default_factory=dict)

    def to_text(self) -> str:
        for attr in ("uuid", "pci_bus_id"):
            values = [getattr(d, attr) for d in self.devices]
            if len(set(values)) != len(values):
                msg = f"devices share a {attr} ({values}); use FakeDevice.numbered(i)"
                raise ValueError(msg)
        lines = [
            FORMAT_HEADER,
            f"driver_version {_scalar('driver_version', self.driver_version)}",
            f"cuda_version {self.cuda_version}",
            f"init_error {self.init_error}",
            f"event_wait_error {self.event_wait_error}",
        ]
        lines += [
            f"process_name {pid} {_scalar('process_name', name)}"
            for pid, name in self.process_names.items()
        ]
        for device in self.devices:
            lines += _device_lines(device)
        return "\n".join(lines) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Replace the state file atomically, so the library never reads a partial file."""
        path = Path(path)
        text = self.to_text()
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as tmp:
            tmp.write(text)
        # A reused inode, the same size and an mtime within one timestamp tick would make
        # the change invisible to the library: make the mtime strictly newer.
        try:
            previous_ns = path.stat().st_mtime_ns
        except FileNotFoundError:
            previous_ns = 0
        mtime_ns = max(time.time_ns(), previous_ns + 1)
        os.utime(tmp.name, ns=(mtime_ns, mtime_ns))
        os.replace(tmp.name, path)
        return path
