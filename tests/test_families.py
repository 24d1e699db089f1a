"""Snapshot -> metric families: pure, tested on plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.metrics.families import ALL_FAMILIES, BuildInfo, snapshot_families
from exporter.model import CollectorStatus, GpuIdentity, GpuSample, ProcessSample, Snapshot
from exporter.readings import (
    BUSY,
    CLOCKS,
    ECC_CORRECTED,
    ENERGY,
    POWER,
    READINGS,
    TEMPERATURE,
    UTILIZATION,
    VALUE_FAMILIES,
    all_readings,
    fan_series,
    xid_series,
)

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
    ],
)
def test_readings_convert_the_drivers_units_to_base_units(
    name: str, raw: float, expected: float
) -> None:
    reading = next(r for r in all_readings() if r.name == name)
    assert reading.outputs[0].value(raw) == pytest.approx(expected)


def test_processes_are_labelled_by_pid() -> None:
    processes = (ProcessSample(10, 2**30, 0.5, 0.1), ProcessSample(11, None, None, None))
    found = families(GpuSample(IDENTITY, up=True, processes=processes))
    assert values(found["gpu_processes"])[0][1] == 2
    assert [labels["pid"] for labels, _ in values(found["gpu_process_memory_used_bytes"])] == ["10"]
    assert [labels["pid"] for labels, _ in values(found["gpu_process_utilization_ratio"])] == ["10"]


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
