"""Fleet files: the simulated node a YAML file describes, read and checked one way.

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
      - {pid: 2005, gpu: 0, memory: 8GiB, name: /usr/bin/vllm}   # the driver's name for it
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
block (on `gpu` if given): `function: nvmlInit` wedges the library as a whole. An `exception`
fault makes `function` raise a Python exception (`exception: RuntimeError`, the default; see
`EXCEPTIONS`) while it lasts, on `gpu` or on every GPU: what a bug or a driver answer nobody
expected looks like. Which keys each kind of fault takes is `FAULT_KEYS`.

`pods` put the node in a cluster (see `exporter.simulator.cluster`): each names its namespace,
workload (`{kind: Deployment, name: chat}`), labels, containers and the devices the kubelet gave
it; a process names its pod (`pod: serving/chat-7d9c8b6f5-x2x9k`) and container:

    pods:
      - {name: chat-7d9c8b6f5-x2x9k, namespace: serving, workload: {kind: Deployment, name: chat},
         gpus: [1], shared: true}
      - {name: notebook-ana, namespace: lab, gpus: [{gpu: 2, mig_instance: 1}]}

The file is read through `exporter.documents`: at most 1 MiB, UTF-8, no key twice, aliases and
nesting bounded. Anything wrong is a `FleetError` of one line naming the file, the key path
(`gpus[1].mig`, `processes[3].pid`) and the problem; `gpuscope serve` exits 2 with it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

import pynvml

from exporter.catalog import GpuModel, MigProfile, builtin_catalog
from exporter.documents import (
    Invalid,
    choice,
    integer,
    join,
    load_file,
    mapping,
    number,
    one_line,
    quote,
    sequence,
    text,
)
from exporter.nvml.driver import NVML_FUNCTIONS
from exporter.simulator.fleet_pods import check_pods, kubernetes_name, pod, pod_key
from exporter.simulator.fleet_values import (
    byte_size,
    entries,
    gpu_index,
    instance_position,
    seconds,
    spelled,
    version,
)
from exporter.simulator.spec import (
    COOLINGS,
    DEFAULT_MODEL,
    EXCEPTIONS,
    FAULT_KINDS,
    MAX_GPUS,
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    PATTERNS,
    SHARINGS,
    Fault,
    Fleet,
    FleetError,
    SimDevice,
    SimGpu,
    SimPod,
    SimProcess,
    default_fleet,
    simulated_gpu,
)

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "EXCEPTIONS",
    "FAULT_KEYS",
    "FAULT_KINDS",
    "PATTERNS",
    "Fault",
    "Fleet",
    "FleetError",
    "SimDevice",
    "SimGpu",
    "SimPod",
    "SimProcess",
    "default_fleet",
    "fleet_from_document",
    "load_fleet",
    "parse_fleet",
]

FLEET_KEYS: Final = (
    "seed",
    "driver_version",
    "cuda_version",
    "gpus",
    "processes",
    "faults",
    "pods",
)
GPU_KEYS: Final = ("model", "count", "cooling", "sharing", "mig")
PROCESS_KEYS: Final = (
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
    "name",
)
FAULT_KEYS: Final = {
    "gpu_lost": ("gpu", "error"),
    "error": ("gpu", "function", "error"),
    "init_error": ("error",),
    "ecc": ("gpu", "corrected", "uncorrected"),
    "xid": ("gpu", "xid"),
    "mig_layout": ("gpu", "mig"),
    "hang": ("gpu", "function"),
    "exception": ("gpu", "function", "exception"),
}
"""The keys each kind of fault takes besides `kind`, `at` and `until`."""
_ANY_FAULT_KEYS: Final = frozenset({"kind", "at", "until"}.union(*FAULT_KEYS.values()))
FAULT_NEEDS: Final = {
    "gpu_lost": ("gpu",),
    "error": ("function",),
    "ecc": ("gpu",),
    "xid": ("gpu", "xid"),
    "mig_layout": ("gpu", "mig"),
    "exception": ("function",),
}
"""The keys a kind of fault cannot do without."""
_NEEDED: Final = {
    "gpu": "missing: the GPU it happens to",
    "function": "missing: the NVML function it acts on",
    "xid": "an XID number (e.g. 79) is needed",
    "mig": "missing: the GPU's new MIG layout",
}
NVML_ERRORS: Final = {
    name.removeprefix("NVML_ERROR_").lower(): code
    for name, code in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(code, int)
}
"""What `error:` may name (any case): pynvml's error codes without `NVML_ERROR_`."""

