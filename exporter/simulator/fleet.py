"""What the simulator simulates: GPUs, processes and scheduled faults, from YAML or a count.

A fleet file (every key but `gpus` optional):

    seed: 7
    driver_version: 570.133.20
    cuda_version: "12.8"
    gpus:
      - model: h100-sxm            # catalog key, or the name NVML reports
        count: 2
        cooling: poor              # normal | poor (runs hot and throttles under load)
        sharing: time-slicing      # time-slicing | mps
      - model: h100-sxm
        mig: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]   # MIG mode on, with these instances
    processes:
      - {pid: 2001, gpu: 0, memory: 30GiB, pattern: steady, level: 0.85, tensor_intensity: 0.7}
      - {pid: 2002, gpu: 1, memory: 6GiB, pattern: bursty, level: 0.6, period: 20s, duty: 0.3}
      - {pid: 2003, gpu: 1, memory: 4GiB, pattern: sawtooth, start: 10s, stop: 5m}
      - {pid: 2004, gpu: 2, mig_instance: 0, memory: 20GiB, pattern: steady, level: 0.7}
    faults:
      - {kind: gpu_lost, gpu: 1, at: 30s, until: 90s}
      - {kind: error, function: nvmlDeviceGetFanSpeed_v2, error: not_supported}
      - {kind: init_error, error: driver_not_loaded, until: 5s}
      - {kind: ecc, gpu: 0, at: 1m, corrected: 3, uncorrected: 1}
      - {kind: xid, gpu: 1, at: 30s, xid: 79}
      - {kind: mig_layout, gpu: 2, at: 2m, mig: [3g.40gb, 4g.40gb]}
      - {kind: hang, gpu: 1, at: 5m, until: 6m}
      - {kind: exception, function: nvmlDeviceGetPowerUsage, gpu: 0, at: 20s, until: 25s}

Times are durations since the simulation started. `mig_instance` places a process on an instance
of its GPU's MIG layout (0 is the first listed); a GPU in MIG mode runs processes only there. A
`mig_layout` fault replaces the GPU's instances at `at`: instances unchanged at their position
stay, the others vanish and new ones appear (processes on a vanished instance stop). An `ecc`
fault with uncorrected errors also remaps rows (A100 and newer) or retires pages (older GPUs),
pending until a reset. An `xid` fault raises that XID critical error event once. A `hang` fault
makes every driver call about its GPU (and its MIG instances) block from `at` until `until` (or
for good), as a GPU that fell off the bus can; with a `function`, only calls of that function
block (on `gpu` if given): `function: nvmlInit` wedges the library as a whole. An `exception` fault makes `function` raise a
Python exception (`exception: RuntimeError`, the default; see `EXCEPTIONS`) while it lasts, on
`gpu` or on every GPU: what a bug or a driver answer nobody expected looks like.

`pods` put the node in a cluster (see `exporter.simulator.cluster`): each names its namespace,
workload (`{kind: Deployment, name: chat}`), labels, containers and the devices the kubelet gave
it; a process names its pod (`pod: serving/chat-7d9c8b6f5-x2x9k`) and container:

    pods:
      - {name: chat-7d9c8b6f5-x2x9k, namespace: serving, workload: {kind: Deployment, name: chat},
         gpus: [1], shared: true}
      - {name: notebook-ana, namespace: lab, gpus: [{gpu: 2, mig_instance: 1}]}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pynvml
import yaml

from exporter.catalog import GpuModel, MigProfile, builtin_catalog
from exporter.durations import DurationError, parse_duration
from exporter.nvml.driver import NVML_FUNCTIONS

if TYPE_CHECKING:
    from pathlib import Path

PATTERNS: Final = ("idle", "steady", "bursty", "sawtooth", "input_starved")
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
MIG_COMPUTE_SLICES: Final = 7
MIG_MEMORY_SLICES: Final = 8
DEFAULT_MODEL: Final = "h100-sxm"
_BYTE_UNITS: Final = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


class FleetError(ValueError):
    """A fleet that cannot be simulated; the message names the entry and the problem."""


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


WORKLOAD_KINDS: Final = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
"""What a simulated pod's `workload` may be (a Deployment's pods come through a ReplicaSet, a
CronJob's through a Job, as the API shows them)."""


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
    """The device plugin's resource; None: `nvidia.com/gpu`, or `nvidia.com/mig-<profile>`."""
    shared: bool = False
    """Time-sliced: the kubelet hands out a replica of each GPU (`<uuid>::N`)."""

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


