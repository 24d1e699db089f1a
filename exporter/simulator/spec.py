"""What the simulator simulates, as data: a node's GPUs, processes, pods and scheduled faults.

Frozen dataclasses, built by `exporter.simulator.fleet` from a fleet file or by `default_fleet`
from a GPU count, and read by the simulated driver (`driver.py`) and cluster (`cluster.py`).
The names a fleet file may use for enumerated values are declared here too, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import pynvml

from exporter.catalog import GpuModel, MigProfile, builtin_catalog

PATTERNS: Final = ("idle", "steady", "bursty", "sawtooth", "input_starved")
COOLINGS: Final = ("normal", "poor")
SHARINGS: Final = ("time-slicing", "mps")
FAULT_KINDS: Final = (
    "gpu_lost",
    "error",
    "init_error",
    "ecc",
    "xid",
    "mig_layout",
    "hang",
    "exception",
)
EXCEPTIONS: Final = {
    exception.__name__: exception
    for exception in (
        RuntimeError,
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ZeroDivisionError,
        OSError,
    )
}
"""What an `exception` fault may raise: Python errors no NVML call is meant to raise."""
WORKLOAD_KINDS: Final = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
"""What a simulated pod's `workload` may be (a Deployment's pods come through a ReplicaSet, a
CronJob's through a Job, as the API shows them)."""
MIG_COMPUTE_SLICES: Final = 7
MIG_MEMORY_SLICES: Final = 8
DEFAULT_MODEL: Final = "h100-sxm"
MAX_GPUS: Final = 64
"""GPUs on one simulated node."""


class FleetError(ValueError):
    """A fleet that cannot be simulated; the message (one line) names the entry and the problem."""


@dataclass(frozen=True, slots=True)
class SimGpu:
    index: int
    model: GpuModel
    uuid: str
    pci_bus_id: str
    cooling: str = "normal"
    sharing: str = "time-slicing"
    mig: tuple[MigProfile, ...] | None = None
    """The MIG instances at start; None when MIG mode is off."""


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    gpu: int
    memory_bytes: int
    pattern: str = "steady"
    level: float = 0.8
    """Utilization while working, 0..1."""
    period: float = 20.0
    duty: float = 0.3
    """Share of time working for bursty and input-starved patterns."""
    memory_intensity: float = 0.4
    """DRAM activity per unit of SM activity."""
    start: float = 0.0
    stop: float | None = None
    tensor_intensity: float = 0.5
    """Share of its busy time spent on tensor cores (GPM's tensor activity)."""
    mig_instance: int | None = None
    """Position of its MIG instance in the GPU's layout; None on a GPU without MIG."""
    pod: str | None = None
    """The pod it runs in, `namespace/name` (a `pods` entry); None: outside Kubernetes."""
    container: str | None = None
    """Its container in that pod (the pod's first when not given)."""
    name: str = "python3"
    """What the driver names it (`nvmlSystemGetProcessName`)."""


@dataclass(frozen=True, slots=True)
class SimDevice:
    """A device the kubelet allocated to a simulated pod."""

    gpu: int
    mig_instance: int | None = None
    """Position of the MIG instance in the GPU's layout; None for the whole GPU."""


@dataclass(frozen=True, slots=True)
class SimPod:
    """A pod on the simulated node, so that attribution works as in a cluster."""

    namespace: str
    name: str
    workload_kind: str = "Pod"
    workload: str = ""
    """The workload's name; the pod's own for a bare pod."""
    labels: tuple[tuple[str, str], ...] = ()
    containers: tuple[str, ...] = ("main",)
    devices: tuple[SimDevice, ...] = ()
    """Allocated to its first container, as the device plugin hands them out."""
    resource: str | None = None
    """The device plugin's resource; None: `nvidia.com/gpu`, or `nvidia.com/mig-<profile>`.
    Through a claim: the DeviceClass's extended resource name; None: `nvidia.com/gpu` for a
    whole GPU, the driver's name (`gpu.nvidia.com`) for a MIG device."""
    shared: bool = False
    """Time-sliced: the kubelet hands out a replica of each GPU (`<uuid>::N`)."""
    claim: str | None = None
    """The ResourceClaim (in the pod's namespace) its devices come through, from NVIDIA's DRA
    driver; None: from the device plugin. Pods naming one claim share its devices; a device in
    several claims is shared by capacity (each claim gets a `share_id`)."""
    images: tuple[tuple[str, str], ...] = ()
    """(container, image reference) for the containers the fleet file names an image of."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    at: float = 0.0
    until: float | None = None
    gpu: int | None = None
    function: str | None = None
    error: int = pynvml.NVML_ERROR_UNKNOWN
    corrected: int = 0
    uncorrected: int = 0
    xid: int = 0
    mig: tuple[MigProfile, ...] = ()
    """The new MIG layout of a `mig_layout` fault."""
    exception: str = ""
    """The Python exception an `exception` fault raises (a name in `EXCEPTIONS`)."""

    def active(self, t: float) -> bool:
        return self.at <= t and (self.until is None or t < self.until)


@dataclass(frozen=True, slots=True)
class Fleet:
    gpus: tuple[SimGpu, ...]
    processes: tuple[SimProcess, ...] = ()
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    driver_version: str = "570.133.20"
    cuda_version: int = 12080
    pods: tuple[SimPod, ...] = ()
    """Pods behind the processes and allocations; empty: a node without Kubernetes."""


def simulated_gpu(
    index: int,
    model: GpuModel,
    seed: int,
    *,
    cooling: str = "normal",
    sharing: str = "time-slicing",
    mig: tuple[MigProfile, ...] | None = None,
) -> SimGpu:
    """GPU `index` of a node, with the UUID and PCI bus id the seed gives it."""
    digits = f"{(seed * 7919 + index * 104729 + 0x5EED) & 0xFFFFFFFFFFFF:012x}"
    uuid = f"GPU-5a1e{index:04x}-{seed & 0xFFFF:04x}-4c{index % 256:02x}-8000-{digits}"
    bus_id = f"00000000:{0x18 + index * 0x10 & 0xFF:02X}:00.0"
    return SimGpu(index, model, uuid, bus_id, cooling, sharing, mig)


def default_fleet(count: int, *, seed: int = 0) -> Fleet:
    """N GPUs of the default model running a realistic mix: a trainer, two inference services
    time-sharing one GPU, an idle holder and an input-starved trainer, repeating."""
    model = builtin_catalog().by_key(DEFAULT_MODEL)
    if model is None:  # pragma: no cover - the built-in catalog always has it
        raise FleetError(f"default model {DEFAULT_MODEL} missing from the catalog")
    gib = 2**30
    gpus = tuple(simulated_gpu(i, model, seed) for i in range(count))
    processes: list[SimProcess] = []
    for i in range(count):
        pid = 10_000 + 100 * i
        match i % 4:
            case 0:
                processes.append(SimProcess(pid, i, 62 * gib, "steady", level=0.92))
            case 1:
                processes.append(SimProcess(pid, i, 9 * gib, "bursty", 0.55, period=15, duty=0.4))
                processes.append(SimProcess(pid + 1, i, 14 * gib, "sawtooth", 0.35, period=120))
            case 2:
                processes.append(SimProcess(pid, i, 3 * gib, "idle", level=0.0))
            case _:
                processes.append(
                    SimProcess(pid, i, 48 * gib, "input_starved", 0.9, period=2, duty=0.25)
                )
    return Fleet(gpus=gpus, processes=tuple(processes), seed=seed)
