"""Which Kubernetes container a process belongs to, from the text of `/proc/<pid>/cgroup`. Pure.

The kubelet puts every container in a cgroup whose path carries the pod UID and the container
id, in a handful of shapes (systemd or cgroupfs driver; containerd, CRI-O or docker; QoS tier
slices; static pods with 32-hex UIDs; cgroup v1 and v2). Under a private cgroup namespace the
path is relative (`/../../kubepods-...`), so paths are matched by what they contain, never by
where they start. A path that is not a Kubernetes container's attributes to no pod: a wrong pod
is worse than none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_UID_DASHED: Final = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UID_UNDERSCORED: Final = r"[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}"
_UID_STATIC: Final = r"[0-9a-f]{32}"
"""Static pods: the kubelet names them by a hash of their manifest, 32 hex digits, no dashes."""
_CONTAINER_ID: Final = r"[0-9a-f]{64}"

# systemd driver: kubepods[-besteffort|-burstable]-pod<uid with _>.slice, optionally under a
# custom kubelet root slice (kind: kubelet-kubepods-...).
_SYSTEMD_POD: Final = re.compile(
    rf"(?:[a-z0-9_]+-)?kubepods(?:-besteffort|-burstable)?-pod(?P<uid>{_UID_UNDERSCORED}|{_UID_STATIC})\.slice"
)
# cgroupfs driver: .../kubepods[/besteffort|/burstable]/pod<uid with ->/<container id>.
_CGROUPFS_POD: Final = re.compile(rf"pod(?P<uid>{_UID_DASHED}|{_UID_STATIC})")
_CGROUPFS_PARENTS: Final = frozenset({"kubepods", "besteffort", "burstable", ".."})
"""What may stand right above a cgroupfs pod directory; `..` when a cgroup namespace cut the rest."""
# systemd scopes: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope, ...; CRI-O
# under the cgroupfs driver drops the `.scope`.
_SCOPE: Final = re.compile(rf"(?P<runtime>[a-z][a-z0-9-]*)-(?P<id>{_CONTAINER_ID})(?:\.scope)?")
_BARE_ID: Final = re.compile(_CONTAINER_ID)
# containerd on a cgroup v1 systemd hierarchy names the container inside one component:
# kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>
_COLON_FORM: Final = re.compile(
    rf"(?P<pod>[^:]+\.slice):(?P<runtime>[a-z][a-z0-9-]*):(?P<id>{_CONTAINER_ID})"
)
_MONITORS: Final = frozenset({"crio-conmon"})
"""CRI-O's conmon runs in a scope named after the container but is not the container."""


class CgroupFormatError(ValueError):
    """The file is not a cgroup file at all; `str()` says what was wrong."""


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A pod UID (as the API and `metadata.uid` spell it, or a static pod's 32-hex hash) and the
    64-hex id of a container in it (the part after `containerd://` in the pod's status)."""

    pod_uid: str
    container_id: str


def container_from_cgroup_path(path: str) -> ContainerRef | None:
    """The container a cgroup path belongs to, or None if the path is not a pod's container."""
    parts = [part for part in path.split("/") if part]
    for index, part in enumerate(parts):
        colon = _COLON_FORM.fullmatch(part)
        if colon is not None:
            pod = _SYSTEMD_POD.fullmatch(colon["pod"])
            if pod is None or colon["runtime"] in _MONITORS:
                return None
            return ContainerRef(_canonical_uid(pod["uid"]), colon["id"])
        pod = _SYSTEMD_POD.fullmatch(part)
        if pod is None:
            pod = _CGROUPFS_POD.fullmatch(part)
            if pod is None or index == 0 or parts[index - 1] not in _CGROUPFS_PARENTS:
                continue
        # The container is the next component; anything deeper (crun's `/container`, a
        # container's own sub-cgroups) still belongs to it.
        if index + 1 >= len(parts):
            return None
        container_id = _container_id(parts[index + 1])
        return ContainerRef(_canonical_uid(pod["uid"]), container_id) if container_id else None
    return None


def _container_id(part: str) -> str | None:
    scope = _SCOPE.fullmatch(part)
    if scope is not None:
        return None if scope["runtime"] in _MONITORS else scope["id"]
    return part if _BARE_ID.fullmatch(part) else None


def _canonical_uid(uid: str) -> str:
    return uid.replace("_", "-")


def container_from_cgroup_file(text: str) -> ContainerRef | None:
    """The container a process belongs to, from its whole `/proc/<pid>/cgroup` file.

    cgroup v2 has one line `0::<path>`; v1 has one line per hierarchy, `N:<controllers>:<path>`.
    Every line that names a container must name the same one; if two disagree the answer is
    None rather than a guess. Raises `CgroupFormatError` when no line has the `N:...:path` form.
    """
    found: ContainerRef | None = None
    lines = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        hierarchy, sep1, rest = line.partition(":")
        _controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hierarchy.isdigit() and path.startswith("/")):
            raise CgroupFormatError(f"line {lines + 1} is not hierarchy:controllers:/path")
        lines += 1
        ref = container_from_cgroup_path(path)
        if ref is None:
            continue
        if found is not None and ref != found:
            return None
        found = ref
    if lines == 0:
        raise CgroupFormatError("empty")
    return found
