"""Ceilings -> metric families: pure, on plain data."""

from __future__ import annotations

from exporter.metrics.families import BuildInfo, snapshot_families
from exporter.model import Ceilings, CollectorStatus, GpuIdentity, GpuSample, Snapshot

L4 = GpuIdentity(0, "GPU-aaaa", "NVIDIA L4")
L4_LOST = GpuIdentity(1, "GPU-bbbb", "NVIDIA L4")
UNKNOWN = GpuIdentity(2, "GPU-cccc", "Quantum GPU 9000")
CEILINGS = Ceilings(
    model="NVIDIA L4",
    calibrated_flops=(("bf16", 9.7e13), ("fp32", 2.4e13)),
    calibrated_memory_bandwidth=2.6e11,
    calibrated_host_to_device=2.5e10,
    calibrated_device_to_host=2.4e10,
    calibrated_launch_latency_seconds=5e-6,
    datasheet_flops=(("bf16", 1.21e14),),
    datasheet_memory_bandwidth=3e11,
    price_usd_per_hour=0.805,
)


def families(*ceilings: Ceilings) -> dict[str, list[tuple[dict[str, str], float]]]:
    snapshot = Snapshot(
        timestamp=1.0,
        gpus=(GpuSample(L4, up=True), GpuSample(L4_LOST, up=False), GpuSample(UNKNOWN, up=True)),
        collectors=(CollectorStatus("calibration", True, 0.0),),
        ceilings=ceilings,
    )
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in snapshot_families(snapshot, BuildInfo("1"))
    }


def test_each_up_gpu_of_a_known_model_gets_its_ceilings() -> None:
    found = families(CEILINGS)
    labels = {"gpu": "0", "uuid": "GPU-aaaa", "model": "NVIDIA L4"}
    assert found["gpu_calibrated_flops"] == [
        ({**labels, "dtype": "bf16"}, 9.7e13),
        ({**labels, "dtype": "fp32"}, 2.4e13),
    ]
    assert found["gpu_calibrated_memory_bandwidth_bytes_per_second"] == [(labels, 2.6e11)]
    assert found["gpu_calibrated_host_to_device_bytes_per_second"] == [(labels, 2.5e10)]
    assert found["gpu_calibrated_device_to_host_bytes_per_second"] == [(labels, 2.4e10)]
    assert found["gpu_calibrated_launch_latency_seconds"] == [(labels, 5e-6)]
    assert found["gpu_datasheet_flops"] == [({**labels, "dtype": "bf16"}, 1.21e14)]
    assert found["gpu_datasheet_memory_bandwidth_bytes_per_second"] == [(labels, 3e11)]
    assert found["gpu_price_usd_per_hour"] == [(labels, 0.805)]
    assert found["gpuscope_collector_success"] == [({"collector": "calibration"}, 1.0)]


def test_what_is_not_known_is_absent_not_zero() -> None:
    found = families(Ceilings(model="NVIDIA L4", datasheet_memory_bandwidth=3e11))
    assert found["gpu_calibrated_flops"] == []
    assert found["gpu_calibrated_memory_bandwidth_bytes_per_second"] == []
    assert found["gpu_price_usd_per_hour"] == []
    assert len(found["gpu_datasheet_memory_bandwidth_bytes_per_second"]) == 1
    assert families()["gpu_datasheet_flops"] == []
