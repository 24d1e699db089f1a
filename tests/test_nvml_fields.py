"""A GPU's field values read in one call: once every answer has succeeded, the next cycles read
all the numbers as the value types they came in and convert them at once. An answer that fails
or comes in another type on a later cycle must still be read one by one, as the first was."""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from exporter.logs import LogOnce
from exporter.model import GpuIdentity
from exporter.nvml.device import GPU_COLLECTORS
from exporter.nvml.fields import read_fields, request
from exporter.nvml.reads import Counter, Device, Reads
from exporter.nvml.sampler import NvmlSampler
from exporter.readings import FIELD_READINGS
from exporter.readings.declare import link_series
from exporter.readings.device import MEMORY_TEMPERATURE
from exporter.readings.nvlink import NVLINK_TRANSMIT_TOTAL
from exporter.simulator import SimulatedNvml, default_fleet
from tests.helpers import ManualClock

pytestmark = pytest.mark.timeout(30)

UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE


class Answers:
    """nvmlDeviceGetFieldValues answering what `answers` holds now: per field asked, its value
    type, return code and number."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, int, float]] = []

    def nvmlDeviceGetFieldValues(self, _handle: object, asked: list[Any]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(asked))()
        for value, (field, scope), (value_type, code, number) in zip(
            values, asked, self.answers, strict=True
        ):
            value.fieldId, value.scopeId = field, scope
            value.valueType, value.nvmlReturn = value_type, code
            if value_type == DOUBLE:
                value.value.dVal = number
            elif value_type == UINT:
                value.value.uiVal = int(number)
            else:
                value.value.ullVal = int(number)
        return values


def test_an_answer_that_fails_or_changes_type_after_all_succeeded_is_read_alone() -> None:
    driver = Answers()
    device = Device(handle=object(), identity=GpuIdentity(0, "GPU-0", "H100"), links=(0, 1))
    reads = Reads(LogOnce(logging.getLogger("test")), Counter())
    asked = request(FIELD_READINGS.values(), device)  # memory temperature, then per link
    assert asked.factors is not None, "memory temperature and NVLink bytes are multiplications"
    link0, link1 = (link_series(NVLINK_TRANSMIT_TOTAL, link) for link in (0, 1))

    def cycle(*answers: tuple[int, int, float]) -> dict[Any, float]:
        """Memory temperature and each link's transmitted KiB as given, nothing received."""
        driver.answers = [*answers, (ULL, 0, 0), (ULL, 0, 0)]
        device.tally.clear()
        return read_fields(driver, reads, device, asked)  # type: ignore[arg-type]

    first = cycle((UINT, 0, 70), (ULL, 0, 3), (ULL, 0, 4))
    assert first[MEMORY_TEMPERATURE] == 70.0
    assert (first[link0], first[link1]) == (3 * 1024.0, 4 * 1024.0)
    assert device.field_layout is not None, "every answer succeeded: their types are kept"

    same = cycle((UINT, 0, 71), (ULL, 0, 5), (ULL, 0, 6))
    assert same == {**first, MEMORY_TEMPERATURE: 71.0, link0: 5 * 1024.0, link1: 6 * 1024.0}

    failing = cycle((UINT, 0, 72), (ULL, pynvml.NVML_ERROR_UNKNOWN, 0), (ULL, 0, 8))
    assert link0 not in failing, "an answer that failed is no value"
    assert (failing[MEMORY_TEMPERATURE], failing[link1]) == (72.0, 8 * 1024.0)
    assert device.tally.failed == {"nvlink"}

    retyped = cycle((DOUBLE, 0, 73.5), (ULL, 0, 9), (ULL, 0, 10))
    assert retyped[MEMORY_TEMPERATURE] == 73.5, "a double read as an unsigned int is garbage"
    assert retyped[link0] == 9 * 1024.0


@pytest.mark.parametrize(("nvlink", "calls"), [(False, [0, 5]), (True, [0, 1, 2, 3, 4, 5])])
def test_the_field_value_call_is_on_the_health_clock_unless_a_field_is_read_every_cycle(
    *, nvlink: bool, calls: list[int]
) -> None:
    """Memory temperature is read every 5 s, so the call carrying it is too: unless the NVLink
    collector's traffic counters, read every cycle, come in the same call. Between two calls the
    last temperature stands."""
    clock = ManualClock()
    driver = SimulatedNvml(default_fleet(1), clock=clock)
    made: list[int] = []
    real = driver.nvmlDeviceGetFieldValues

    def counted(handle: Any, asked: list[Any]) -> Any:
        if (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0) in asked:  # not the throttle counters' call
            made.append(int(clock()))
        return real(handle, asked)

    driver.nvmlDeviceGetFieldValues = counted  # type: ignore[method-assign]
    collectors = [*GPU_COLLECTORS] if nvlink else [c for c in GPU_COLLECTORS if c != "nvlink"]
    sampler = NvmlSampler(driver, collectors=collectors, read_processes=False, clock=clock)
    sampler.start()
    try:
        temperatures = []
        for _ in range(6):
            (gpu,), _ = sampler.sample()
            temperatures.append(gpu.values[MEMORY_TEMPERATURE])
            clock.advance(1.0)
    finally:
        sampler.close()
    assert made == calls
    if not nvlink:
        assert temperatures[:5] == [temperatures[0]] * 5, "the last reading stands in between"
