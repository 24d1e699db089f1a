"""The processes on one GPU or MIG instance: their memory and their share of the GPU's time.

Compute processes and MPS clients are listed apart by NVML (an MPS client can appear in both
lists: it is kept once, with the larger memory figure). Per-process utilization comes from
NVML's accounting since the last call; it is not given on MIG devices. With
`--collect.process-names` each process's name is asked once, when it first appears, and kept
while it stays listed.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING, Final

import pynvml

from exporter.model import ProcessSample

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.nvml.driver import NvmlDriver
    from exporter.nvml.reads import Device, Reads

COLLECTOR: Final = "processes"


def _sample_layout() -> struct.Struct:
    """An nvmlProcessUtilizationSample_t as `struct` reads it: pid, timestamp, SM and memory
    utilization, the rest skipped; the offsets are ctypes' own, so pynvml's layout is followed."""
    sample = pynvml.c_nvmlProcessUtilizationSample_t
    fields = (
        ("I", sample.pid),
        ("Q", sample.timeStamp),
        ("I", sample.smUtil),
        ("I", sample.memUtil),
    )
    layout, end = "=", 0
    for code, field in fields:
        if field.offset < end or field.size != struct.calcsize("=" + code):
            raise RuntimeError("nvmlProcessUtilizationSample_t: unexpected layout")
        layout += f"{field.offset - end}x{code}"
        end = field.offset + field.size
    return struct.Struct(layout)


_SAMPLE: Final = _sample_layout()
"""Read in one C call: pynvml's struct attributes each go through a Python hook, four a process
on every GPU each cycle."""


def read_processes(
    nvml: NvmlDriver, reads: Reads, device: Device, *, names: bool = False
) -> tuple[ProcessSample, ...] | None:
    """Every process on the device, by pid; None when the list cannot be read. `names`: with
    each process's name."""
    handle = device.handle
    compute = reads.call(
        device, "processes", COLLECTOR, nvml.nvmlDeviceGetComputeRunningProcesses, handle
    )
    if compute is None and "processes" in device.unavailable:
        compute = reads.call(
            device,
            "processes_v2",
            COLLECTOR,
            nvml.nvmlDeviceGetComputeRunningProcesses_v2,
            handle,
        )
    if compute is None:
        return None
    mps = reads.call(
        device, "mps_processes", COLLECTOR, nvml.nvmlDeviceGetMPSComputeRunningProcesses, handle
    )
    memory: dict[int, int | None] = {}
    for process in itertools.chain(compute, mps or ()):
        used = process.usedGpuMemory
        if memory.get(process.pid) is None or (used is not None and used > memory[process.pid]):
            memory[process.pid] = used
    busy = _utilization(nvml, reads, device)
    named = _names(nvml, reads, device, memory) if names else {}
    processes = []
    for pid, used in sorted(memory.items()):
        name = named.get(pid)
        if busy is None:
            processes.append(ProcessSample(pid, used, None, None, name))
        else:
            sm, mem = busy.get(pid, (0.0, 0.0))
            processes.append(ProcessSample(pid, used, sm, mem, name))
    return tuple(processes)


def _names(nvml: NvmlDriver, reads: Reads, device: Device, pids: Iterable[int]) -> dict[int, str]:
    """Each listed process's name: "" where the driver cannot name it (the process has ended,
    or is not visible from here). Names are kept while their process stays listed."""
    known = device.process_names
    kept: dict[int, str] = {}
    named: dict[int, str] = {}
    for pid in pids:
        name = known.get(pid)
        if name is None:
            name = _name(nvml, reads, device, pid)
        if name is not None:  # None: failed this time, asked again next cycle
            kept[pid] = name
        named[pid] = name or ""
    device.process_names = kept
    return named


def _name(nvml: NvmlDriver, reads: Reads, device: Device, pid: int) -> str | None:
    """The driver's name for the process, "" for one it cannot name for good, None after an
    error worth asking again."""
    what = "process_name"
    if what in device.unavailable:
        return ""
    try:
        return nvml.nvmlSystemGetProcessName(pid)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NoPermission, UnicodeDecodeError):
        return ""  # ended since it was listed, out of sight, or not text: no name, for good
    except Exception as error:  # noqa: BLE001 - each reading fails alone
        reads.failed(device, what, COLLECTOR, error)
        return "" if what in device.unavailable else None


def _utilization(
    nvml: NvmlDriver, reads: Reads, device: Device
) -> dict[int, tuple[float, float]] | None:
    """Mean SM and memory utilization per pid since the last call; {} = nobody was busy."""
    what = "process_utilization"
    if what in device.unavailable:
        return None
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(device.handle, device.process_timestamp_us)
    except pynvml.NVMLError_NotFound:
        return {}  # no process ran a kernel since the last call: idle, not an error
    except Exception as error:  # noqa: BLE001 - each reading fails alone
        reads.failed(device, what, COLLECTOR, error)
        return None
    sums: dict[int, list[float]] = {}
    newest = device.process_timestamp_us
    for sample in samples:
        pid, stamp, sm, memory = _SAMPLE.unpack_from(sample)
        newest = max(newest, stamp)
        total = sums.setdefault(pid, [0.0, 0.0, 0.0])
        total[0] += sm
        total[1] += memory
        total[2] += 1
    device.process_timestamp_us = newest
    return {
        pid: (min(sm / count / 100.0, 1.0), min(mem / count / 100.0, 1.0))
        for pid, (sm, mem, count) in sums.items()
    }
