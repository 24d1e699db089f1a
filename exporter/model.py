"""The snapshot: everything one sampling cycle learned, immutable once built.

The sampler builds a `Snapshot` in its worker thread; exposition turns it into metric families
and bytes. Nothing downstream calls NVML, reads /proc or asks the Kubernetes API. A value the
hardware could not give is `None` (its series is then absent, never a fake zero).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.series import Series


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What names a GPU in every series: `gpu` (index), `uuid`, `model`, plus `gpu_info` labels."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    minor_number: int | None = None
    """The N of /dev/nvidiaN; some device plugins name GPUs `nvidiaN` instead of by UUID."""
    mig_profile: str = ""
    """For a MIG instance: its profile as NVIDIA names it (`3g.40gb`); empty for a whole GPU."""
    gpu_instance: int | None = None
    """For a MIG instance: its GPU instance id; `index` is then the parent GPU's index."""
    parent_uuid: str = ""
    """For a MIG instance: the UUID of the physical GPU it is carved from."""
    has_gpm: bool = False
    """Its activity is read from GPM (Hopper and newer, with the gpm collector on): where a GPM
    value is missing for a cycle, nothing stands in for it."""

    @property
    def is_mig_instance(self) -> bool:
        return self.gpu_instance is not None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process running on one GPU. `pid` is a host pid."""

    pid: int
    used_memory_bytes: int | None
    sm_utilization: float | None
    """Share of the sample window in which this process had a kernel running, 0..1."""
    memory_utilization: float | None
    name: str | None = None
    """The process's name as the driver gives it, with `--collect.process-names` ("" where the
    driver cannot name it); None when names are not read."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. When `up` is False only `identity` (last known) and the XID
    counters are meaningful."""

    identity: GpuIdentity
    up: bool
    down_reason: str | None = None
    """Why a GPU is down: `lost`, `hung`, `unopened` or `error` (see `exporter.nvml.sampler`)."""
    values: Mapping[Series, float] = field(default_factory=dict)
    """Every number the GPU gave this cycle, by the series it fills (`exporter.readings`
    declares them). A value the GPU could not give is absent, never zero. Never changed once
    the sample is made."""
    processes: tuple[ProcessSample, ...] | None = None
    """None when the process list could not be read (not an empty GPU)."""

    def value(self, series: Series) -> float | None:
        return self.values.get(series)


class CollectorStatus(NamedTuple):
    """Whether one source answered this cycle, and how long it took. A named tuple rather than a
    frozen dataclass like the rest: a dozen are made every cycle, and a tuple is made in a quarter
    of the time."""

    name: str
    success: bool
    duration_seconds: float | None
    """None for a background task (the event thread, the web-config watch): it has no cycle."""


@dataclass(frozen=True, slots=True)
class Ceilings:
    """What one GPU model can do: measured by `gpuscope calibrate`, and the catalog's datasheet.

    Rates are per second: FLOP/s per dtype (int8 in integer OP/s), bytes per second."""

    model: str
    """The model name NVML reports, as in `GpuIdentity.model`."""
    calibrated_flops: tuple[tuple[str, float], ...] = ()
    """(dtype, rate) for every dtype the calibration measured."""
    calibrated_memory_bandwidth: float | None = None
    calibrated_host_to_device: float | None = None
    calibrated_device_to_host: float | None = None
    calibrated_launch_latency_seconds: float | None = None
    datasheet_flops: tuple[tuple[str, float], ...] = ()
    datasheet_memory_bandwidth: float | None = None
    price_usd_per_hour: float | None = None
    """On-demand price of one such GPU (the catalog's default provider and region)."""
    mig_gpu_shares: tuple[tuple[str, float], ...] = ()
    """(MIG profile, the part of the GPU an instance of it blocks) for the profiles the catalog
    lists for this model."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp: float
    """Wall-clock time (Unix seconds) at which the cycle finished."""
    gpus: tuple[GpuSample, ...]
    collectors: tuple[CollectorStatus, ...]
    cycles_total: int = 0
    overruns_total: int = 0
    """Cycles that started late because the previous one outlasted the interval."""
    errors_total: int = 0
    """Unexpected errors met while sampling (a reading, a GPU or a whole cycle)."""
    collect_interval_seconds: float | None = None
    """The configured sampling interval, so that rules can tell a stale sample by it."""
    process_series: bool = True
    """Whether per-process series are exported (`--collector.processes`)."""
    ceilings: tuple[Ceilings, ...] = ()
    """Per GPU model present: calibrated and datasheet figures, and price."""
    attribution: Attribution | None = None
    """Who holds and who uses each GPU; None when pod attribution is off (no cluster)."""
    carbon_intensity_grams_per_kwh: float | None = None
    """The grid's carbon intensity (`--carbon.intensity`, else the catalog's); None when
    neither gives one."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """What names a pod in series: namespace, pod and the workload a person would name."""

    namespace: str
    name: str
    uid: str
    workload: str
    workload_kind: str
    labels: tuple[tuple[str, str], ...] = ()
    """Pod labels chosen by --kubernetes.pod-labels, as (Prometheus label name, value), sorted."""
    revision: str = ""
    """The pod's `pod-template-hash` label (Deployments), else its `controller-revision-hash`
    (StatefulSets, DaemonSets); "" for neither."""
    images: tuple[tuple[str, str], ...] = ()
    """(container, image) of its containers, each image without its digest and cut to
    `exporter.attribution.pod.MAX_IMAGE_LENGTH`; "" where --kubernetes.image-pattern hides it."""
    queue: str = ""
    """The queue it was admitted through (`exporter.attribution.localqueues`); "" for none."""
    queue_kind: str = ""
    """`kueue` (a ClusterQueue) or `kai` (a KAI Scheduler queue); "" for none."""


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One container's use of one GPU: its processes' memory and utilization, summed."""

    pod: PodIdentity
    container: str
    gpu: GpuIdentity
    memory_used_bytes: int | None
    """Sum of its processes' memory; None if NVML gave none (0 when it runs nothing here)."""
    utilization: float | None
    """Sum of its processes' per-process utilization (capped at 1); None if NVML gave none."""
    busy_seconds_total: float | None
    """`utilization` integrated over time; never goes down while the pod lives."""
    processes: int
    energy_joules_total: float | None = None
    """The container's part of the GPU's energy since the row appeared (`exporter.attribution.
    join` says how it is divided); never goes down while the pod lives. None on a GPU without an
    energy reading, and on MIG instances (NVML measures the whole GPU only)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """The kubelet gave this GPU (or a share of it) to this container."""

    pod: PodIdentity
    container: str
    resource: str
    gpu: GpuIdentity
    in_use: bool | None
    """At least one process of the holding container runs on the GPU; None while the GPU or its
    process list does not answer."""
    shared: bool
    """Time-sliced (`<uuid>::N` ids), a fraction HAMi or KAI handed out, a share of a DRA
    device's capacity (a `share_id`), or held by more than one container (a DRA claim several
    pods reserve, say)."""
    claim: str = ""
    """For a device allocated through Dynamic Resource Allocation: its ResourceClaim's name."""
    claim_namespace: str = ""
    share: float = 1.0
    """The part of the GPU it holds: what it reserved (HAMi, KAI, DRA capacity sharing; see
    `exporter.attribution.shares`), else an equal part of what the GPU's other holders leave;
    a GPU's holders' shares add up to 1 at most."""