def parse_bytes(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    if match is None or match[2].lower() not in _BYTE_UNITS:
        raise ValueError(f"{value!r} is not a size (e.g. 512MiB, 20GiB, 1.5GB)")
    return round(float(match[1]) * _BYTE_UNITS[match[2].lower()])


def _uuid(seed: int, index: int) -> str:
    digits = f"{(seed * 7919 + index * 104729 + 0x5EED) & 0xFFFFFFFFFFFF:012x}"
    return f"GPU-5a1e{index:04x}-{seed & 0xFFFF:04x}-4c{index % 256:02x}-8000-{digits}"


def _bus_id(index: int) -> str:
    return f"00000000:{0x18 + index * 0x10 & 0xFF:02X}:00.0"


def default_fleet(count: int, *, seed: int = 0) -> Fleet:
    """N GPUs of the default model running a realistic mix: a trainer, two inference services
    time-sharing one GPU, an idle holder and an input-starved trainer, repeating."""
    model = builtin_catalog().by_key(DEFAULT_MODEL)
    if model is None:  # pragma: no cover - the built-in catalog always has it
        raise FleetError(f"default model {DEFAULT_MODEL} missing from the catalog")
    gib = 2**30
    gpus = tuple(SimGpu(i, model, _uuid(seed, i), _bus_id(i)) for i in range(count))
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


def load_fleet(path: Path) -> Fleet:
    where = f"--simulate {path}"
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise FleetError(f"{where}: {error.strerror or error}") from error
    except yaml.YAMLError as error:
        raise FleetError(f"{where}: not valid YAML") from error
    return parse_fleet(document, where=where)


def parse_fleet(document: object, *, where: str = "fleet") -> Fleet:
    if not isinstance(document, Mapping):
        raise FleetError(f"{where}: the top level must be a mapping")
    _only(
        document,
        {"seed", "driver_version", "cuda_version", "gpus", "processes", "faults", "pods"},
        where,
    )
    seed = _field(where, "seed", lambda: int(document.get("seed", 0)))
    gpus = _parse_gpus(document.get("gpus"), where, seed)
    processes = tuple(
        _entry(where, f"processes[{n}]", item, lambda item: _parse_process(item, len(gpus)))
        for n, item in enumerate(_list(document.get("processes"), where, "processes"))
    )
    pids = [process.pid for process in processes]
    duplicates = sorted({pid for pid in pids if pids.count(pid) > 1})
    if duplicates:
        raise FleetError(f"{where}: processes: pid {duplicates[0]} appears more than once")
    for gpu in gpus:
        planned = sum(p.memory_bytes for p in processes if p.gpu == gpu.index)
        if planned > gpu.model.nvml_memory_bytes * 0.99:
            raise FleetError(
                f"{where}: processes on GPU {gpu.index} need {planned / 2**30:.1f} GiB, "
                f"more than a {gpu.model.name} has ({gpu.model.nvml_memory_bytes / 2**30:.1f} GiB)"
            )
    faults = tuple(
        _entry(where, f"faults[{n}]", item, lambda item: _parse_fault(item, gpus))
        for n, item in enumerate(_list(document.get("faults"), where, "faults"))
    )
    for n, process in enumerate(processes):
        _check_placement(process, gpus[process.gpu], faults, f"{where}: processes[{n}]")
    pods = tuple(
        _entry(where, f"pods[{n}]", item, lambda item: _parse_pod(item, gpus))
        for n, item in enumerate(_list(document.get("pods"), where, "pods"))
    )
    _check_pods(pods, processes, where)
    cuda = str(document.get("cuda_version", "12.8"))
    cuda_match = re.fullmatch(r"(\d+)\.(\d+)", cuda)
    if cuda_match is None:
        raise FleetError(f"{where}: cuda_version: {cuda!r} is not MAJOR.MINOR")
    return Fleet(
        gpus=gpus,
        processes=processes,
        faults=faults,
        seed=seed,
        driver_version=str(document.get("driver_version", "570.133.20")),
        cuda_version=int(cuda_match[1]) * 1000 + int(cuda_match[2]) * 10,
        pods=pods,
    )


def _parse_gpus(value: object, where: str, seed: int) -> tuple[SimGpu, ...]:
    entries = _list(value, where, "gpus")
    if not entries:
        raise FleetError(f"{where}: gpus: at least one GPU is needed")
    gpus: list[SimGpu] = []
    for n, item in enumerate(entries):
        spot = f"{where}: gpus[{n}]"
        if not isinstance(item, Mapping):
            raise FleetError(f"{spot}: expected a mapping")
        _only(item, {"model", "count", "cooling", "sharing", "mig"}, spot)
        name = str(item.get("model", DEFAULT_MODEL))
        model = builtin_catalog().find(name)
        if model is None:
            known = ", ".join(m.key for m in builtin_catalog().models)
            raise FleetError(f"{spot}: model: unknown GPU model {name!r} (known: {known})")
        count = item.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 64:
            raise FleetError(f"{spot}: count: {count!r} is not a number from 1 to 64")
        cooling = _choice(item.get("cooling", "normal"), ("normal", "poor"), f"{spot}: cooling")
        sharing = _choice(
            item.get("sharing", "time-slicing"), ("time-slicing", "mps"), f"{spot}: sharing"
        )
        try:
            mig = parse_mig_layout(item["mig"], model) if "mig" in item else None
        except ValueError as error:
            raise FleetError(f"{spot}: {error}") from error
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                SimGpu(index, model, _uuid(seed, index), _bus_id(index), cooling, sharing, mig)
            )
    if len(gpus) > 64:
        raise FleetError(f"{where}: gpus: {len(gpus)} GPUs; at most 64 per node")
    return tuple(gpus)


