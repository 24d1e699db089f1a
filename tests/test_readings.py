"""The readings' declarations: one declaration per reading, each call answered from its own.

Two readings of one driver function with the same arguments, or of one field, would have the
simulator answer both from whichever came last (and read the same thing twice): the register
refuses the second where it is declared. The other checks keep a declaration from shadowing
another without a word.
"""

from __future__ import annotations

from typing import Final

import pynvml
import pytest

from exporter.readings import FIELD_READINGS, SIMULATED_CALLS, all_readings, declare
from exporter.readings.declare import Declarations, Output, Reading
from exporter.series import Family, Series
from exporter.simulator import SimulatedNvml, default_fleet
from exporter.simulator import driver as simulator_driver
from tests.helpers import ManualClock

pytestmark = pytest.mark.timeout(30)

TEMPERATURE: Final = Family("gpu_test_celsius", "A test temperature.", collector="device")
SENSORS: Final = Family(
    "gpu_test_sensor_celsius", "A test.", labels=("sensor",), collector="device"
)


def declarations() -> Declarations:
    declared = Declarations()
    declared.family(TEMPERATURE)
    declared.family(SENSORS)
    return declared


def temperature(name: str, *args: object, simulated: object = None) -> Reading:
    return Reading(
        name,
        "nvmlDeviceGetTemperature",
        (Output(Series(TEMPERATURE), float),),
        args=args,
        simulated=(lambda _gpu: simulated) if simulated is not None else None,
    )


def test_every_declared_call_is_answered_from_its_own_declaration() -> None:
    for reading in all_readings():
        if reading.field is None:
            assert SIMULATED_CALLS[reading.call][reading.args] is reading, reading.name
        else:
            assert FIELD_READINGS[reading.field] is reading, reading.name
    ecc = SIMULATED_CALLS["nvmlDeviceGetTotalEccErrors"]
    assert len({reading.name for reading in ecc.values()}) == 4, "four readings, four answers"


def test_two_readings_of_one_call_and_arguments_are_refused() -> None:
    declared = declarations()
    declared.reading(temperature("core", 0, simulated=40))
    declared.reading(temperature("memory", 1, simulated=50))  # other arguments: its own answer
    with pytest.raises(
        ValueError, match=r"'hot': nvmlDeviceGetTemperature\(0\) is already read by 'core'"
    ):
        declared.reading(temperature("hot", 0, simulated=90))
    assert declared.calls["nvmlDeviceGetTemperature"][(0,)].name == "core"


def test_a_fallback_is_checked_like_any_reading() -> None:
    declared = declarations()
    declared.reading(temperature("core", 0))
    newer = Reading(
        "core_v2",
        "nvmlDeviceGetTemperatureV",
        (Output(Series(TEMPERATURE), float),),
        fallback=temperature("core_v1", 0),
    )
    with pytest.raises(ValueError, match=r"'core_v1': .* is already read by 'core'"):
        declared.reading(newer)
    assert "core_v2" not in {reading.name for reading in declared.readings}, "nothing half-added"
    itself = Reading(
        "hot_v2",
        "nvmlDeviceGetTemperature",
        (Output(Series(TEMPERATURE), float),),
        args=(9,),
        fallback=temperature("hot_v1", 9),
    )
    with pytest.raises(ValueError, match=r"'hot_v1': .*\(9\) is already read by 'hot_v2'"):
        declared.reading(itself)


def test_a_field_read_twice_is_refused() -> None:
    declared = declarations()
    field = pynvml.NVML_FI_DEV_MEMORY_TEMP
    made = (Output(Series(TEMPERATURE), float),)
    declared.reading(Reading("memory", "nvmlDeviceGetFieldValues", made, field=field))
    with pytest.raises(ValueError, match=f"'again': field {field} is already read by 'memory'"):
        declared.reading(Reading("again", "nvmlDeviceGetFieldValues", made, field=field))


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        (temperature("core", 1), "reading 'core' is declared twice"),
        (
            Reading("fans", "nvmlDeviceGetTemperature", (), args=(7,), per="fan"),
            "read per fan here and per GPU by 'core'",
        ),
        (
            Reading(
                "other",
                "nvmlDeviceGetPowerUsage",
                (Output(Series(Family("gpu_other", "Undeclared.")), float),),
            ),
            "family gpu_other is not declared",
        ),
    ],
)
def test_a_declaration_that_would_shadow_another_is_refused(second: Reading, problem: str) -> None:
    declared = declarations()
    declared.reading(temperature("core", 0))
    with pytest.raises(ValueError, match=problem):
        declared.reading(second)


def test_a_family_is_declared_once() -> None:
    declared = declarations()
    with pytest.raises(ValueError, match="family gpu_test_celsius is declared twice"):
        declared.family(Family("gpu_test_celsius", "Again.", collector="device"))


def test_the_simulator_answers_each_arguments_from_their_declaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = declarations()
    declared.reading(temperature("core", 0, simulated=40))
    declared.reading(temperature("memory", 1, simulated=50))
    monkeypatch.setattr(simulator_driver, "SIMULATED_CALLS", declared.calls)
    nvml = SimulatedNvml(default_fleet(1), clock=ManualClock())
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetTemperature(handle, 0) == 40
    assert nvml.nvmlDeviceGetTemperature(handle, 1) == 50
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTemperature(handle, 2)  # no declaration names it: the driver refuses
    with pytest.raises(AttributeError):
        nvml.nvmlDeviceGetPowerUsage  # noqa: B018 - not declared here: not offered


def test_a_plain_reading_fills_one_series_and_a_reading_one_collector() -> None:
    with pytest.raises(ValueError, match="gpu_test_sensor_celsius has labels"):
        declare.plain("sensors", "nvmlDeviceGetTemperature", SENSORS, float)
    health = Series(Family("gpu_test_errors", "A test.", collector="health"))
    with pytest.raises(ValueError, match=r"collectors \['device', 'health'\]"):
        declare.reading(
            "mixed",
            "nvmlDeviceGetTemperature",
            (Output(Series(TEMPERATURE), float), Output(health, float)),
        )
