"""The `device` collector's readings: utilization, memory, power and energy, temperatures, the
video engines, the compute and persistence modes, fans and the performance state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.readings.convert import divided_by, equals, item, member, number, truth
from exporter.readings.declare import (
    HEALTH_PERIOD_SECONDS,
    Output,
    each,
    fallback,
    family,
    plain,
    reading,
)
from exporter.readings.simulated import not_supported
from exporter.series import Series
from exporter.structs import filled

if TYPE_CHECKING:
    from exporter.readings.simulated import SimulatedGpu

_HBM_ARCHITECTURES: Final = frozenset({"volta", "hopper", "blackwell"})
_HBM_AMPERE: Final = ("a100", "a30")
"""Ampere models with HBM, by catalog key prefix (the others, A10G and A40, have GDDR6)."""
_ENGINE_PERIOD_US: Final = 167_000
"""The sampling period a real GPU reports with its video engines' utilization."""


# -- utilization ---------------------------------------------------------------------------------

UTILIZATION_FAMILY: Final = family(
    "gpu_utilization_ratio",
    "Share of the last sample period in which a kernel was running (NVML utilization).",
    unit="ratio",
    doc="share of the last sample period in which a kernel ran",
    collector="device",
)
MEMORY_UTILIZATION_FAMILY: Final = family(
    "gpu_memory_utilization_ratio",
    "Share of the last sample period in which device memory was read or written.",
    unit="ratio",
    collector="device",
)
UTILIZATION: Final = Series(UTILIZATION_FAMILY)
MEMORY_UTILIZATION: Final = Series(MEMORY_UTILIZATION_FAMILY)


def _simulated_utilization(gpu: SimulatedGpu) -> Any:
    if gpu.mig_active:
        raise not_supported()  # not reported in MIG mode
    return filled(
        pynvml.c_nvmlUtilization_t,
        gpu=round(gpu.utilization * 100),
        memory=round(gpu.memory_utilization * 100),
    )


reading(
    "utilization",
    "nvmlDeviceGetUtilizationRates",
    (
        Output(UTILIZATION, member("gpu", divisor=100.0)),
        Output(MEMORY_UTILIZATION, member("memory", divisor=100.0)),
    ),
    simulated=_simulated_utilization,
)

BUSY: Final = Series(
    family(
        "gpu_busy_seconds",
        "Utilization integrated over time at the sampling rate; rate() gives the true average.",
        kind="counter",
        unit="seconds",
        doc="the same, integrated over time: `rate(gpu_busy_seconds_total[5m])` is the true "
        "average",
        collector="device",
    )
)
"""Filled by `exporter.nvml.device`, which integrates `UTILIZATION` over time."""

# -- memory --------------------------------------------------------------------------------------

MEMORY_USED: Final = Series(
    family(
        "gpu_memory_used_bytes",
        "Frame buffer memory in use by processes.",
        unit="bytes",
        doc="frame buffer in use",
        collector="device",
    )
)
MEMORY_TOTAL: Final = Series(
    family(
        "gpu_memory_total_bytes",
        "Frame buffer memory installed.",
        unit="bytes",
        doc="frame buffer installed",
        collector="device",
    )
)
MEMORY_RESERVED: Final = Series(
    family(
        "gpu_memory_reserved_bytes",
        "Frame buffer memory reserved by the driver and firmware.",
        unit="bytes",
        doc="frame buffer reserved by driver and firmware",
        collector="device",
    )
)
MEMORY_FREE: Final = Series(
    family(
        "gpu_memory_free_bytes",
        "Frame buffer memory free for processes.",
        unit="bytes",
        doc="frame buffer free: installed minus reserved minus used",
        collector="device",
    )
)


def _memory(gpu: SimulatedGpu, position: int | None) -> tuple[int, int, int, int]:
    """(total, reserved, used, free) bytes of the GPU or of its MIG instance in `position`."""
    total, reserved, used = gpu.memory(position)
    return total, reserved, used, max(total - reserved - used, 0)


def _simulated_memory_v2(gpu: SimulatedGpu, position: int | None) -> Any:
    total, reserved, used, free = _memory(gpu, position)
    return filled(
        pynvml.c_nvmlMemory_v2_t,
        version=pynvml.nvmlMemory_v2,
        total=total,
        reserved=reserved,
        free=free,
        used=used,
    )


def _simulated_memory_v1(gpu: SimulatedGpu, position: int | None) -> Any:
    total, reserved, used, free = _memory(gpu, position)
    # v1 counts reserved memory as used
    return filled(pynvml.c_nvmlMemory_t, total=total, free=free, used=used + reserved)


