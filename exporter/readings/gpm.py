"""The `gpm` collector's families: what GPM (GPU Performance Monitoring, Hopper and newer)
measures over each sampling window, and the activity counters integrated from it. They are
filled by `exporter.nvml.gpm` (`GPM_METRICS`) and `exporter.nvml.device` (`INTEGRATED_ACTIVITY`),
not by plain readings."""

from __future__ import annotations

from typing import Final

import pynvml

from exporter.readings.declare import family
from exporter.readings.pcie import PCIE_RECEIVE, PCIE_TRANSMIT
from exporter.series import Series

GRAPHICS_ACTIVE: Final = Series(
    family(
        "gpu_graphics_active_ratio",
        "Share of time the graphics or compute engine was active (GPM).",
        unit="ratio",
        doc="share of time the graphics or compute engine was active (GPM: Hopper and newer; "
        "absent on older GPUs, where gpuscope puts nothing in its place — the nearest is "
        "`gpu_utilization_ratio`, NVML's sampled share of time a kernel ran)",
        collector="gpm",
    )
)
SM_ACTIVE: Final = Series(
    family(
        "gpu_sm_active_ratio",
        "Share of time the SMs had at least one warp resident, averaged over the SMs (GPM).",
        unit="ratio",
        doc="share of time the SMs had work resident, averaged over the SMs (GPM: Hopper and newer)",
        collector="gpm",
    )
)
SM_OCCUPANCY: Final = Series(
    family(
        "gpu_sm_occupancy_ratio",
        "Resident warps as a share of the SMs' maximum, averaged over the SMs (GPM).",
        unit="ratio",
        doc="resident warps as a share of the SMs' maximum (GPM)",
        collector="gpm",
    )
)
TENSOR_ACTIVE: Final = Series(
    family(
        "gpu_tensor_active_ratio",
        "Share of time the SMs ran tensor-core instructions (GPM).",
        unit="ratio",
        collector="gpm",
    )
)
DRAM_ACTIVE: Final = Series(
    family(
        "gpu_dram_active_ratio",
        "Device memory bandwidth used as a share of its peak (GPM).",
        unit="ratio",
        doc="device memory bandwidth used, as a share of its peak (GPM)",
        collector="gpm",
    )
)
FP64_ACTIVE: Final = Series(
    family(
        "gpu_fp64_active_ratio",
        "Share of time the SMs ran non-tensor FP64 math (GPM).",
        unit="ratio",
        collector="gpm",
    )
)
FP32_ACTIVE: Final = Series(
    family(
        "gpu_fp32_active_ratio",
        "Share of time the SMs ran non-tensor FP32 math (GPM).",
        unit="ratio",
        collector="gpm",
    )
)
FP16_ACTIVE: Final = Series(
    family(
        "gpu_fp16_active_ratio",
        "Share of time the SMs ran non-tensor FP16 math (GPM).",
        unit="ratio",
        collector="gpm",
    )
)
NVLINK_TRANSMIT: Final = Series(
    family(
        "gpu_nvlink_transmit_bytes_per_second",
        "NVLink traffic sent by the GPU over all its links (GPM).",
        doc="NVLink traffic sent over all links (GPM)",
        collector="gpm",
    )
)
NVLINK_RECEIVE: Final = Series(
    family(
        "gpu_nvlink_receive_bytes_per_second",
        "NVLink traffic received by the GPU over all its links (GPM).",
        doc="NVLink traffic received over all links (GPM)",
        collector="gpm",
    )
)
SM_ACTIVE_SECONDS: Final = Series(
    family(
        "gpu_sm_active_seconds",
        "SM activity integrated over time; rate() gives the true average SM activity.",
        kind="counter",
        unit="seconds",
        doc="SM activity integrated over time: `rate()` is the true average",
        collector="gpm",
    )
)
TENSOR_ACTIVE_SECONDS: Final = Series(
    family(
        "gpu_tensor_active_seconds",
        "Tensor-core activity integrated over time; rate() gives its true average.",
        kind="counter",
        unit="seconds",
        doc="tensor-core activity integrated over time",
        collector="gpm",
    )
)
DRAM_ACTIVE_SECONDS: Final = Series(
    family(
        "gpu_dram_active_seconds",
        "DRAM bandwidth use integrated over time; rate() gives its true average.",
        kind="counter",
        unit="seconds",
        doc="DRAM bandwidth use integrated over time",
        collector="gpm",
    )
)

GPM_METRICS: Final = (
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, GRAPHICS_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_SM_UTIL, SM_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, SM_OCCUPANCY, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, TENSOR_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, DRAM_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP64_UTIL, FP64_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP32_UTIL, FP32_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_FP16_UTIL, FP16_ACTIVE, 0.01, 1.0),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, PCIE_TRANSMIT, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, PCIE_RECEIVE, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, NVLINK_TRANSMIT, float(2**20), float("inf")),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, NVLINK_RECEIVE, float(2**20), float("inf")),
)
"""(GPM metric id, series, factor to base units, ceiling): percentages become ratios capped at 1
(the driver's counters can overshoot by rounding), MiB/s become bytes/s."""

INTEGRATED_ACTIVITY: Final = (
    (SM_ACTIVE, SM_ACTIVE_SECONDS),
    (TENSOR_ACTIVE, TENSOR_ACTIVE_SECONDS),
    (DRAM_ACTIVE, DRAM_ACTIVE_SECONDS),
)
"""GPM ratios integrated over their windows into counters: (ratio, its counter)."""
