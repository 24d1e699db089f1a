"""The `nvlink` collector's readings, per NVLink link that was up when NVML initialised: its
error counters and the data sent and received over it (field values)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pynvml

from exporter.readings.convert import number, times
from exporter.readings.declare import HEALTH_PERIOD_SECONDS, Output, family, plain, reading
from exporter.readings.simulated import not_supported
from exporter.series import Series

if TYPE_CHECKING:
    from collections.abc import Callable

    from exporter.readings.declare import Reading
    from exporter.readings.simulated import SimulatedGpu

NVLINK_ERROR_TYPES: Final = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
"""The `type` label and the error counter NVML takes for it."""
_NVLINK_ERRORS_FAMILY: Final = family(
    "gpu_nvlink_errors",
    "NVLink errors since the driver was loaded, by link and type.",
    kind="counter",
    labels=("link", "type"),
    labels_doc="`link`, `type` (`crc_flit`, `crc_data`, `replay`, `recovery`)",
    doc="NVLink data-link errors per active link since the driver loaded: CRC errors in "
    "flow-control units and in data, replays, recoveries (the link retrained); absent on GPUs "
    "without NVLink and where the driver does not count them (nvml.h marks these counters "
    "unsupported from Blackwell on)",
    collector="nvlink",
)
NVLINK_ERRORS: Final = {
    name: Series(_NVLINK_ERRORS_FAMILY, (("type", name),)) for name, _ in NVLINK_ERROR_TYPES
}
"""Per-link templates, as are `NVLINK_TRANSMIT_TOTAL` and `NVLINK_RECEIVE_TOTAL`: link N fills
`link_series(template, N)`."""


def _link_count(gpu: SimulatedGpu, link: int) -> int:
    """The GPU's link count, once `link` is known to be one of them."""
    links = gpu.nvlink_links
    if not links:
        raise not_supported()  # no NVLink on this GPU
    if not 0 <= link < links:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return links


def _simulated_nvlink_errors(gpu: SimulatedGpu, link: int) -> int:
    _link_count(gpu, link)
    return 0  # a healthy fabric


def _errors(name: str, counter: int) -> Reading:
    return reading(
        f"nvlink_{name}_errors",
        "nvmlDeviceGetNvLinkErrorCounter",
        (Output(NVLINK_ERRORS[name], number),),
        args=(counter,),
        since="pascal",
        per="link",
        period=HEALTH_PERIOD_SECONDS,
        simulated=_simulated_nvlink_errors,
    )


_ERROR_COUNTERS: Final = tuple(_errors(name, counter) for name, counter in NVLINK_ERROR_TYPES)


def _simulated_nvlink_kib(direction: int) -> Callable[[SimulatedGpu, int], int]:
    """Data over one link, in KiB: the GPU's NVLink traffic spread evenly over its links."""

    def answer(gpu: SimulatedGpu, link: int) -> int:
        links = _link_count(gpu, link)
        return int(gpu.nvlink_bytes[direction] / links) >> 10

    return answer


NVLINK_TRANSMIT_TOTAL: Final = plain(
    "nvlink_transmit",
    "nvmlDeviceGetFieldValues",
    family(
        "gpu_nvlink_transmit_bytes",
        "Data the GPU sent over this NVLink link since the driver was loaded.",
        kind="counter",
        unit="bytes",
        labels=("link",),
        doc="data sent over that NVLink link since the driver loaded (payload, without protocol "
        "overhead; a field value); absent on GPUs without NVLink",
        collector="nvlink",
    ),
    times(1024.0),
    field=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    since="pascal",
    per="link",
    simulated=_simulated_nvlink_kib(0),
)
NVLINK_RECEIVE_TOTAL: Final = plain(
    "nvlink_receive",
    "nvmlDeviceGetFieldValues",
    family(
        "gpu_nvlink_receive_bytes",
        "Data the GPU received over this NVLink link since the driver was loaded.",
        kind="counter",
        unit="bytes",
        labels=("link",),
        doc="data received over that NVLink link since the driver loaded",
        collector="nvlink",
    ),
    times(1024.0),
    field=pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    since="pascal",
    per="link",
    simulated=_simulated_nvlink_kib(1),
)