MAX_SEED: Final = 2**32 - 1
MAX_PID: Final = 2**22 - 1
"""Linux's largest pid_max."""
_PROCESS_NAME: Final = 1023
"""The longest name NVML can give (its buffer is 1024 bytes with the NUL)."""
MAX_PROCESSES: Final = 4096
MAX_FAULTS: Final = 1024
MAX_PODS: Final = 1024
MAX_COUNTER: Final = 2**32 - 1
"""The most errors one `ecc` fault adds, and the highest XID."""
_DRIVER_VERSION: Final = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}")
_CUDA_VERSION: Final = re.compile(r"(\d{1,3})\.(\d{1,2})")


def load_fleet(path: Path) -> Fleet:
    """The fleet a fleet file describes; `FleetError` for anything wrong with the file."""
    return load_file(path, fleet_from_document, FleetError, source=f"--simulate {path}")


def parse_fleet(document: object, *, where: str = "fleet") -> Fleet:
    """The fleet a document already read describes (a test's dictionary); `FleetError`."""
    try:
        return fleet_from_document(document)
    except Invalid as problem:
        raise FleetError(one_line(f"{where}: {problem}")) from None


def fleet_from_document(document: object) -> Fleet:
    """The fleet a fleet file's document describes; `documents.Invalid` at the first problem."""
    top = mapping(document, "", required=("gpus",), optional=FLEET_KEYS)
    seed = integer(top.get("seed", 0), "seed", low=0, high=MAX_SEED)
    gpus = _gpus(top["gpus"], seed)
    processes = tuple(
        _process(item, join("processes", n), gpus)
        for n, item in enumerate(entries(top.get("processes"), "processes", MAX_PROCESSES))
    )
    _check_processes(processes, gpus)
    faults = tuple(
        _fault(item, join("faults", n), gpus)
        for n, item in enumerate(entries(top.get("faults"), "faults", MAX_FAULTS))
    )
    for n, process in enumerate(processes):
        _check_placement(process, gpus[process.gpu], faults, join("processes", n))
    pods = tuple(
        pod(item, join("pods", n), gpus)
        for n, item in enumerate(entries(top.get("pods"), "pods", MAX_PODS))
    )
    check_pods(pods, processes)
    return Fleet(
        gpus=gpus,
        processes=processes,
        faults=faults,
        seed=seed,
        driver_version=version(
            top.get("driver_version", "570.133.20"), "driver_version", _DRIVER_VERSION, "570.133.20"
        ),
        cuda_version=_cuda_version(top.get("cuda_version", "12.8")),
        pods=pods,
    )


# -- gpus ---------------------------------------------------------------------------------------


def _gpus(value: object, seed: int) -> tuple[SimGpu, ...]:
    gpus: list[SimGpu] = []
    for n, item in enumerate(sequence(value, "gpus", min_items=1, max_items=MAX_GPUS)):
        path = join("gpus", n)
        entry = mapping(item, path, optional=GPU_KEYS)
        model = _model(entry.get("model", DEFAULT_MODEL), join(path, "model"))
        count = integer(entry.get("count", 1), join(path, "count"), low=1, high=MAX_GPUS)
        if len(gpus) + count > MAX_GPUS:
            raise Invalid(
                join(path, "count"), f"makes {len(gpus) + count} GPUs; at most {MAX_GPUS} per node"
            )
        cooling = choice(entry.get("cooling", "normal"), join(path, "cooling"), COOLINGS)
        sharing = choice(entry.get("sharing", "time-slicing"), join(path, "sharing"), SHARINGS)
        mig = _mig_layout(entry["mig"], join(path, "mig"), model) if "mig" in entry else None
        first = len(gpus)
        gpus.extend(
            simulated_gpu(index, model, seed, cooling=cooling, sharing=sharing, mig=mig)
            for index in range(first, first + count)
        )
    return tuple(gpus)


def _model(value: object, path: str) -> GpuModel:
    name = text(value, path, max_length=64)
    model = builtin_catalog().find(name)
    if model is None:
        known = ", ".join(m.key for m in builtin_catalog().models)
        raise Invalid(path, f"unknown GPU model {quote(name)} (known: {known})")
    return model


