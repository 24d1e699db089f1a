"""Time the clocks were held down, per reason: NVML's nanosecond violation counters.

The counters are field values, all read in one call; where a driver lacks a field, the
deprecated per-policy violation status stands in for that reason. Cumulative and slow to
change, they are read every `HEALTH_PERIOD_SECONDS` like the other health readings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.readings import THROTTLE, THROTTLE_REASONS
from exporter.structs import plain_layout

if TYPE_CHECKING:
    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, Reads
    from exporter.series import Series

COLLECTOR: Final = "health"
_FIELDS: Final = [field_id for _, _, field_id in THROTTLE_REASONS]

_VALUE_MEMBERS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
"""nvmlValueType_t -> the member of the nvmlValue_t union that holds the number."""


def read_throttle(nvml: NvmlDriver, reads: Reads, device: Device) -> dict[Series, float]:
    """Cumulative seconds per throttle reason the GPU gives."""
    handle = device.handle
    fields: dict[int, float] = {}
    values = reads.call(
        device, "throttle_fields", COLLECTOR, nvml.nvmlDeviceGetFieldValues, handle, _FIELDS
    )
    if values is not None:  # read through a plain view: pynvml's struct attributes are slow
        values = (plain_layout(pynvml.c_nvmlFieldValue_t) * len(values)).from_buffer(values)
    for value in values if values is not None else ():
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


def field_number(value: Any) -> float | None:
    """The number in an nvmlFieldValue_t, read by its value type."""
    member = _VALUE_MEMBERS.get(value.valueType)
    return float(getattr(value.value, member)) if member is not None else None
