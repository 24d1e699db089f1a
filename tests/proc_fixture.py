"""The fixture procfs tree (tests/fixtures/proc): one process per cgroup path shape the kubelet
makes, plus processes outside Kubernetes and broken files. Tests, the fake API server's pods and
the end-to-end fleet all refer to these pids, UIDs and container ids."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from exporter.attribution.cgroups import ContainerRef

PROC: Final = Path(__file__).resolve().parent / "fixtures" / "proc"


def container_id(n: int) -> str:
    return f"{n:02x}" * 32


def pod_uid(n: int) -> str:
    return f"{n:08x}-{n:04x}-4{n:03x}-8{n:03x}-{n:012x}"


STATIC_UID: Final = "b1e89a2fcc688644de3eb95aee8025ce"

EXPECTED: Final[dict[int, ContainerRef | None]] = {
    1001: ContainerRef(pod_uid(1), container_id(1)),  # systemd, containerd, burstable, v2
    1002: ContainerRef(pod_uid(2), container_id(2)),  # systemd, CRI-O under crun, besteffort
    1003: ContainerRef(pod_uid(3), container_id(3)),  # systemd, containerd, Guaranteed
    1004: ContainerRef(pod_uid(4), container_id(4)),  # cgroupfs, docker, burstable, v1
    1005: ContainerRef(pod_uid(5), container_id(5)),  # cgroupfs, Guaranteed, v1
    1006: ContainerRef(pod_uid(6), container_id(6)),  # systemd, docker
    1007: ContainerRef(pod_uid(7), container_id(7)),  # containerd on a v1 systemd hierarchy
    1008: ContainerRef(pod_uid(8), container_id(8)),  # kind: kubelet.slice root
    1009: ContainerRef(STATIC_UID, container_id(9)),  # static pod, systemd
    1010: ContainerRef(pod_uid(10), container_id(10)),  # private cgroup namespace, systemd
    1011: ContainerRef(pod_uid(11), container_id(11)),  # private cgroup namespace, cgroupfs
    1012: None,  # CRI-O's conmon: not the container
    1013: None,  # docker outside Kubernetes
    1014: None,  # a login session
    1015: None,  # malformed
    1016: None,  # empty
    1017: ContainerRef(pod_uid(17), container_id(17)),  # CRI-O, cgroupfs driver
    1018: None,  # v1 hierarchies that disagree
    1019: ContainerRef(STATIC_UID, container_id(19)),  # static pod, cgroupfs
}
MALFORMED: Final = frozenset({1015, 1016})
