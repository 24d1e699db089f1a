"""What the declarations' simulated answers read: a simulated GPU (`SimulatedGpu`, which
`exporter.simulator` implements), and what several groups' answers share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

import pynvml

if TYPE_CHECKING:
    from exporter.catalog import GpuModel

_MIG_ARCHITECTURES: Final = frozenset({"ampere", "hopper", "blackwell"})


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


class SimulatedGpu(Protocol):
    """What a simulated GPU offers the declarations' `simulated` answers."""

    @property
    def model(self) -> GpuModel: ...
    @property
    def utilization(self) -> float: ...
    @property
    def memory_utilization(self) -> float: ...
    @property
    def power_watts(self) -> float: ...
    @property
    def temperature(self) -> float: ...
    @property
    def energy_millijoules(self) -> float: ...
    @property
    def ecc_corrected(self) -> int: ...
    @property
    def ecc_uncorrected(self) -> int: ...
    @property
    def mig_configured(self) -> bool:
        """MIG mode is on (the fleet gives the GPU a MIG layout)."""

    @property
    def mig_active(self) -> bool:
        """MIG instances exist right now."""

    @property
    def working(self) -> bool:
        """Some process runs on it now."""

    @property
    def nvlink_links(self) -> int:
        """Active NVLink links (0: a card without NVLink)."""

    @property
    def nvlink_bytes(self) -> tuple[float, float]:
        """Bytes sent and received over all its NVLink links since the driver loaded."""

    def clock_mhz(self, kind: str) -> int: ...
    def clock_events(self) -> int: ...
    def memory(self, position: int | None) -> tuple[int, int, int]:
        """(total, reserved, used) bytes of the GPU, or of its MIG instance in `position`."""


def mig_capable(gpu: SimulatedGpu) -> bool:
    """An Ampere or newer data-center GPU with MIG profiles (MIG mode, HBM row remapping)."""
    model = gpu.model
    return model.architecture in _MIG_ARCHITECTURES and bool(model.mig_profiles)