def _parse_process(item: Mapping[str, Any], gpu_count: int) -> SimProcess:
    _only(
        item,
        {
            "pid",
            "gpu",
            "memory",
            "pattern",
            "level",
            "period",
            "duty",
            "memory_intensity",
            "start",
            "stop",
            "tensor_intensity",
            "mig_instance",
            "pod",
            "container",
        },
    )
    pid = int(item["pid"])
    if not 1 <= pid < 2**22:
        raise ValueError(f"pid: {pid} is not a valid pid")
    gpu = _gpu_index(item.get("gpu"), gpu_count, required=True)
    assert gpu is not None
    pattern = _choice(item.get("pattern", "steady"), PATTERNS, "pattern")
    stop = _seconds(item["stop"], "stop") if "stop" in item else None
    start = _seconds(item.get("start", "0s"), "start")
    if stop is not None and stop <= start:
        raise ValueError("stop: must come after start")
    return SimProcess(
        pid=pid,
        gpu=gpu,
        memory_bytes=_sized(item.get("memory", "1GiB")),
        pattern=pattern,
        level=_ratio(item.get("level", 0.0 if pattern == "idle" else 0.8), "level"),
        period=_seconds(item.get("period", "20s"), "period", positive=True),
        duty=_ratio(item.get("duty", 0.3), "duty"),
        memory_intensity=_ratio(item.get("memory_intensity", 0.4), "memory_intensity"),
        start=start,
        stop=stop,
        tensor_intensity=_ratio(item.get("tensor_intensity", 0.5), "tensor_intensity"),
        mig_instance=_mig_instance(item.get("mig_instance")),
        pod=_pod_key(item["pod"]) if "pod" in item else None,
        container=_name(item["container"], "container") if "container" in item else None,
    )


