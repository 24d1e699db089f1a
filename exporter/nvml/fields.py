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
from operator import mul
from typing import TYPE_CHECKING, Any, Final

import pynvml

from exporter.nvml.reads import FieldRequest, FieldSlot
from exporter.readings.convert import Times, number
from exporter.readings.declare import link_series
from exporter.structs import plain_layout

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, Reads
    from exporter.readings.declare import Convert, Reading
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


_CODES: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "d",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "Q" if struct.calcsize("@L") == 8 else "I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "Q",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "q",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "i",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "H",
}
"""nvmlValueType_t -> its `struct` code (native byte order, the C type's size)."""
_NUMBERS: Final = {value_type: struct.Struct("=" + code) for value_type, code in _CODES.items()}
"""nvmlValueType_t -> how the number lies in the nvmlValue_t union's bytes."""


def _answer_layout(number: str | None = None) -> str:
    """One nvmlFieldValue_t as `struct` reads it: its value type, return code and the union's
    bytes (or, given a `struct` code, the number the union holds as that type), the rest
    skipped; the offsets are ctypes' own, so pynvml's layout is followed."""
    answer = pynvml.c_nvmlFieldValue_t
    value_type, code, value = answer.valueType, answer.nvmlReturn, answer.value
    if not (value_type.size == code.size == 4 and code.offset == value_type.offset + 4):
        raise RuntimeError("nvmlFieldValue_t: unexpected layout of valueType and nvmlReturn")
    union = value.size
    tail = ctypes.sizeof(answer) - value.offset - union
    read = f"{union}s" if number is None else f"{number}{union - struct.calcsize('=' + number)}x"
    return f"{value_type.offset}xII{value.offset - code.offset - 4}x{read}{tail}x"


_ANSWER_LAYOUT: Final = _answer_layout()
_TYPED_LAYOUTS: Final = {value_type: _answer_layout(code) for value_type, code in _CODES.items()}


@functools.lru_cache(maxsize=32)
def _answers_layout(count: int) -> struct.Struct:
    """`count` answers read in one call: (value type, return code, value bytes) for each."""
    return struct.Struct("=" + _ANSWER_LAYOUT * count)


@functools.lru_cache(maxsize=32)
def _typed_answers(types: tuple[int, ...]) -> struct.Struct | None:
    """Answers of these value types read in one call: (value type, return code, number) for
    each; None where a type is not one `struct` reads."""
    if any(value_type not in _TYPED_LAYOUTS for value_type in types):
        return None
    return struct.Struct("=" + "".join(_TYPED_LAYOUTS[value_type] for value_type in types))


def _factor(outputs: tuple[tuple[Series, Convert], ...]) -> float | None:
    """The factor of a field's one output when it is a multiplication, else None."""
    if len(outputs) != 1:
        return None
    convert = outputs[0][1]
    if convert is number:
        return 1.0  # float() of a number the driver gives is that number times 1.0
    return convert.factor if isinstance(convert, Times) else None


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
    factors = [factor for slot in slots if (factor := _factor(slot.outputs)) is not None]
    if len(factors) == len(slots):
        series = tuple(slot.outputs[0][0] for slot in slots)
        return FieldRequest(tuple(ids), tuple(slots), tuple(collectors), series, tuple(factors))
    return FieldRequest(tuple(ids), tuple(slots), tuple(collectors), (), None)


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
    known = device.field_layout
    if known is not None and known[0] is asked and asked.factors is not None:
        # A GPU answers each field in the same value type every cycle: read as the types it
        # last answered in, every number comes out of one C call and, when every answer is a
        # success in those types, all of them are converted in one more.
        _, types, typed = known
        flat = typed.unpack_from(values)
        if flat[0::3] == types and not any(flat[1::3]):
            return dict(zip(asked.series, map(mul, flat[2::3], asked.factors), strict=True))
    refused = False
    numbers = _NUMBERS
    # Every answer's type, code and bytes in one C call: reading them field by field through
    # ctypes costs several times more, forty fields a GPU (NVLink's per link) every cycle.
    flat = _answers_layout(len(asked.slots)).unpack_from(values)
    if asked.factors is not None and not any(flat[1::3]):
        types = flat[0::3]
        typed_layout = _typed_answers(types)
        device.field_layout = (asked, types, typed_layout) if typed_layout is not None else None
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
