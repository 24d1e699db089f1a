"""Time the clocks were held down, per reason: NVML's nanosecond violation counters.

The counters are field values, all read in one call; where a driver lacks a field, the
deprecated per-policy violation status stands in for that reason. Cumulative and slow to
change, they are read every `HEALTH_PERIOD_SECONDS` like the other health readings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pynvml

from exporter.nvml.fields import answers, field_number
from exporter.readings.health import THROTTLE, THROTTLE_REASONS

if TYPE_CHECKING:
    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, Reads
    from exporter.series import Series

COLLECTOR: Final = "health"
_FIELDS: Final = [field_id for _, _, field_id in THROTTLE_REASONS]


def read_throttle(nvml: NvmlDriver, reads: Reads, device: Device) -> dict[Series, float]:
    """Cumulative seconds per throttle reason the GPU gives."""
    handle = device.handle
    fields: dict[int, float] = {}
    values = reads.call(
        device, "throttle_fields", COLLECTOR, nvml.nvmlDeviceGetFieldValues, handle, _FIELDS
    )
    for value in answers(values) if values is not None else ():
        if value.nvmlReturn == pynvml.NVML_SUCCESS:
            number = field_number(value)
            if number is not None:
                fields[int(value.fieldId)] = number
    found: dict[Series, float] = {}
    for reason, policy, field_id in THROTTLE_REASONS:
        if field_id in fields:
            found[THROTTLE[reason]] = fields[field_id] / 1e9
            continue
        status = reads.call(
            device,
            f"throttle_{reason}",
            COLLECTOR,
            nvml.nvmlDeviceGetViolationStatus,
            handle,
            policy,
        )
        if status is not None:
            found[THROTTLE[reason]] = status.violationTime / 1e9
    return found
