"""Which workload a pod belongs to, as a person would name it. Pure, and no API calls.

Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob, StatefulSet, DaemonSet; anything else
(RayCluster, JobSet, LeaderWorkerSet, ...) by its own kind and name; a pod with no controller is
its own workload. Only pods are watched, so the second hop is read off names the controllers
give: a Deployment's ReplicaSet is `<deployment>-<pod-template-hash>` (and the pod carries that
hash as a label); a CronJob's Job is `<cronjob>-<scheduled time in minutes since the epoch>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
_CRONJOB_JOB: Final = re.compile(r"(?P<cronjob>.+)-(?P<minutes>\d{8,10})")
_CRONJOB_MINUTES: Final = range(23_667_840, 68_374_080)
"""Scheduled times a CronJob's Job name can carry: 2015-01-01 to 2100-01-01, in minutes."""


@dataclass(frozen=True, slots=True)
class OwnerReference:
    kind: str
    name: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    name: str


def workload_of(
    pod_name: str, owners: Sequence[OwnerReference], labels: Mapping[str, str]
) -> Workload:
    """The workload of a pod from its owner references and labels."""
    owner = next((ref for ref in owners if ref.controller), owners[0] if owners else None)
    if owner is None or owner.kind == "Node":  # no controller, or a static pod's mirror
        return Workload("Pod", pod_name)
    if owner.kind == "ReplicaSet":
        template_hash = labels.get(TEMPLATE_HASH_LABEL, "")
        suffix = f"-{template_hash}"
        if template_hash and owner.name.endswith(suffix) and len(owner.name) > len(suffix):
            return Workload("Deployment", owner.name.removesuffix(suffix))
    elif owner.kind == "Job":
        match = _CRONJOB_JOB.fullmatch(owner.name)
        if match is not None and int(match["minutes"]) in _CRONJOB_MINUTES:
            return Workload("CronJob", match["cronjob"])
    return Workload(owner.kind, owner.name)
