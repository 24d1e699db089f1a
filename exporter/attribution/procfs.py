"""Process -> container, read from `<procfs>/<pid>/cgroup` (procfs from `--path.procfs`).

Runs in the sampler's worker thread. A GPU process is read once: its answer is cached under the
identity of its `/proc/<pid>` directory (inode number and change time), which a reused pid does
not keep — the kernel gives a new process a new procfs inode — so each cycle costs one `stat`
per process and a cgroup file is parsed only for a process not seen before. A process that exits
between NVML listing it and this read is normal: it simply attributes to no pod.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from exporter.attribution.cgroups import CgroupFormatError, ContainerRef, container_from_cgroup_file
from exporter.logs import LogOnce

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

log = logging.getLogger(__name__)

MAX_CGROUP_FILE: Final = 64 * 1024
"""A process's cgroup file: one line per hierarchy, a few hundred bytes; past this it is refused."""


@dataclass(frozen=True, slots=True)
class _Known:
    identity: tuple[int, int]
    container: ContainerRef | None
    failed: bool
    """The file could not be read or parsed (not merely: the process is not in a pod)."""


class ProcessContainers:
    """Which container each GPU process runs in, cached per process."""

    def __init__(self, procfs: Path) -> None:
        self._root = str(procfs)
        self._known: dict[int, _Known] = {}
        self._once = LogOnce(log)

    def lookup(self, pids: Iterable[int]) -> tuple[dict[int, ContainerRef], bool]:
        """The container of every pid that runs in one, and whether every file could be read."""
        found: dict[int, ContainerRef] = {}
        known: dict[int, _Known] = {}
        healthy = True
        for pid in pids:
            entry = self._known.get(pid)
            try:
                status = os.stat(f"{self._root}/{pid}")
            except OSError as error:
                if error.errno not in (errno.ENOENT, errno.ESRCH):
                    healthy = False
                    self._unreadable(pid, error)
                continue  # exited since NVML listed it (or unreadable): no pod
            identity = (status.st_ino, status.st_ctime_ns)
            if entry is None or entry.identity != identity:
                entry = self._read(pid, identity)
                if entry is None:
                    continue
            known[pid] = entry
            healthy = healthy and not entry.failed
            if entry.container is not None:
                found[pid] = entry.container
        self._known = known
        return found, healthy

    def _read(self, pid: int, identity: tuple[int, int]) -> _Known | None:
        try:
            with open(f"{self._root}/{pid}/cgroup", encoding="utf-8", errors="replace") as file:
                text = file.read(MAX_CGROUP_FILE + 1)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.ESRCH):
                return None  # exited between the stat and the read
            self._unreadable(pid, error)
            return _Known(identity, None, failed=True)
        try:
            if len(text) > MAX_CGROUP_FILE:
                raise CgroupFormatError(f"longer than {MAX_CGROUP_FILE // 1024} KiB")
            return _Known(identity, container_from_cgroup_file(text), failed=False)
        except CgroupFormatError as error:
            self._once(
                logging.WARNING,
                ("malformed", str(error)),
                "malformed cgroup file; the process attributes to no pod",
                fields={"path": f"{self._root}/{pid}/cgroup", "problem": str(error)},
            )
            return _Known(identity, None, failed=True)

    def _unreadable(self, pid: int, error: OSError) -> None:
        self._once(
            logging.WARNING,
            ("unreadable", error.errno),
            "cannot read a process's cgroup under --path.procfs; it attributes to no pod",
            fields={"path": f"{self._root}/{pid}", "error": os.strerror(error.errno or 0)},
        )
