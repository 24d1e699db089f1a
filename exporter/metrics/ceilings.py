"""What each GPU's model can do (calibrated and datasheet figures) and costs, beside the live
series: repeated on every GPU of that model so that they join the live series on `uuid`; and the
grid's carbon intensity, once for the node."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from exporter.metrics.base import add, gpu_labels, new_metric
from exporter.series import Family

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from prometheus_client.core import Metric

    from exporter.model import Ceilings, GpuIdentity, Snapshot

CALIBRATED_FLOPS: Final = Family(
    "gpu_calibrated_flops",
    "Dense matmul rate this GPU model reached in gpuscope calibrate, per dtype "
    "(operations per second; int8 counts integer operations).",
    labels=("dtype",),
    labels_doc="`dtype` (`fp64`, `fp32`, `tf32`, `fp16`, `bf16`, `fp8`, `int8`)",
    doc="dense matmul rate this GPU model reached in [calibration](../guide/calibration.md), operations "
    "per second (int8: integer operations); a dtype the GPU or PyTorch cannot run is absent",
    collector="calibration",
)
CALIBRATED_BANDWIDTH: Final = Family(
    "gpu_calibrated_memory_bandwidth_bytes_per_second",
    "Device memory bandwidth this GPU model reached in gpuscope calibrate "
    "(the better of a streaming copy and a read-only reduction).",
    unit="bytes_per_second",
    doc="device memory bandwidth reached in calibration (the better of a streaming copy and a "
    "read-only reduction)",
    collector="calibration",
)
CALIBRATED_HOST_TO_DEVICE: Final = Family(
    "gpu_calibrated_host_to_device_bytes_per_second",
    "Host-to-device copy bandwidth from pinned memory this GPU model reached in calibration.",
    unit="bytes_per_second",
    doc="host-to-device copy rate from pinned memory reached in calibration",
    collector="calibration",
)
CALIBRATED_DEVICE_TO_HOST: Final = Family(
    "gpu_calibrated_device_to_host_bytes_per_second",
    "Device-to-host copy bandwidth into pinned memory this GPU model reached in calibration.",
    unit="bytes_per_second",
    doc="device-to-host copy rate into pinned memory reached in calibration",
    collector="calibration",
)
CALIBRATED_LAUNCH_LATENCY: Final = Family(
    "gpu_calibrated_launch_latency_seconds",
    "Time per launch of a tiny PyTorch kernel on this GPU model, measured in calibration.",
    unit="seconds",
    doc="time per launch of a tiny PyTorch kernel, measured in calibration",
    collector="calibration",
)
DATASHEET_FLOPS: Final = Family(
    "gpu_datasheet_flops",
    "Dense peak rate of this GPU model per dtype from the catalog's datasheet figures "
    "(operations per second).",
    labels=("dtype",),
    doc="the catalog's dense datasheet peak for this model, operations per second; present "
    "without calibration",
)
DATASHEET_BANDWIDTH: Final = Family(
    "gpu_datasheet_memory_bandwidth_bytes_per_second",
    "Device memory bandwidth of this GPU model from the catalog's datasheet figures.",
    unit="bytes_per_second",
    doc="the catalog's datasheet memory bandwidth for this model",
)
PRICE: Final = Family(
    "gpu_price_usd_per_hour",
    "On-demand price of one GPU of this model from the catalog "
    "(its default provider and region), in US dollars per hour.",
    doc="on-demand price of one such GPU from the catalog (its `default_price` provider and "
    "region, else the first price listed)",
)
PRICE_SHARE: Final = Family(
    "gpu_price_share_ratio",
    "Part of its GPU's price this device costs: 1 for a whole GPU, for a MIG instance the larger "
    "of its compute and memory parts of the GPU (the catalog's profile).",
    doc="part of the GPU's price the device costs: 1 for a whole GPU; for a MIG instance the "
    "larger of its compute (sevenths) and memory (eighths) parts, from the catalog's MIG profile; "
    "absent for a profile the catalog does not list. The rules multiply every device price by "
    "it, so that a GPU's instances cost at most the GPU",
)
CARBON_INTENSITY: Final = Family(
    "gpuscope_grid_carbon_intensity_grams_per_kwh",
    "Carbon intensity of the electricity grid the node draws from, in grams of CO2 equivalent "
    "per kWh (--carbon.intensity, else the catalog's).",
    gpu=False,
    doc="the grid's carbon intensity, gCO₂e per kWh: `--carbon.intensity`, else the catalog's "
    "`carbon_intensity_grams_per_kwh`; absent when neither gives one (see "
    "[Energy and carbon](../guide/attribution.md#energy-and-carbon))",
)
FAMILIES: Final = (
    CALIBRATED_FLOPS,
    CALIBRATED_BANDWIDTH,
    CALIBRATED_HOST_TO_DEVICE,
    CALIBRATED_DEVICE_TO_HOST,
    CALIBRATED_LAUNCH_LATENCY,
    DATASHEET_FLOPS,
    DATASHEET_BANDWIDTH,
    PRICE,
    PRICE_SHARE,
    CARBON_INTENSITY,
)

_SCALARS: Final[tuple[tuple[Family, Callable[[Ceilings], float | None]], ...]] = (
    (CALIBRATED_BANDWIDTH, lambda c: c.calibrated_memory_bandwidth),
    (CALIBRATED_HOST_TO_DEVICE, lambda c: c.calibrated_host_to_device),
    (CALIBRATED_DEVICE_TO_HOST, lambda c: c.calibrated_device_to_host),
    (CALIBRATED_LAUNCH_LATENCY, lambda c: c.calibrated_launch_latency_seconds),
)


def ceiling_families(snapshot: Snapshot) -> Iterator[Metric]:
    by_model = {ceilings.model: ceilings for ceilings in snapshot.ceilings}
    known = [
        (gpu_labels(sample.identity), by_model[sample.identity.model])
        for sample in snapshot.gpus
        if sample.up and sample.identity.model in by_model
    ]

    def scalar(family: Family, value: Callable[[Ceilings], float | None]) -> Metric:
        metric = new_metric(family)
        for labels, ceilings in known:
            number = value(ceilings)
            if number is not None:
                add(metric, labels.base, number)
        return metric

    calibrated, datasheet = new_metric(CALIBRATED_FLOPS), new_metric(DATASHEET_FLOPS)
    for labels, ceilings in known:
        for dtype, rate in ceilings.calibrated_flops:
            add(calibrated, labels.with_pairs(("dtype", dtype)), rate)
        for dtype, rate in ceilings.datasheet_flops:
            add(datasheet, labels.with_pairs(("dtype", dtype)), rate)
    yield calibrated
    for family, value in _SCALARS:
        yield scalar(family, value)
    yield datasheet
    yield scalar(DATASHEET_BANDWIDTH, lambda c: c.datasheet_memory_bandwidth)
    yield scalar(PRICE, lambda c: c.price_usd_per_hour)
    yield _price_shares(snapshot, by_model)
    carbon = new_metric(CARBON_INTENSITY)
    if snapshot.carbon_intensity_grams_per_kwh is not None:
        add(carbon, {}, snapshot.carbon_intensity_grams_per_kwh)
    yield carbon


def _price_shares(snapshot: Snapshot, by_model: Mapping[str, Ceilings]) -> Metric:
    """1 for a whole GPU; for a MIG instance the part of its GPU it blocks, scaled down where a
    GPU's instances block more than all of it together (the larger of two parts is not additive:
    3g.40gb and two 2g.20gb fill a GPU and block 0.5 + 2 x 2/7 of it)."""
    metric = new_metric(PRICE_SHARE)
    parts: dict[GpuIdentity, float] = {}
    for sample in snapshot.gpus:
        known = by_model.get(sample.identity.model)
        if not sample.up or known is None:
            continue
        identity = sample.identity
        part = dict(known.mig_gpu_shares).get(identity.mig_profile) if identity.mig_profile else 1.0
        if part is not None:
            parts[identity] = part
    per_gpu: dict[str, float] = {}
    for identity, part in parts.items():
        if identity.mig_profile:
            per_gpu[identity.parent_uuid] = per_gpu.get(identity.parent_uuid, 0.0) + part
    for identity, part in parts.items():
        scale = max(1.0, per_gpu.get(identity.parent_uuid, 0.0)) if identity.mig_profile else 1.0
        add(metric, gpu_labels(identity).base, part / scale)
    return metric