def parse_mig_layout(value: object, model: GpuModel) -> tuple[MigProfile, ...]:
    """A list of profile names that fits one GPU of `model`, as NVIDIA's MIG allows."""
    if not isinstance(value, list):
        raise ValueError("mig: expected a list of MIG profiles, e.g. [3g.40gb, 4g.40gb]")
    if not model.mig_profiles:
        raise ValueError(f"mig: a {model.name} has no MIG mode")
    layout: list[MigProfile] = []
    for name in value:
        profile = model.mig_profile(str(name))
        if profile is None:
            known = ", ".join(p.profile for p in model.mig_profiles)
            raise ValueError(f"mig: {name!r} is not a MIG profile of a {model.name} ({known})")
        if sum(1 for p in layout if p == profile) >= profile.max_instances:
            raise ValueError(f"mig: a {model.name} holds at most {profile.max_instances} {name}")
        layout.append(profile)
    compute = sum(p.compute_slices for p in layout)
    memory = sum(p.memory_slices for p in layout)
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise ValueError(
            f"mig: the instances need {compute}/7 compute and {memory}/8 memory slices; "
            "they do not fit one GPU"
        )
    return tuple(layout)


def _mig_instance(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"mig_instance: {value!r} is not an instance position (0, 1, ...)")
    return value


def _check_placement(
    process: SimProcess, gpu: SimGpu, faults: tuple[Fault, ...], where: str
) -> None:
    """A process on a MIG GPU runs on one of its instances (in some layout it will have)."""
    if gpu.mig is None:
        if process.mig_instance is not None:
            raise FleetError(f"{where}: mig_instance: GPU {gpu.index} is not in MIG mode")
        return
    layouts = [gpu.mig, *(f.mig for f in faults if f.kind == "mig_layout" and f.gpu == gpu.index)]
    if process.mig_instance is None:
        raise FleetError(
            f"{where}: GPU {gpu.index} is in MIG mode: give the process a mig_instance"
        )
    positions = max(len(layout) for layout in layouts)
    if process.mig_instance >= positions:
        raise FleetError(
            f"{where}: mig_instance: {process.mig_instance} is not an instance of GPU "
            f"{gpu.index} (it has {positions})"
        )
    first = next(layout for layout in layouts if process.mig_instance < len(layout))
    capacity = first[process.mig_instance].memory_bytes
    if process.memory_bytes > capacity:
        raise FleetError(
            f"{where}: memory: {process.memory_bytes / 2**30:.1f} GiB does not fit a "
            f"{first[process.mig_instance].profile} instance"
        )


_DNS_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _name(value: object, field: str) -> str:
    text = str(value)
    if not _DNS_NAME.fullmatch(text):
        raise ValueError(f"{field}: {text!r} is not a Kubernetes name")
    return text


def _pod_key(value: object) -> str:
    namespace, sep, name = str(value).partition("/")
    if not sep:
        raise ValueError(f"pod: {value!r} is not namespace/name")
    return f"{_name(namespace, 'pod')}/{_name(name, 'pod')}"


def _parse_pod(item: Mapping[str, Any], gpus: tuple[SimGpu, ...]) -> SimPod:
    _only(
        item,
        {"name", "namespace", "workload", "labels", "containers", "gpus", "resource", "shared"},
    )
    name = _name(item["name"], "name")
    workload = item.get("workload") or {}
    if not isinstance(workload, Mapping):
        raise ValueError("workload: expected {kind: ..., name: ...}")
    _only(workload, {"kind", "name"})
    kind = _choice(workload.get("kind", "Pod"), WORKLOAD_KINDS, "workload: kind")
    labels = item.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise ValueError("labels: expected a mapping of label name to value")
    containers = item.get("containers", ["main"])
    if not isinstance(containers, list) or not containers:
        raise ValueError("containers: expected a list of container names")
    devices = tuple(_parse_device(device, gpus) for device in _list(item.get("gpus"), "", "gpus"))
    resource = item.get("resource")
    return SimPod(
        namespace=_name(item.get("namespace", "default"), "namespace"),
        name=name,
        workload_kind=kind,
        workload=_name(workload.get("name", name), "workload: name"),
        labels=tuple(sorted((str(key), str(text)) for key, text in labels.items())),
        containers=tuple(_name(container, "containers") for container in containers),
        devices=devices,
        resource=str(resource) if resource is not None else None,
        shared=bool(item.get("shared", False)),
    )