reading(
    "memory_v2",
    "nvmlDeviceGetMemoryInfo",
    (
        Output(MEMORY_USED, member("used")),
        Output(MEMORY_TOTAL, member("total")),
        Output(MEMORY_RESERVED, member("reserved")),
        Output(MEMORY_FREE, member("free")),
    ),
    args=(pynvml.nvmlMemory_v2,),
    mig=True,
    # v1 counts reserved memory as used and has no reserved figure
    fallback=fallback(
        "memory",
        "nvmlDeviceGetMemoryInfo",
        (
            Output(MEMORY_USED, member("used")),
            Output(MEMORY_TOTAL, member("total")),
            Output(MEMORY_FREE, member("free")),
        ),
        mig=True,
        simulated=_simulated_memory_v1,
    ),
    simulated=_simulated_memory_v2,
)

# -- power and energy ----------------------------------------------------------------------------

POWER: Final = plain(
    "power",
    "nvmlDeviceGetPowerUsage",
    family(
        "gpu_power_watts",
        "Power draw of the whole board.",
        unit="watts",
        doc="board power draw",
        collector="device",
    ),
    divided_by(1000.0),
    simulated=lambda gpu: round(gpu.power_watts * 1000),
)
POWER_LIMIT: Final = plain(
    "power_limit",
    "nvmlDeviceGetEnforcedPowerLimit",
    family(
        "gpu_power_limit_watts",
        "Power limit the driver enforces.",
        unit="watts",
        doc="enforced power limit",
        collector="device",
    ),
    divided_by(1000.0),
    period=HEALTH_PERIOD_SECONDS,  # changed by an administrator (`nvidia-smi -pl`), rarely
    simulated=lambda gpu: round(gpu.model.tdp_watts * 1000),
)
POWER_LIMIT_MIN: Final = Series(
    family(
        "gpu_power_limit_min_watts",
        "Lowest power limit the board accepts.",
        unit="watts",
        doc="lowest power limit the board accepts (`nvidia-smi -pl`); absent where the limit "
        "cannot be changed",
        collector="device",
    )
)
POWER_LIMIT_MAX: Final = Series(
    family(
        "gpu_power_limit_max_watts",
        "Highest power limit the board accepts.",
        unit="watts",
        doc="highest power limit the board accepts; `gpu_power_limit_watts` is the one enforced "
        "now",
        collector="device",
    )
)


