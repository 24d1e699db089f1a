"""Snapshot -> metric families: pure, tested on plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pynvml
import pytest

from exporter.metrics.families import ALL_FAMILIES, BuildInfo, snapshot_families
from exporter.metrics.gpu import WRITTEN_FIRST, in_exposition_order
from exporter.model import CollectorStatus, GpuIdentity, GpuSample, ProcessSample, Snapshot
from exporter.readings import READINGS, VALUE_FAMILIES, all_readings
from exporter.readings.clocks import CLOCKS
from exporter.readings.declare import Output, Reading, link_series
from exporter.readings.device import (
    BUSY,
    COMPUTE_MODE,
    ENERGY,
    POWER,
    TEMPERATURE,
    UTILIZATION,
    fan_series,
)
from exporter.readings.events import xid_series
from exporter.readings.health import ECC_CORRECTED
from exporter.readings.nvlink import NVLINK_ERRORS, NVLINK_TRANSMIT_TOTAL
from exporter.series import Family

if TYPE_CHECKING:
    from prometheus_client.core import Metric

IDENTITY = GpuIdentity(0, "GPU-aaaa", "NVIDIA L4", "00000000:01:00.0", "570.1", "12.8")
BUILD = BuildInfo(version="1.2.3", python_version="3.11.7")


def families(*gpus: GpuSample, collectors: tuple[CollectorStatus, ...] = ()) -> dict[str, Metric]:
    snapshot = Snapshot(
        timestamp=1000.0, gpus=gpus, collectors=collectors, cycles_total=7, overruns_total=1
    )
    return {family.name: family for family in snapshot_families(snapshot, BUILD)}


def values(family: Metric) -> list[tuple[dict[str, str], float]]:
    return [(dict(sample.labels), sample.value) for sample in family.samples]


def test_every_gpu_series_carries_gpu_uuid_and_model() -> None:
    sample = GpuSample(
        IDENTITY,
        up=True,
        values={
            UTILIZATION: 0.5,
            BUSY: 12.0,
            CLOCKS["sm"]: 1e9,
            fan_series(0): 0.4,
            ECC_CORRECTED: 1,
        },
        processes=(ProcessSample(10, 2**30, 0.5, 0.1),),
    )
    for name, family in families(sample).items():
        if name.startswith("gpuscope_"):
            continue
        for labels, _ in values(family):
            assert {"gpu", "uuid", "model"} <= set(labels), name


def test_absent_not_zero_for_values_a_gpu_cannot_give() -> None:
    found = families(GpuSample(IDENTITY, up=True, values={UTILIZATION: 0.25}))
    assert values(found["gpu_utilization_ratio"])[0][1] == 0.25
    for name in (
        "gpu_power_watts",
        "gpu_temperature_celsius",
        "gpu_clock_hertz",
        "gpu_ecc_errors",
        "gpu_processes",
    ):
        assert values(found[name]) == [], name


def test_down_gpu_exports_only_identity_up_and_its_xids() -> None:
    down = GpuSample(
        IDENTITY,
        up=False,
        down_reason="lost",
        values={UTILIZATION: 0.9, POWER: 100.0, xid_series(79): 1},
    )
    found = families(down)
    assert values(found["gpu_up"]) == [({"gpu": "0", "uuid": "GPU-aaaa", "model": "NVIDIA L4"}, 0)]
    assert values(found["gpu_down_reason"])[0][0]["reason"] == "lost"
    assert len(values(found["gpu_info"])) == 1
    assert values(found["gpu_utilization_ratio"]) == []
    assert values(found["gpu_power_watts"]) == []
    assert values(found["gpu_xid_errors"])[0][0]["xid"] == "79", "XIDs stay while it is down"


def test_info_labels() -> None:
    ((labels, one),) = values(families(GpuSample(IDENTITY, up=True))["gpu_info"])
    assert one == 1
    assert labels == {
        "gpu": "0",
        "uuid": "GPU-aaaa",
        "model": "NVIDIA L4",
        "pci_bus_id": "00000000:01:00.0",
        "driver_version": "570.1",
        "cuda_version": "12.8",
    }


def test_clock_event_bits_become_one_series_per_reason() -> None:
    (reading,) = [r for r in READINGS if r.name == "clock_events"]
    converted = {o.series.labels[0][1]: o.value(0x4 | 0x40) for o in reading.outputs}
    assert converted["sw_power_cap"] == 1
    assert converted["hw_thermal_slowdown"] == 1
    assert converted["gpu_idle"] == 0
    assert len(converted) == 9


def test_units_are_base_units() -> None:
    found = families(
        GpuSample(
            IDENTITY,
            up=True,
            values={POWER: 250.5, ENERGY: 9.5, CLOCKS["sm"]: 1.41e9, TEMPERATURE: 40},
        )
    )
    assert values(found["gpu_power_watts"])[0][1] == 250.5
    assert values(found["gpu_energy_joules"])[0][1] == 9.5
    assert values(found["gpu_clock_hertz"])[0][1] == 1.41e9
    assert found["gpu_energy_joules"].type == "counter"


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("power", 412_500, 412.5),
        ("energy", 123_456_789, 123_456.789),
        ("sm_clock", 1755, 1.755e9),
        ("fan", 55, 0.55),
        ("power_limit_default", 650_000, 650.0),
        ("memory_temperature", 61.0, 61.0),
        ("encoder", [37, 167_000], 0.37),  # (percent, sampling period in µs)
        ("decoder", [5, 167_000], 0.05),
        ("pcie_generation", 4, 4.0),
        ("pcie_max_width", 16, 16.0),
        ("ecc_aggregate_corrected", 42, 42.0),
        ("nvlink_replay_errors", 3, 3.0),
        ("nvlink_transmit", 2_000, 2_048_000.0),  # KiB
        ("nvlink_receive", 1, 1024.0),
    ],
)
def test_readings_convert_the_drivers_units_to_base_units(
    name: str, raw: float, expected: float
) -> None:
    reading = next(r for r in all_readings() if r.name == name)
    assert reading.outputs[0].value(raw) == pytest.approx(expected)


def test_power_limit_constraints_are_min_and_max_in_watts() -> None:
    reading = next(r for r in all_readings() if r.name == "power_limits")
    assert [output.value([200_000, 700_000]) for output in reading.outputs] == [200.0, 700.0]


def test_memory_free_comes_with_the_memory_reading() -> None:
    reading = next(r for r in all_readings() if r.name == "memory_v2")
    struct = pynvml.c_nvmlMemory_v2_t(total=80, reserved=5, free=60, used=15)
    free = next(o for o in reading.outputs if o.series.family.name == "gpu_memory_free_bytes")
    assert free.value(struct) == 60


@pytest.mark.parametrize(
    ("mode", "name"),
    [
        (pynvml.NVML_COMPUTEMODE_DEFAULT, "default"),
        (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "exclusive_process"),
        (pynvml.NVML_COMPUTEMODE_PROHIBITED, "prohibited"),
    ],
)
def test_compute_mode_is_one_info_series(mode: int, name: str) -> None:
    reading = next(r for r in all_readings() if r.name == "compute_mode")
    converted = {o.series: o.value(mode) for o in reading.outputs}
    assert {series for series, value in converted.items() if value is not None} == {
        COMPUTE_MODE[name]
    }
    assert converted[COMPUTE_MODE[name]] == 1


def test_persistence_mode_is_enabled_or_not() -> None:
    reading = next(r for r in all_readings() if r.name == "persistence_mode")
    assert reading.outputs[0].value(pynvml.NVML_FEATURE_ENABLED) == 1
    assert reading.outputs[0].value(pynvml.NVML_FEATURE_DISABLED) == 0


def test_per_link_series_carry_the_link_and_keep_their_own_labels() -> None:
    flit = link_series(NVLINK_ERRORS["crc_flit"], 3)
    assert flit is link_series(NVLINK_ERRORS["crc_flit"], 3), "made once: compared by identity"
    sent = link_series(NVLINK_TRANSMIT_TOTAL, 17)
    found = families(GpuSample(IDENTITY, up=True, values={flit: 2, sent: 4096.0}))
    ((labels, value),) = values(found["gpu_nvlink_errors"])
    assert (labels["link"], labels["type"], value) == ("3", "crc_flit", 2)
    assert found["gpu_nvlink_errors"].type == "counter"
    ((labels, value),) = values(found["gpu_nvlink_transmit_bytes"])
    assert (labels["link"], value) == ("17", 4096.0)


def test_declarations_say_how_they_are_read() -> None:
    template = Output(NVLINK_TRANSMIT_TOTAL, float)
    with pytest.raises(ValueError, match="per 'lane'"):
        Reading("x", "nvmlDeviceGetNvLinkState", (template,), per="lane")
    with pytest.raises(ValueError, match="field value"):
        Reading("x", "nvmlDeviceGetFieldValues", (template,), field=82, once=True)
    with pytest.raises(ValueError, match="field value"):
        Reading("x", "nvmlDeviceGetTemperature", (template,), field=82)
    with pytest.raises(ValueError, match="no fallback"):
        Reading("x", "y", (template,), per="link", fallback=READINGS[0])
    with pytest.raises(ValueError, match="not read once"):
        Reading("x", "y", (template,), per="fan", once=True)


def test_processes_are_labelled_by_pid() -> None:
    processes = (ProcessSample(10, 2**30, 0.5, 0.1), ProcessSample(11, None, None, None))
    found = families(GpuSample(IDENTITY, up=True, processes=processes))
    assert values(found["gpu_processes"])[0][1] == 2
    assert [labels["pid"] for labels, _ in values(found["gpu_process_memory_used_bytes"])] == ["10"]
    assert [labels["pid"] for labels, _ in values(found["gpu_process_utilization_ratio"])] == ["10"]


def test_process_names_label_per_process_series_only_when_read() -> None:
    named = (
        ProcessSample(10, 2**30, 0.5, 0.1, "/usr/bin/python3"),
        ProcessSample(11, 2**20, 0.0, 0.0, ""),  # the driver could not name it
    )
    found = families(GpuSample(IDENTITY, up=True, processes=named))
    memory = values(found["gpu_process_memory_used_bytes"])
    assert [(labels["pid"], labels["process_name"]) for labels, _ in memory] == [
        ("10", "/usr/bin/python3"),
        ("11", ""),
    ]
    assert values(found["gpu_process_utilization_ratio"])[0][0]["process_name"] == (
        "/usr/bin/python3"
    )
    assert "process_name" not in values(found["gpu_processes"])[0][0]
    unnamed = families(GpuSample(IDENTITY, up=True, processes=(ProcessSample(10, 1, 0, 0),)))
    assert "process_name" not in values(unnamed["gpu_process_memory_used_bytes"])[0][0]


def test_without_the_processes_collector_only_the_count_remains() -> None:
    processes = (ProcessSample(10, 2**30, 0.5, 0.1),)
    snapshot = Snapshot(
        timestamp=1.0,
        gpus=(GpuSample(IDENTITY, up=True, processes=processes),),
        collectors=(),
        process_series=False,
    )
    found = {f.name: f for f in snapshot_families(snapshot, BUILD)}
    assert values(found["gpu_processes"])[0][1] == 1
    assert values(found["gpu_process_memory_used_bytes"]) == []


def test_every_series_a_reading_fills_has_its_family_exported() -> None:
    declared = set(VALUE_FAMILIES)
    for reading in all_readings():
        for output in reading.outputs:
            assert output.series.family in declared, reading.name


def test_family_names_are_unique_and_follow_the_naming_rules() -> None:
    names = [family.name for family in ALL_FAMILIES]
    assert len(names) == len(set(names))
    for family in ALL_FAMILIES:
        assert not family.name.endswith("_total"), family.name
        if family.unit:
            assert family.name.endswith(f"_{family.unit}"), family.name


def test_exporter_self_metrics() -> None:
    found = families(
        collectors=(CollectorStatus("nvml", True, 0.004), CollectorStatus("kubernetes", False, 0.5))
    )
    assert values(found["gpuscope_build_info"]) == [
        ({"version": "1.2.3", "python_version": "3.11.7"}, 1)
    ]
    assert values(found["gpuscope_collector_success"]) == [
        ({"collector": "nvml"}, 1),
        ({"collector": "kubernetes"}, 0),
    ]
    assert values(found["gpuscope_collector_duration_seconds"])[0][1] == 0.004
    assert values(found["gpuscope_last_sample_timestamp_seconds"])[0][1] == 1000.0
    assert values(found["gpuscope_sample_cycles"])[0][1] == 7
    assert values(found["gpuscope_sample_overruns"])[0][1] == 1


def test_families_are_written_in_their_order_and_a_new_one_after_them() -> None:
    newer = Family("gpu_newer_ratio", "A family declared after the others.", collector="device")
    written = [family.name for family in in_exposition_order((*reversed(VALUE_FAMILIES), newer))]
    assert written[: len(WRITTEN_FIRST)] == list(WRITTEN_FIRST)
    assert written[-1] == "gpu_newer_ratio"
    assert sorted(written) == sorted(family.name for family in (newer, *VALUE_FAMILIES))
    with pytest.raises(ValueError, match="WRITTEN_FIRST names families nobody declares: gpu_"):
        in_exposition_order(VALUE_FAMILIES[1:])