@dataclass(frozen=True, slots=True)
class Unattributed:
    """Processes on one GPU that map to no pod (not in a container, or the pod is unknown)."""

    gpu: GpuIdentity
    processes: int
    memory_used_bytes: int


@dataclass(frozen=True, slots=True)
class UnattributedEnergy:
    """Energy of one physical GPU that no container was given: processes outside pods, a GPU
    nobody holds, a MIG GPU, cycles the split could not be made (see `exporter.attribution.join`)."""

    gpu: GpuIdentity
    joules_total: float


@dataclass(frozen=True, slots=True)
class WatchStatus:
    """One list + watch of the Kubernetes API (`pods`, `resourceslices`, `localqueues`)."""

    resource: str
    up: bool
    """The cache follows the API server right now."""
    cache_age_seconds: float | None
    """How long ago the cache was last known to be current (0 while the watch is up); None
    before the first list."""
    objects: int
    """Objects in the cache."""


@dataclass(frozen=True, slots=True)
class KubernetesStatus:
    watches: tuple[WatchStatus, ...]
    """Every watch running: the pods', the ResourceSlices' while DRA is on, the LocalQueues'
    while the cluster serves them."""
    pods_cached: int
    dra_devices: int | None = None
    """Devices the node's ResourceSlices publish (each pool's newest generation); None while
    DRA is off."""

    @property
    def watch_up(self) -> bool:
        """Every watch follows the API server."""
        return all(watch.up for watch in self.watches)


@dataclass(frozen=True, slots=True)
class Attribution:
    node: str
    pods: tuple[PodIdentity, ...]
    """Pods that hold or use a GPU of this node (gpu_pod_info)."""
    usage: tuple[PodUsage, ...]
    allocations: tuple[Allocation, ...]
    unattributed: tuple[Unattributed, ...]
    kubernetes: KubernetesStatus
    unattributed_energy: tuple[UnattributedEnergy, ...] = ()
    """Per physical GPU with an energy reading (and up this cycle)."""