def _mig_layout(value: object, path: str, model: GpuModel) -> tuple[MigProfile, ...]:
    """A list of profile names that fits one GPU of `model`, as NVIDIA's MIG allows."""
    if not model.mig_profiles:
        raise Invalid(path, f"a {model.name} has no MIG mode")
    layout: list[MigProfile] = []
    for n, item in enumerate(sequence(value, path, max_items=MIG_COMPUTE_SLICES)):
        name = text(item, join(path, n), max_length=32)
        profile = model.mig_profile(name)
        if profile is None:
            known = ", ".join(p.profile for p in model.mig_profiles)
            raise Invalid(
                join(path, n), f"{quote(name)} is not a MIG profile of a {model.name} ({known})"
            )
        if layout.count(profile) >= profile.max_instances:
            raise Invalid(
                join(path, n), f"a {model.name} holds at most {profile.max_instances} {name}"
            )
        layout.append(profile)
    compute = sum(p.compute_slices for p in layout)
    memory = sum(p.memory_slices for p in layout)
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise Invalid(
            path,
            f"the instances need {compute}/{MIG_COMPUTE_SLICES} compute and "
            f"{memory}/{MIG_MEMORY_SLICES} memory slices; they do not fit one GPU",
        )
    return tuple(layout)


# -- processes ----------------------------------------------------------------------------------


def _process(value: object, path: str, gpus: tuple[SimGpu, ...]) -> SimProcess:
    entry = mapping(value, path, required=("pid", "gpu"), optional=PROCESS_KEYS)

    def ratio(key: str, default: float) -> float:
        return number(entry.get(key, default), join(path, key), low=0.0, high=1.0)

    pid = integer(entry["pid"], join(path, "pid"), low=1, high=MAX_PID)
    gpu = gpu_index(entry["gpu"], join(path, "gpu"), gpus)
    memory = byte_size(entry.get("memory", "1GiB"), join(path, "memory"))
    pattern = spelled(entry.get("pattern", "steady"), join(path, "pattern"), PATTERNS)
    start = seconds(entry.get("start", "0s"), join(path, "start"))
    stop = seconds(entry["stop"], join(path, "stop")) if "stop" in entry else None
    if stop is not None and stop <= start:
        raise Invalid(join(path, "stop"), "must come after start")
    return SimProcess(
        pid=pid,
        gpu=gpu,
        memory_bytes=memory,
        pattern=pattern,
        level=ratio("level", 0.0 if pattern == "idle" else 0.8),
        period=seconds(entry.get("period", "20s"), join(path, "period"), positive=True),
        duty=ratio("duty", 0.3),
        memory_intensity=ratio("memory_intensity", 0.4),
        start=start,
        stop=stop,
        tensor_intensity=ratio("tensor_intensity", 0.5),
        mig_instance=(
            instance_position(entry["mig_instance"], join(path, "mig_instance"))
            if "mig_instance" in entry
            else None
        ),
        pod=pod_key(entry["pod"], join(path, "pod")) if "pod" in entry else None,
        name=text(entry.get("name", "python3"), join(path, "name"), max_length=_PROCESS_NAME),
        container=(
            kubernetes_name(entry["container"], join(path, "container"))
            if "container" in entry
            else None
        ),
    )


def _check_processes(processes: tuple[SimProcess, ...], gpus: tuple[SimGpu, ...]) -> None:
    """Each pid once; the processes on a GPU fit its memory."""
    first: dict[int, int] = {}
    for n, process in enumerate(processes):
        if process.pid in first:
            raise Invalid(
                join(join("processes", n), "pid"),
                f"{process.pid} appears more than once (also processes[{first[process.pid]}])",
            )
        first[process.pid] = n
    for gpu in gpus:
        planned = sum(p.memory_bytes for p in processes if p.gpu == gpu.index)
        if planned > gpu.model.nvml_memory_bytes * 0.99:
            raise Invalid(
                "processes",
                f"processes on GPU {gpu.index} need {planned / 2**30:.1f} GiB, more than a "
                f"{gpu.model.name} has ({gpu.model.nvml_memory_bytes / 2**30:.1f} GiB)",
            )


