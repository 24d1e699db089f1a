"""The `pcie` collector's readings: the link's generation and width, now and at most; and its
throughput, which GPM (Hopper and newer) or the GPU's worker (a 20 ms window) measures."""

from __future__ import annotations

from typing import Final

from exporter.readings.convert import number
from exporter.readings.declare import HEALTH_PERIOD_SECONDS, family, plain
from exporter.series import Series

_PCIE_GENERATIONS: Final = {
    "kepler": 3,
    "maxwell": 3,
    "pascal": 3,
    "volta": 3,
    "turing": 3,
    "ampere": 4,
    "ada": 4,
    "hopper": 5,
    "blackwell": 5,
}
"""The PCIe generation of each architecture's boards, for the simulator."""

PCIE_GENERATION: Final = plain(
    "pcie_generation",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    family(
        "gpu_pcie_link_generation",
        "PCIe generation the link runs at now (an idle GPU drops it to save power).",
        doc="PCIe generation the link runs at now (an idle GPU drops it to save power)",
        collector="pcie",
    ),
    number,
    period=HEALTH_PERIOD_SECONDS,
    # an idle GPU trains its link down to save power
    simulated=lambda gpu: _PCIE_GENERATIONS[gpu.model.architecture] if gpu.working else 1,
)
PCIE_MAX_GENERATION: Final = plain(
    "pcie_max_generation",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    family(
        "gpu_pcie_link_max_generation",
        "Highest PCIe generation the GPU and its slot support together.",
        collector="pcie",
    ),
    number,
    once=True,
    simulated=lambda gpu: _PCIE_GENERATIONS[gpu.model.architecture],
)
PCIE_WIDTH: Final = plain(
    "pcie_width",
    "nvmlDeviceGetCurrPcieLinkWidth",
    family("gpu_pcie_link_width", "PCIe lanes the link uses now.", collector="pcie"),
    number,
    period=HEALTH_PERIOD_SECONDS,
    simulated=lambda _gpu: 16,
)
PCIE_MAX_WIDTH: Final = plain(
    "pcie_max_width",
    "nvmlDeviceGetMaxPcieLinkWidth",
    family(
        "gpu_pcie_link_max_width",
        "Most PCIe lanes the GPU and its slot support together.",
        doc="most PCIe lanes the GPU and its slot support together (a x16 GPU trained narrower "
        "says so in `gpu_pcie_link_width`)",
        collector="pcie",
    ),
    number,
    once=True,
    simulated=lambda _gpu: 16,
)

PCIE_TRANSMIT: Final = Series(
    family(
        "gpu_pcie_transmit_bytes_per_second",
        "PCIe traffic from the GPU to the host (GPM, or a 20 ms window before Hopper).",
        doc="PCIe traffic from the GPU (GPM; before Hopper a 20 ms window, read by the GPU's "
        "thread after each reading)",
        collector="pcie",
    )
)
PCIE_RECEIVE: Final = Series(
    family(
        "gpu_pcie_receive_bytes_per_second",
        "PCIe traffic from the host to the GPU (GPM, or a 20 ms window before Hopper).",
        doc="PCIe traffic to the GPU (same sources)",
        collector="pcie",
    )
)
