"""Snapshot -> metric families: pure, tested on plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import Clocks, CollectorStatus, GpuIdentity, GpuSample, ProcessSample, Snapshot

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
        utilization=0.5,
        busy_seconds_total=12.0,
        clocks=Clocks(sm=1e9),
        clock_event_reasons=0,
        fan_speeds=(0.4,),
        ecc_corrected_total=1,
        processes=(ProcessSample(10, 2**30, 0.5, 0.1),),
    )
    for name, family in families(sample).items():
        if name.startswith("gpuscope_"):
            continue
        for labels, _ in values(family):
            assert {"gpu", "uuid", "model"} <= set(labels), name


def test_absent_not_zero_for_values_a_gpu_cannot_give() -> None:
    found = families(GpuSample(IDENTITY, up=True, utilization=0.25))
    assert values(found["gpu_utilization_ratio"])[0][1] == 0.25
    for name in (
        "gpu_power_watts",
        "gpu_temperature_celsius",
        "gpu_clock_hertz",
        "gpu_ecc_errors",
        "gpu_processes",
    ):
        assert values(found[name]) == [], name


def test_down_gpu_exports_only_identity_and_up() -> None:
    found = families(GpuSample(IDENTITY, up=False, utilization=0.9, power_watts=100))
    assert values(found["gpu_up"]) == [({"gpu": "0", "uuid": "GPU-aaaa", "model": "NVIDIA L4"}, 0)]
    assert len(values(found["gpu_info"])) == 1
    assert values(found["gpu_utilization_ratio"]) == []
    assert values(found["gpu_power_watts"]) == []


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
    found = families(GpuSample(IDENTITY, up=True, clock_event_reasons=0x4 | 0x40))
    active = {labels["reason"]: v for labels, v in values(found["gpu_clock_event_active"])}
    assert active["sw_power_cap"] == 1
    assert active["hw_thermal_slowdown"] == 1
    assert active["gpu_idle"] == 0
    assert len(active) == 9


def test_units_are_base_units() -> None:
    found = families(
        GpuSample(
            IDENTITY, up=True, power_watts=250.5, energy_joules_total=9.5, clocks=Clocks(sm=1.41e9)
        )
    )
    assert values(found["gpu_power_watts"])[0][1] == 250.5
    assert values(found["gpu_energy_joules"])[0][1] == 9.5
    assert values(found["gpu_clock_hertz"])[0][1] == 1.41e9
    assert found["gpu_energy_joules"].type == "counter"


def test_processes_are_labelled_by_pid() -> None:
    processes = (ProcessSample(10, 2**30, 0.5, 0.1), ProcessSample(11, None, None, None))
    found = families(GpuSample(IDENTITY, up=True, processes=processes))
    assert values(found["gpu_processes"])[0][1] == 2
    assert [labels["pid"] for labels, _ in values(found["gpu_process_memory_used_bytes"])] == ["10"]
    assert [labels["pid"] for labels, _ in values(found["gpu_process_utilization_ratio"])] == ["10"]


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