def _parse_device(value: object, gpus: tuple[SimGpu, ...]) -> SimDevice:
    """`2` (a whole GPU) or `{gpu: 4, mig_instance: 1}` (one of its MIG instances)."""
    if isinstance(value, Mapping):
        _only(value, {"gpu", "mig_instance"})
        gpu = _gpu_index(value.get("gpu"), len(gpus), required=True)
        assert gpu is not None
        instance = _mig_instance(value.get("mig_instance"))
        layout = gpus[gpu].mig
        if instance is not None and (layout is None or instance >= len(layout)):
            raise ValueError(f"gpus: GPU {gpu} has no MIG instance {instance}")
        return SimDevice(gpu, instance)
    gpu = _gpu_index(value, len(gpus), required=True)
    assert gpu is not None
    return SimDevice(gpu)


def _check_pods(pods: tuple[SimPod, ...], processes: tuple[SimProcess, ...], where: str) -> None:
    """Pods named once; every process's pod and container exist."""
    by_key: dict[str, SimPod] = {}
    for n, pod in enumerate(pods):
        if pod.key in by_key:
            raise FleetError(f"{where}: pods[{n}]: {pod.key} appears more than once")
        by_key[pod.key] = pod
    for n, process in enumerate(processes):
        if process.pod is None:
            if process.container is not None:
                raise FleetError(f"{where}: processes[{n}]: container: needs a pod")
            continue
        owner = by_key.get(process.pod)
        if owner is None:
            raise FleetError(f"{where}: processes[{n}]: pod: no pod {process.pod} in pods")
        if process.container is not None and process.container not in owner.containers:
            raise FleetError(
                f"{where}: processes[{n}]: container: {owner.key} has no container "
                f"{process.container!r} (it has {', '.join(owner.containers)})"
            )


def _parse_fault(item: Mapping[str, Any], gpus: tuple[SimGpu, ...]) -> Fault:
    _only(
        item,
        {
            "kind",
            "gpu",
            "function",
            "error",
            "at",
            "until",
            "corrected",
            "uncorrected",
            "xid",
            "mig",
            "exception",
        },
    )
    kind = _choice(item.get("kind"), FAULT_KINDS, "kind")
    at = _seconds(item.get("at", "0s"), "at")
    until = _seconds(item["until"], "until") if "until" in item else None
    if until is not None and until <= at:
        raise ValueError("until: must come after at")
    gpu = _gpu_index(
        item.get("gpu"),
        len(gpus),
        required=kind in {"gpu_lost", "ecc", "xid", "mig_layout"},
    )
    xid = 0
    if kind == "xid":
        xid = _count(item.get("xid", 0), "xid")
        if xid == 0:
            raise ValueError("xid: an XID number (e.g. 79) is needed")
    elif "xid" in item:
        raise ValueError(f"xid: only faults of kind xid name an XID, not {kind}")
    mig: tuple[MigProfile, ...] = ()
    if kind == "mig_layout":
        assert gpu is not None
        if gpus[gpu].mig is None:
            raise ValueError(f"mig: GPU {gpu} is not in MIG mode (give it a mig layout)")
        mig = parse_mig_layout(item.get("mig"), gpus[gpu].model)
    elif "mig" in item:
        raise ValueError(f"mig: only faults of kind mig_layout give a layout, not {kind}")
    function, exception = _fault_call(kind, item, gpu)
    default_error = "gpu_is_lost" if kind == "gpu_lost" else "unknown"
    return Fault(
        kind=kind,
        at=at,
        until=until,
        gpu=gpu,
        function=function,
        error=_error_code(item.get("error", default_error)),
        corrected=_count(item.get("corrected", 0), "corrected"),
        uncorrected=_count(item.get("uncorrected", 0), "uncorrected"),
        xid=xid,
        mig=mig,
        exception=exception,
    )


