"""The `mig` collector's reading: whether MIG mode is on (its instances are enumerated by
`exporter.nvml.mig`, and read with the `mig` readings of the other groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.readings.convert import item
from exporter.readings.declare import HEALTH_PERIOD_SECONDS, family, plain
from exporter.readings.simulated import mig_capable, not_supported

if TYPE_CHECKING:
    from exporter.readings.simulated import SimulatedGpu


def _simulated_mig_mode(gpu: SimulatedGpu) -> list[int]:
    if not mig_capable(gpu):
        raise not_supported()
    mode = int(gpu.mig_configured)
    return [mode, mode]  # (current, pending)


MIG_MODE: Final = plain(
    "mig_mode",
    "nvmlDeviceGetMigMode",
    family(
        "gpu_mig_mode_enabled",
        "1 if MIG mode is on for this physical GPU.",
        doc="1 if MIG mode is on (physical GPUs that support MIG)",
        collector="mig",
    ),
    item(0),
    since="ampere",
    # Changed by an administrator (`nvidia-smi -mig`), on most GPUs with a reset: until the next
    # reading a GPU's instances are looked for as they were.
    period=HEALTH_PERIOD_SECONDS,
    simulated=_simulated_mig_mode,
)
