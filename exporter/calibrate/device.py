"""Which device calibration runs on, what it is called, and its state before and after.

The device's state (temperature, clocks, power, clock-event reasons) comes from NVML through the
daemon's driver boundary (`exporter.nvml.driver`), matched to torch's device by UUID, since
`CUDA_VISIBLE_DEVICES` renumbers devices for torch but not for NVML. The readings are the
daemon's own declarations (`exporter.readings`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pynvml
import torch

from exporter.calibration.profile import Reading
from exporter.nvml.driver import error_name
from exporter.readings import BY_NAME, read_now
from exporter.readings.clocks import CLOCK_EVENTS, CLOCKS
from exporter.readings.device import POWER, TEMPERATURE

if TYPE_CHECKING:
    from exporter.nvml.driver import NvmlDriver
    from exporter.readings.declare import Reading as ReadingDeclaration
    from exporter.series import Series

log = logging.getLogger(__name__)

CPU_CACHE_ROOT: Final = Path("/sys/devices/system/cpu/cpu0/cache")


class DeviceError(Exception):
    """The asked-for device cannot be used; `str()` says why in one line."""


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    device: torch.device
    model: str
    """The name NVML reports for a GPU (torch reports the same); the CPU's model name on CPU."""
    total_memory_bytes: int
    cache_bytes: int
    """The last-level cache (L2 on a GPU): buffers for bandwidth are sized far above it."""
    uuid: str | None = None
    capability: tuple[int, int] | None = None


def resolve(spec: str) -> torch.device:
    """`auto` (the first GPU if torch sees one, else the CPU), `cpu`, `cuda` or `cuda:N`."""
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"no CUDA device: torch {torch.__version__} sees none (use --device cpu to run "
                "on the CPU)"
            )
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise DeviceError(f"no {spec}: torch sees {torch.cuda.device_count()} GPU(s)")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    return device


def describe(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        uuid = getattr(properties, "uuid", None)
        return DeviceInfo(
            device=device,
            model=str(properties.name),
            total_memory_bytes=int(properties.total_memory),
            cache_bytes=int(getattr(properties, "L2_cache_size", 0)) or 50 * 2**20,
            uuid=f"GPU-{uuid}" if uuid is not None else None,
            capability=(int(properties.major), int(properties.minor)),
        )
    return DeviceInfo(
        device=device,
        model=cpu_model_name(_read_text(Path("/proc/cpuinfo"))),
        total_memory_bytes=_memory_total_bytes(_read_text(Path("/proc/meminfo"))),
        cache_bytes=largest_cpu_cache_bytes(CPU_CACHE_ROOT),
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_model_name(cpuinfo: str) -> str:
    """The `model name` line of /proc/cpuinfo (x86), else `Model`/`Hardware` (Arm), else `cpu`."""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        match = re.search(rf"^{key}\s*:\s*(.+?)\s*$", cpuinfo, re.MULTILINE)
        if match:
            return re.sub(r"\s+", " ", match[1])
    return "cpu"


def _memory_total_bytes(meminfo: str) -> int:
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match[1]) * 1024 if match else 0


def parse_cache_size(text: str) -> int:
    """Sizes as sysfs writes them: `32768K`, `2M`, `512`."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if match is None:
        return 0
    return int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]]


def largest_cpu_cache_bytes(root: Path) -> int:
    sizes = [parse_cache_size(_read_text(index / "size")) for index in root.glob("index*")]
    return max(sizes, default=0) or 32 * 2**20


class NvmlConditions:
    """NVML readings of the calibrated GPU, through the daemon's driver boundary."""

    def __init__(self, driver: NvmlDriver, uuid: str) -> None:
        self._nvml = driver
        self._uuid = uuid
        self._handle: Any = None
        self.driver_version: str | None = None

    def open(self) -> str | None:
        """Find the GPU; None when ready, else the reason readings will be missing."""
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as error:
            return f"NVML unavailable: {error_name(error)}"
        try:
            self.driver_version = _text(self._nvml.nvmlSystemGetDriverVersion())
            count = self._nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            return f"NVML failed: {error_name(error)}"
        for index in range(count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError:
                continue  # another GPU that does not answer is not this one's problem
            if uuid == self._uuid:
                self._handle = handle
                return None
        return f"NVML has no GPU with UUID {self._uuid}"

    def read(self) -> Reading:
        values: dict[Series, float] = {}
        for name in ("temperature", "sm_clock", "memory_clock", "power", "clock_events"):
            values.update(self._optional(BY_NAME[name]))
        return Reading(
            temperature_celsius=values.get(TEMPERATURE),
            sm_clock_hertz=values.get(CLOCKS["sm"]),
            memory_clock_hertz=values.get(CLOCKS["memory"]),
            power_watts=values.get(POWER),
            clock_event_reasons=tuple(
                reason for reason, series in CLOCK_EVENTS.items() if values.get(series) == 1.0
            ),
        )

    def _optional(self, reading: ReadingDeclaration) -> dict[Series, float]:
        try:
            return read_now(self._nvml, self._handle, reading)
        except pynvml.NVMLError as error:
            log.debug(
                "NVML reading failed", extra={"reading": reading.name, "error": error_name(error)}
            )
            return {}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            log.debug("nvmlShutdown failed", extra={"error": error_name(error)})


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
