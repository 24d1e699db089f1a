"""Field values: every field-value reading of a GPU in one `nvmlDeviceGetFieldValues` call.

A field reading (`Reading.field`) names an `NVML_FI_DEV_*` id; a per-link one is asked once per
NVLink link that was active when NVML initialised, the link as the field's `scopeId`. A GPU's
request is made once and kept on its `Device`. Each answer carries its own return code: a field
the GPU lacks (NotSupported) drops only its series and the request is made again without it;
another error costs that value for the cycle, as a failed call would.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.nvml.reads import FieldRequest, FieldSlot
from exporter.readings.declare import link_series
from exporter.structs import plain_layout

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, Reads
    from exporter.readings.declare import Reading
    from exporter.series import Series

CALL: Final = "field_values"
"""The call's own name in logs and bookkeeping (a driver without the function)."""

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


_NUMBERS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("@d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("@I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("@L"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("@Q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("@q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("@i"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("@H"),
}
"""nvmlValueType_t -> how the number lies in the nvmlValue_t union's bytes."""


def _answer_layout() -> str:
    """One nvmlFieldValue_t as `struct` reads it: its value type, return code and the union's
    bytes, the rest skipped; the offsets are ctypes' own, so pynvml's layout is followed."""
    answer = pynvml.c_nvmlFieldValue_t
    value_type, code, value = answer.valueType, answer.nvmlReturn, answer.value
    if not (value_type.size == code.size == 4 and code.offset == value_type.offset + 4):
        raise RuntimeError("nvmlFieldValue_t: unexpected layout of valueType and nvmlReturn")
    union = value.size
    tail = ctypes.sizeof(answer) - value.offset - union
    return f"{value_type.offset}xII{value.offset - code.offset - 4}x{union}s{tail}x"


_ANSWER_LAYOUT: Final = _answer_layout()


@functools.lru_cache(maxsize=32)
def _answers_layout(count: int) -> struct.Struct:
    """`count` answers read in one call: (value type, return code, value bytes) for each."""
    return struct.Struct("=" + _ANSWER_LAYOUT * count)


def field_number(value: Any) -> float | None:
    """The number in an nvmlFieldValue_t, read by its value type."""
    member = _VALUE_MEMBERS.get(value.valueType)
    return float(getattr(value.value, member)) if member is not None else None


def answers(values: Any) -> Any:
    """The driver's answers through a plain view: pynvml's struct attributes are slow."""
    return (plain_layout(pynvml.c_nvmlFieldValue_t) * len(values)).from_buffer(values)


def request(readings: Iterable[Reading], device: Device) -> FieldRequest:
    """The fields of these readings this GPU has not refused, one per link where per-link."""
    ids: list[tuple[int, int]] = []
    slots: list[FieldSlot] = []
    collectors: dict[str, None] = {}
    unavailable = device.unavailable
    for reading in readings:
        field = reading.field
        if field is None or reading.name in unavailable:
            continue
        targets: list[tuple[str, int | None]] = (
            [(f"{reading.name}{link}", link) for link in device.links]
            if reading.per == "link"
            else [(reading.name, None)]
        )
        for what, link in targets:
            if what in unavailable:
                continue
            outputs = tuple(
                (output.series if link is None else link_series(output.series, link), output.value)
                for output in reading.outputs
            )
            ids.append((field, link or 0))
            slots.append(FieldSlot(what, reading, outputs))
            collectors[reading.collector] = None
    return FieldRequest(tuple(ids), tuple(slots), tuple(collectors))


def read_fields(
    nvml: NvmlDriver, reads: Reads, device: Device, asked: FieldRequest
) -> dict[Series, float]:
    """One call for every field of the request; a field that answers NotSupported leaves it
    (`device.fields` is made again on the next cycle)."""
    found: dict[Series, float] = {}
    if not asked.ids:
        return found
    values = reads.call(
        device, CALL, asked.collectors[0], nvml.nvmlDeviceGetFieldValues, device.handle, asked.ids
    )
    if values is None:
        if CALL not in device.unavailable:
            device.tally.failed.update(asked.collectors)
        return found
    refused = False
    numbers = _NUMBERS
    # Every answer's type, code and bytes in one C call: reading them field by field through
    # ctypes costs several times more, forty fields a GPU (NVLink's per link) every cycle.
    flat = _answers_layout(len(asked.slots)).unpack_from(values)
    for slot, value_type, code, raw in zip(
        asked.slots, flat[0::3], flat[1::3], flat[2::3], strict=True
    ):
        if code:  # not NVML_SUCCESS
            reading = slot.reading
            error = pynvml.NVMLError(code)
            reads.failed(device, slot.what, reading.collector, error, log_as=reading.name)
            refused = refused or slot.what in device.unavailable
            continue
        layout = numbers.get(value_type)
        if layout is None:
            reading = slot.reading
            unknown = ValueError(f"field {reading.field}: unknown value type {value_type}")
            reads.failed(device, slot.what, reading.collector, unknown, log_as=reading.name)
            continue
        number = float(layout.unpack_from(raw)[0])
        for series, convert in slot.outputs:
            converted = convert(number)
            if converted is not None:
                found[series] = converted
    if refused:
        device.fields = None
    return found