def _fault_call(kind: str, item: Mapping[str, Any], gpu: int | None) -> tuple[str | None, str]:
    """The driver function a fault acts on, and the exception it raises (`exception` faults)."""
    function = item.get("function")
    if kind in {"error", "exception"} or (kind == "hang" and function is not None):
        if function not in NVML_FUNCTIONS:
            raise ValueError(f"function: {function!r} is not an NVML function the simulator offers")
    elif function is not None:
        raise ValueError(
            f"function: only faults of kind error, exception or hang name a function, not {kind}"
        )
    if kind == "hang" and gpu is None and function is None:
        raise ValueError("hang: give the gpu whose calls hang, or the function that does")
    if kind == "exception":
        return function, _choice(
            item.get("exception", "RuntimeError"), tuple(EXCEPTIONS), "exception"
        )
    if "exception" in item:
        raise ValueError(f"exception: only faults of kind exception raise one, not {kind}")
    return function, ""


# -- small validators; each raises ValueError("<field>: <problem>") -----------------------------


def _entry(where: str, spot: str, item: object, parse: Any) -> Any:
    if not isinstance(item, Mapping):
        raise FleetError(f"{where}: {spot}: expected a mapping")
    try:
        return parse(item)
    except KeyError as error:
        raise FleetError(f"{where}: {spot}: missing {error.args[0]!r}") from error
    except (TypeError, ValueError) as error:
        raise FleetError(f"{where}: {spot}: {error}") from error


def _field(where: str, name: str, read: Any) -> Any:
    try:
        return read()
    except (TypeError, ValueError) as error:
        raise FleetError(f"{where}: {name}: {error}") from error


def _list(value: object, where: str, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise FleetError(f"{where}: {name}: expected a list")
    return value


def _only(item: Mapping[str, Any], allowed: set[str], where: str | None = None) -> None:
    unknown = sorted(set(item) - allowed, key=str)
    if unknown:
        message = f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        if where is None:
            raise ValueError(message)
        raise FleetError(f"{where}: {message}")


def _choice(value: object, choices: tuple[str, ...], name: str) -> str:
    text = str(value).replace("-", "_") if name.endswith(("pattern", "kind")) else str(value)
    if text not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return text


def _gpu_index(value: object, gpu_count: int, *, required: bool) -> int | None:
    if value is None:
        if required:
            raise ValueError("gpu: missing")
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < gpu_count:
        raise ValueError(f"gpu: {value!r} is not a GPU index from 0 to {gpu_count - 1}")
    return value


def _seconds(value: object, name: str, *, positive: bool = False) -> float:
    try:
        seconds = parse_duration(str(value))
    except DurationError as error:
        raise ValueError(f"{name}: {error}") from error
    if positive and seconds <= 0:
        raise ValueError(f"{name}: must be longer than 0s")
    return seconds


def _ratio(value: object, name: str) -> float:
    try:
        ratio = float(str(value))
    except ValueError as error:
        raise ValueError(f"{name}: {value!r} is not a number") from error
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{name}: {ratio} is outside 0..1")
    return ratio


def _sized(value: object) -> int:
    try:
        return parse_bytes(value)
    except ValueError as error:
        raise ValueError(f"memory: {error}") from error


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}: {value!r} is not a count")
    return value


def _error_code(value: object) -> int:
    name = str(value).upper()
    code = getattr(pynvml, f"NVML_ERROR_{name}", None)
    if not isinstance(code, int):
        raise ValueError(
            f"error: {value!r} is not an NVML error name (e.g. not_supported, unknown)"
        )
    return code
