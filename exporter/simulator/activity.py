"""What the simulated GPM counters see: activity rates of running work, pure functions.

A process with a share `s` of its GPU (or MIG instance) keeps the SMs busy for most of that
time, spends `tensor_intensity` of it on tensor cores and the rest on plain FP32/FP16/FP64
math, moves DRAM in proportion to `memory_intensity`, reads its input over PCIe (an
input-starved one far more) and, when its work is tensor-heavy, exchanges gradients over
NVLink. The driver integrates these rates over time; GPM metrics are the integrals' slopes
between two samples, as on a real GPU.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Final

import pynvml

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.simulator.fleet import SimProcess

RATIOS: Final = 8
"""The first RATIOS entries of an activity vector are shares of time (0..1); the rest bytes/s."""
SIZE: Final = 12

GPM_METRICS: Final = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: 0,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 1,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 2,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 3,
    pynvml.NVML_GPM_METRIC_FP64_UTIL: 4,
    pynvml.NVML_GPM_METRIC_FP32_UTIL: 5,
    pynvml.NVML_GPM_METRIC_FP16_UTIL: 6,
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 7,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 8,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 9,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 10,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 11,
}
"""GPM metric id -> position in an activity vector."""
PCIE_TX: Final = 8
PCIE_RX: Final = 9
NVLINK_TX: Final = 10
NVLINK_RX: Final = 11

_PCIE_RX_PER_SHARE: Final = 1.5e9
_PCIE_RX_PER_SHARE_STARVED: Final = 12e9
_NVLINK_PER_TENSOR_SHARE: Final = 25e9


def rates(shares: Iterable[tuple[SimProcess, float]]) -> list[float]:
    """Activity rates of work sharing one GPU or instance, each process holding its share of it.
    Shares of time add up, to at most 1."""
    busy = tensor = dram = receive = 0.0
    for process, share in shares:
        busy += share
        tensor += share * process.tensor_intensity
        dram += min(share * process.memory_intensity, 1.0)
        starved = process.pattern == "input_starved"
        receive += share * (_PCIE_RX_PER_SHARE_STARVED if starved else _PCIE_RX_PER_SHARE)
    plain = busy - tensor
    return [
        min(busy * 0.92, 1.0),  # SMs busy: kernels leave some SMs idle at their tails
        min(busy * 0.45, 1.0),  # resident warps vs. the maximum
        min(tensor, 1.0),
        min(dram, 1.0),
        min(plain * 0.02, 1.0),
        min(plain * 0.55, 1.0),
        min(plain * 0.15, 1.0),
        min(busy, 1.0),  # some engine active at all
        receive * 0.25,  # results and checkpoints go back to the host
        receive,
        tensor * _NVLINK_PER_TENSOR_SHARE,
        tensor * _NVLINK_PER_TENSOR_SHARE,
    ]


def mig_uuid(seed: int, gpu: int, position: int, profile: str) -> str:
    """A stable MIG device UUID for the instance in `position` of a GPU's layout."""
    digest = zlib.crc32(f"{seed}/{gpu}/{position}/{profile}".encode())
    tail = (seed * 7919 + gpu * 104729 + position * 131) & 0xFFFF
    return f"MIG-{digest:08x}-{gpu:04x}-4{position:03x}-9{tail & 0xFFF:03x}-{digest ^ tail:012x}"