def _check_placement(
    process: SimProcess, gpu: SimGpu, faults: tuple[Fault, ...], path: str
) -> None:
    """A process on a MIG GPU runs on one of its instances (in some layout it will have)."""
    if gpu.mig is None:
        if process.mig_instance is not None:
            raise Invalid(join(path, "mig_instance"), f"GPU {gpu.index} is not in MIG mode")
        return
    if process.mig_instance is None:
        raise Invalid(path, f"GPU {gpu.index} is in MIG mode: give the process a mig_instance")
    layouts = [gpu.mig, *(f.mig for f in faults if f.kind == "mig_layout" and f.gpu == gpu.index)]
    positions = max(len(layout) for layout in layouts)
    if process.mig_instance >= positions:
        raise Invalid(
            join(path, "mig_instance"),
            f"{process.mig_instance} is not an instance of GPU {gpu.index} (it has {positions})",
        )
    first = next(layout for layout in layouts if process.mig_instance < len(layout))
    profile = first[process.mig_instance]
    if process.memory_bytes > profile.memory_bytes:
        raise Invalid(
            join(path, "memory"),
            f"{process.memory_bytes / 2**30:.1f} GiB does not fit a {profile.profile} instance",
        )


# -- faults -------------------------------------------------------------------------------------


def _fault(value: object, path: str, gpus: tuple[SimGpu, ...]) -> Fault:
    entry = mapping(value, path, required=("kind",), optional=_ANY_FAULT_KEYS)
    kind = spelled(entry["kind"], join(path, "kind"), FAULT_KINDS)
    for key in entry:
        if key not in {"kind", "at", "until", *FAULT_KEYS[kind]}:
            takers = [name for name, keys in FAULT_KEYS.items() if key in keys]
            raise Invalid(
                join(path, key), f"only faults of kind {_either(takers)} take it, not {kind}"
            )
    for key in FAULT_NEEDS.get(kind, ()):
        if key not in entry:
            raise Invalid(join(path, key), _NEEDED[key])
    if kind == "hang" and "gpu" not in entry and "function" not in entry:
        raise Invalid(path, "a hang fault needs the gpu whose calls hang, the function, or both")
    at = seconds(entry.get("at", "0s"), join(path, "at"))
    until = seconds(entry["until"], join(path, "until")) if "until" in entry else None
    if until is not None and until <= at:
        raise Invalid(join(path, "until"), "must come after at")
    gpu = gpu_index(entry["gpu"], join(path, "gpu"), gpus) if "gpu" in entry else None
    mig: tuple[MigProfile, ...] = ()
    if kind == "mig_layout":
        assert gpu is not None
        if gpus[gpu].mig is None:
            raise Invalid(join(path, "gpu"), f"GPU {gpu} is not in MIG mode (give it a mig layout)")
        mig = _mig_layout(entry["mig"], join(path, "mig"), gpus[gpu].model)
    function = _function(entry["function"], join(path, "function")) if "function" in entry else None
    error = entry.get("error", "gpu_is_lost" if kind == "gpu_lost" else "unknown")
    xid = integer(entry["xid"], join(path, "xid"), low=1, high=MAX_COUNTER) if kind == "xid" else 0
    exception = entry.get("exception", "RuntimeError")
    return Fault(
        kind=kind,
        at=at,
        until=until,
        gpu=gpu,
        function=function,
        error=_error_code(error, join(path, "error")),
        corrected=_count(entry.get("corrected", 0), join(path, "corrected")),
        uncorrected=_count(entry.get("uncorrected", 0), join(path, "uncorrected")),
        xid=xid,
        mig=mig,
        exception=(
            choice(exception, join(path, "exception"), tuple(EXCEPTIONS))
            if kind == "exception"
            else ""
        ),
    )


def _count(value: object, path: str) -> int:
    return integer(value, path, low=0, high=MAX_COUNTER)


def _function(value: object, path: str) -> str:
    name = text(value, path, max_length=64)
    if name not in NVML_FUNCTIONS:
        raise Invalid(path, f"{quote(name)} is not an NVML function the simulator offers")
    return name


def _error_code(value: object, path: str) -> int:
    code = NVML_ERRORS.get(text(value, path, max_length=64).lower())
    if code is None:
        raise Invalid(
            path,
            f"{quote(value)} is not an NVML error name (e.g. not_supported, unknown)",
        )
    return code


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _cuda_version(value: object) -> int:
    """`"12.8"` as NVML gives it: 12080."""
    major, _, minor = version(value, "cuda_version", _CUDA_VERSION, "12.8").partition(".")
    return int(major) * 1000 + int(minor) * 10