def _simulated_power_constraints(gpu: SimulatedGpu) -> list[int]:
    tdp = round(gpu.model.tdp_watts * 1000)
    return [tdp // 4, tdp]


reading(
    "power_limits",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    (
        Output(POWER_LIMIT_MIN, item(0, divisor=1000.0)),
        Output(POWER_LIMIT_MAX, item(1, divisor=1000.0)),
    ),
    once=True,
    simulated=_simulated_power_constraints,
)
POWER_LIMIT_DEFAULT: Final = plain(
    "power_limit_default",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    family(
        "gpu_power_limit_default_watts",
        "Power limit the board starts with.",
        unit="watts",
        doc="power limit the board starts with (below it, someone lowered the limit)",
        collector="device",
    ),
    divided_by(1000.0),
    once=True,
    simulated=lambda gpu: round(gpu.model.tdp_watts * 1000),
)
ENERGY: Final = plain(
    "energy",
    "nvmlDeviceGetTotalEnergyConsumption",
    family(
        "gpu_energy_joules",
        "Energy consumed since the driver was loaded (resets when it reloads).",
        kind="counter",
        unit="joules",
        doc="energy since the driver loaded (the driver's own total)",
        collector="device",
    ),
    divided_by(1000.0),
    since="volta",
    simulated=lambda gpu: int(gpu.energy_millijoules),
)

# -- temperatures --------------------------------------------------------------------------------

TEMPERATURE: Final = plain(
    "temperature",
    "nvmlDeviceGetTemperature",
    family(
        "gpu_temperature_celsius",
        "GPU core temperature.",
        unit="celsius",
        doc="core temperature",
        collector="device",
    ),
    number,
    args=(pynvml.NVML_TEMPERATURE_GPU,),
    simulated=lambda gpu: round(gpu.temperature),
)


def _simulated_memory_temperature(gpu: SimulatedGpu) -> int:
    model = gpu.model
    if model.architecture == "ampere":
        hbm = model.key.startswith(_HBM_AMPERE)
    else:
        hbm = model.architecture in _HBM_ARCHITECTURES
    if not hbm:
        raise not_supported()  # GDDR boards have no memory sensor NVML reads
    return round(gpu.temperature + 3)


MEMORY_TEMPERATURE: Final = plain(
    "memory_temperature",
    "nvmlDeviceGetFieldValues",
    family(
        "gpu_memory_temperature_celsius",
        "Device memory (HBM) temperature.",
        unit="celsius",
        doc="device memory temperature, on HBM boards (V100, A100, H100, …); GDDR boards (T4, "
        "A10G, L4, L40S, …) have no sensor NVML reads: absent there (a field value)",
        collector="device",
    ),
    number,
    field=pynvml.NVML_FI_DEV_MEMORY_TEMP,
    # HBM's temperature follows the die's by seconds: the health clock (the field-value call,
    # then made every cycle only for NVLink's traffic)
    period=HEALTH_PERIOD_SECONDS,
    since="volta",
    simulated=_simulated_memory_temperature,
)

# -- video engines -------------------------------------------------------------------------------


def _simulated_engine(_gpu: SimulatedGpu) -> list[int]:
    return [0, _ENGINE_PERIOD_US]  # no video work is simulated: idle engines, or no NVENC at all


ENCODER: Final = plain(
    "encoder",
    "nvmlDeviceGetEncoderUtilization",
    family(
        "gpu_encoder_utilization_ratio",
        "Share of the last sample period in which the video encoder (NVENC) was busy.",
        unit="ratio",
        doc="share of the last sample period the video encoders (NVENC) were busy; 0, not "
        "absent, on boards without NVENC (A100, H100)",
        collector="device",
    ),
    item(0, divisor=100.0),
    simulated=_simulated_engine,
)
DECODER: Final = plain(
    "decoder",
    "nvmlDeviceGetDecoderUtilization",
    family(
        "gpu_decoder_utilization_ratio",
        "Share of the last sample period in which the video decoder (NVDEC) was busy.",
        unit="ratio",
        doc="the same for the video decoders (NVDEC)",
        collector="device",
    ),
    item(0, divisor=100.0),
    simulated=_simulated_engine,
)

# -- modes ---------------------------------------------------------------------------------------

COMPUTE_MODES: Final = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
_COMPUTE_MODE_FAMILY: Final = family(
    "gpu_compute_mode_info",
    "The GPU's compute mode (who may create CUDA contexts on it); always 1.",
    labels=("mode",),
    labels_doc="`mode` (`default`, `exclusive_thread`, `prohibited`, `exclusive_process`)",
    doc="the GPU's compute mode: who may create CUDA contexts on it; always 1",
    collector="device",
)
COMPUTE_MODE: Final = {
    name: Series(_COMPUTE_MODE_FAMILY, (("mode", name),)) for name in COMPUTE_MODES.values()
}
reading(
    "compute_mode",
    "nvmlDeviceGetComputeMode",
    tuple(Output(COMPUTE_MODE[name], equals(mode)) for mode, name in COMPUTE_MODES.items()),
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda _gpu: pynvml.NVML_COMPUTEMODE_DEFAULT,
)
PERSISTENCE_MODE: Final = plain(
    "persistence_mode",
    "nvmlDeviceGetPersistenceMode",
    family(
        "gpu_persistence_mode_enabled",
        "1 if persistence mode is on (the driver stays initialised with no client), else 0.",
        doc="1 if persistence mode is on (the driver stays initialised with no client), 0 if off",
        collector="device",
    ),
    truth,
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda _gpu: pynvml.NVML_FEATURE_ENABLED,
)

# -- fans and the performance state --------------------------------------------------------------


def _simulated_fan(gpu: SimulatedGpu, fan: int) -> int:
    if not 0 <= fan < gpu.model.fans:
        raise not_supported()
    return round(min(max(30 + (gpu.temperature - 35) * 1.5, 30), 100))


FAN: Final = plain(
    "fan",
    "nvmlDeviceGetFanSpeed_v2",
    family(
        "gpu_fan_speed_ratio",
        "Fan speed as a share of its maximum.",
        unit="ratio",
        labels=("fan",),
        doc="fan speed (actively cooled cards only)",
        collector="device",
    ),
    divided_by(100.0),
    per="fan",
    simulated=_simulated_fan,
)
"""The per-fan template: fan N fills `fan_series(N)`."""


def fan_series(fan: int) -> Series:
    """The speed series of fan number `fan`."""
    return each(FAN, "fan", fan)


PSTATE: Final = plain(
    "pstate",
    "nvmlDeviceGetPerformanceState",
    family(
        "gpu_performance_state",
        "Performance state: 0 (P0, fastest) to 15 (P15, slowest).",
        doc="P-state, 0 (fastest) to 15",
        collector="device",
    ),
    number,
    simulated=lambda gpu: 0 if gpu.working else 8,
)
