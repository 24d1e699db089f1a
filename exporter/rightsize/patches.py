"""Ready-to-apply changes: a strategic-merge patch per recommended change, for its owner object.

A patch sets, in the container the history names (the one the GPU was allocated to, or the
input-bound container):

- the GPU resource in limits and requests: the same count of another whole GPU, one MIG
  instance, or none (an idle GPU released; the old resource is set to null, which a strategic
  merge deletes), or fewer of the same (a replica that never uses some of its GPUs: the
  `nvidia.com/gpu` limit and request become the recommended count). Resource names are the ones the cluster's pods hold (`gpu_allocation_info
  {resource}`): `nvidia.com/mig-<profile>` under the device plugin's mixed MIG strategy,
  `nvidia.com/gpu` and a `nvidia.com/gpu.product` of `<product>-MIG-<profile>` under the single
  one, the pod's own resource name for whole GPUs (a renamed time-slicing resource stays);
- a node selector on `nvidia.com/gpu.product` (the GPU feature discovery label: the NVML name
  with dashes) when the GPU model changes;
- CPU requests and limits for an input-bound container.

The patch is for the workload's owner object: a Deployment's, StatefulSet's, DaemonSet's or
ReplicaSet's pod template (applied live), a CronJob's job template (the next runs), a Job's pod
template (immutable once created: apply it to the manifest for the next run), a bare Pod's spec
(its resources are immutable: apply it to the manifest and re-create the pod). For any other kind
(a RayCluster, a JobSet, ...) gpuscope does not know where the pod template lives, and says what to
change instead. Pure.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from exporter.rightsize.names import name_problem
from exporter.rightsize.strategy import FEWER_GPUS, gpus_per_pod

if TYPE_CHECKING:
    from collections.abc import Iterable

    from exporter.catalog import GpuModel
    from exporter.rightsize.hardware import Option
    from exporter.rightsize.history import ResourceUse, WorkloadHistory
    from exporter.rightsize.strategy import Recommendation

PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
WHOLE_GPU: Final = "nvidia.com/gpu"
MIG_PREFIX: Final = "nvidia.com/mig-"
POD_TEMPLATES: Final[dict[str, tuple[tuple[str, ...], bool]]] = {
    "Deployment": (("spec", "template", "spec"), True),
    "StatefulSet": (("spec", "template", "spec"), True),
    "DaemonSet": (("spec", "template", "spec"), True),
    "ReplicaSet": (("spec", "template", "spec"), True),
    "CronJob": (("spec", "jobTemplate", "spec", "template", "spec"), True),
    "Job": (("spec", "template", "spec"), False),
    "Pod": (("spec",), False),
}
"""Where each owner kind keeps its pod spec, and whether `kubectl patch` may change it live."""
IMMUTABLE: Final[dict[str, str]] = {
    "Job": (
        "a Job's pod template cannot change once it is created: apply the patch to the Job's "
        "manifest for its next run"
    ),
    "Pod": (
        "a bare Pod's resources cannot change: apply the patch to its manifest and re-create "
        "the pod (better: run it under a Deployment)"
    ),
}
"""Why a kind's patch cannot be applied to the running object."""
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class Patch:
    """The change for one workload's owner object."""

    cluster: str
    namespace: str
    kind: str
    name: str
    container: str
    changes: tuple[str, ...]
    """What it changes, one line each (`nvidia.com/gpu: 1 -> removed`)."""
    body: dict[str, Any] | None
    """The strategic-merge patch of the owner object; None when its kind's pod template is not
    known (then `note` says what to change by hand)."""
    live: bool
    """`kubectl patch` on the running object works (a Job's or bare Pod's cannot change)."""
    note: str = ""
    """What to know before applying it."""
    skipped: str = ""
    """Why it was left out (a name Kubernetes would refuse: a forged label), or ""."""

    @property
    def file(self) -> str:
        """The patch's file name: the workload's, safe on any file system."""
        parts = [self.cluster] if self.cluster else []
        parts += [self.namespace, self.kind.lower(), self.name]
        stem = ".".join(_UNSAFE.sub("_", part).strip(".") or "_" for part in parts)
        return f"{stem[:200]}.yaml"

    @property
    def resource(self) -> str:
        """kubectl's `TYPE/NAME` of the owner object."""
        return f"{self.kind.lower()}/{self.name}"

    def command(self, path: str | None = None) -> list[str]:
        """The kubectl command that applies it (arguments, unquoted): to the live object, or
        for a kind that cannot change live, to its manifest (`MANIFEST.yaml`). Every value is
        an option's `--flag=value` or comes after `--`: none can be read as an option."""
        file = path or self.file
        if not self.live:
            return [
                "kubectl",
                "patch",
                "--local",
                "--filename=MANIFEST.yaml",
                "--type=strategic",
                f"--patch-file={file}",
                "--output=yaml",
            ]
        context = [f"--context={self.cluster}"] if self.cluster else []
        return [
            "kubectl",
            *context,
            f"--namespace={self.namespace}",
            "patch",
            "--type=strategic",
            f"--patch-file={file}",
            "--",
            self.kind.lower(),
            self.name,
        ]


@dataclass(frozen=True, slots=True)
class _Change:
    """What a recommendation changes in the pod spec."""

    resources: dict[str, dict[str, Any]]
    """Container -> its `resources` patch."""
    changes: tuple[str, ...]
    selector: dict[str, str] = field(default_factory=dict)
    note: str = ""


def build_patch(
    workload: WorkloadHistory,
    recommendation: Recommendation,
    inventory: Iterable[ResourceUse],
    seen_models: Iterable[str] = (),
) -> Patch | None:
    """The patch that applies `recommendation` (None when it changes nothing). `inventory` are
    the GPU resources the clusters hold, `seen_models` the NVML names in the history (for the
    product label)."""
    if recommendation.action == "add CPU":
        change = _cpu_change(recommendation)
    elif recommendation.action in {"release", "move", FEWER_GPUS}:
        held = [use for use in inventory if use.cluster == workload.cluster]
        change = _gpu_change(workload, recommendation, held, list(seen_models))
    else:
        return None
    if change is None:
        return None
    return _patch(workload, change)


def placement_patch(
    workload: WorkloadHistory,
    current: Option | None,
    target: Option,
    inventory: Iterable[ResourceUse],
    seen_models: Iterable[str] = (),
    *,
    shared_resource: str | None = None,
    selector: dict[str, str] | None = None,
    note: str = "",
) -> Patch | None:
    """The patch that moves a workload where a simulated placement puts it (None when nothing
    changes): `target`'s resource as a recommendation's move would name it, or `shared_resource`
    (a time-sliced pool's) with as many of it as the pod holds GPUs now; `selector` joins the
    node selector."""
    devices = workload.devices
    if not devices:
        return None
    resource = Counter(d.resource for d in devices).most_common(1)[0][0] or WHOLE_GPU
    container = Counter(d.container for d in devices).most_common(1)[0][0]
    count = max(gpus_per_pod(workload), 1)
    chosen: dict[str, str] = {}
    if shared_resource is not None:
        name, number, why = shared_resource, count, ""
    else:
        held = [use for use in inventory if use.cluster == workload.cluster]
        name, number, chosen, why = _target_resource(
            current, target, resource, count, inventory=held, seen_models=list(seen_models)
        )
    chosen = {**chosen, **(selector or {})}
    if name == resource and number == count and not chosen:
        return None
    gpu = _gpu(resource, None) if name != resource else {"limits": {}, "requests": {}}
    gpu["limits"][name] = number
    gpu["requests"][name] = number
    changes = (
        *(
            (f"{resource}: {count} -> {name}: {number}",)
            if (name, number) != (resource, count)
            else ()
        ),
        *(f"nodeSelector {key}: {value}" for key, value in chosen.items()),
    )
    return _patch(
        workload, _Change({container: gpu}, changes, chosen, " ".join(filter(None, (why, note))))
    )


def _patch(workload: WorkloadHistory, change: _Change) -> Patch:
    """The patch of the workload's owner object that makes `change`, or what to do by hand."""
    containers = list(change.resources)
    problem = name_problem(
        cluster=workload.cluster,
        namespace=workload.namespace,
        kind=workload.kind,
        name=workload.name,
        containers=containers,
        resources={device.resource for device in workload.devices},
    )
    if problem is not None:
        return Patch(
            workload.cluster,
            workload.namespace,
            workload.kind,
            workload.name,
            "",
            (),
            None,
            live=False,
            note=f"skipped: {problem}, so no patch nor command is made for it (a forged label?)",
            skipped=problem,
        )
    if not all(containers):
        return _by_hand(
            workload,
            change.changes,
            "the history does not name the container (no container label on "
            "gpu_allocation_info): make these changes by hand",
        )
    notes = [change.note] if change.note else []
    if not any(pod.present for pod in workload.pods) and workload.kind not in {"Job", "CronJob"}:
        notes.append("no pod held it at the end of the window: check that it still exists")
    where = POD_TEMPLATES.get(workload.kind)
    if where is None:
        notes.append(
            f"gpuscope does not know where a {workload.kind}'s pod template lives: make these "
            f"changes in its pod template: {'; '.join(change.changes)}"
        )
        return _by_hand(workload, change.changes, " ".join(notes), containers[0])
    pod_spec: dict[str, Any] = {
        "containers": [{"name": name, "resources": body} for name, body in change.resources.items()]
    }
    if change.selector:
        pod_spec["nodeSelector"] = change.selector
    path, live = where
    if workload.kind in IMMUTABLE:
        notes.append(IMMUTABLE[workload.kind])
    body: dict[str, Any] = pod_spec
    for key in reversed(path):
        body = {key: body}
    return Patch(
        workload.cluster,
        workload.namespace,
        workload.kind,
        workload.name,
        containers[0],
        change.changes,
        body,
        live=live,
        note=" ".join(notes),
    )


def _gpu_change(
    workload: WorkloadHistory,
    recommendation: Recommendation,
    inventory: list[ResourceUse],
    seen_models: list[str],
) -> _Change | None:
    devices = workload.devices
    if not devices:
        return None
    resource = Counter(d.resource for d in devices).most_common(1)[0][0] or WHOLE_GPU
    container = Counter(d.container for d in devices).most_common(1)[0][0]
    count = max(gpus_per_pod(workload), 1)
    if recommendation.action == "release":
        return _Change({container: _gpu(resource, None)}, (f"{resource}: {count} -> removed",))
    fewer = recommendation.recommended_gpus
    if fewer is not None:
        return _Change(
            {container: _gpu(resource, fewer)},
            (f"{resource}: {count} -> {fewer}",),
            note=(
                f"each replica then gets {fewer} {'GPU' if fewer == 1 else 'GPUs'}: start as "
                "many workers as it is given (torchrun --nproc-per-node, a device count in its "
                "arguments), not a number fixed to the old count"
            ),
        )
    target = recommendation.target
    if target is None:
        return None
    name, number, selector, note = _target_resource(
        recommendation.current,
        target,
        resource,
        count,
        inventory=inventory,
        seen_models=seen_models,
    )
    gpu = _gpu(resource, None) if name != resource else {"limits": {}, "requests": {}}
    gpu["limits"][name] = number
    gpu["requests"][name] = number
    changes = (
        f"{resource}: {count} -> {name}: {number}",
        *(f"nodeSelector {key}: {value}" for key, value in selector.items()),
    )
    return _Change({container: gpu}, changes, selector, note)


def _cpu_change(recommendation: Recommendation) -> _Change | None:
    wanted: dict[str, float] = {}
    limits: dict[str, float] = {}
    for change in recommendation.cpu_changes:
        wanted[change.container] = max(wanted.get(change.container, 0.0), change.recommended_cores)
        limits[change.container] = max(limits.get(change.container, 0.0), change.limit_cores)
    if not wanted:
        return None
    resources: dict[str, dict[str, Any]] = {}
    changes = []
    for name, cores in sorted(wanted.items()):
        quantity = cpu_quantity(cores)
        resources[name] = {"limits": {"cpu": quantity}, "requests": {"cpu": quantity}}
        changes.append(f"{name} CPU: limit {limits[name]:g} -> {quantity}, request {quantity}")
    return _Change(resources, tuple(changes))


def _by_hand(
    workload: WorkloadHistory, changes: tuple[str, ...], note: str, container: str = ""
) -> Patch:
    """A change gpuscope cannot write as a patch: what to change, and why by hand."""
    return Patch(
        workload.cluster,
        workload.namespace,
        workload.kind,
        workload.name,
        container,
        changes,
        None,
        live=False,
        note=note,
    )


def _gpu(resource: str, count: int | None) -> dict[str, Any]:
    """Limits and requests of one GPU resource (None: remove it)."""
    return {"limits": {resource: count}, "requests": {resource: count}}


def _target_resource(
    current: Option | None,
    target: Option,
    resource: str,
    count: int,
    *,
    inventory: list[ResourceUse],
    seen_models: list[str],
) -> tuple[str, int, dict[str, str], str]:
    """The resource name and count to ask for, the node selector and a note."""
    moving = current is None or current.model.key != target.model.key
    product = product_name(target.model, seen_models)
    if target.mig_profile is None:
        whole = {use.resource for use in inventory if use.mig_profile is None}
        if current is not None and current.mig_profile is None and current.shared_by == 1:
            name = resource
        elif WHOLE_GPU in whole or not whole:
            name = WHOLE_GPU
        else:
            name = sorted(whole)[0]
        return name, count, {PRODUCT_LABEL: product} if moving else {}, ""
    profile = target.mig_profile.profile
    mixed = f"{MIG_PREFIX}{profile}"
    names = {use.resource for use in inventory}
    selector = {PRODUCT_LABEL: product} if moving else {}
    if mixed in names:
        return mixed, 1, selector, ""
    if any(name.startswith(MIG_PREFIX) for name in names):
        return (
            mixed,
            1,
            selector,
            (
                f"no pod holds {mixed} yet: partition the GPUs of {target.model.name} nodes into "
                f"{profile} instances first (the GPU operator's nvidia.com/mig.config node label)"
            ),
        )
    single = sorted({use.resource for use in inventory if use.mig_profile is not None})
    if single:
        return (
            single[0],
            1,
            {PRODUCT_LABEL: f"{product}-MIG-{profile}"},
            (
                "MIG's single strategy: the node selector picks nodes whose GPUs are all "
                f"partitioned into {profile} instances"
            ),
        )
    return (
        mixed,
        1,
        selector,
        (
            f"no MIG instance is in use in this cluster: enable MIG on {target.model.name} "
            f"nodes (the device plugin's mixed strategy) and partition their GPUs into {profile} "
            "instances first"
        ),
    )


def product_name(model: GpuModel, seen: Iterable[str] = ()) -> str:
    """The `nvidia.com/gpu.product` label of a model: the NVML name the cluster reports (else the
    catalog's first) with dashes for spaces, as GPU feature discovery writes it."""
    names = set(seen)
    name = next((n for n in model.nvml_names if n in names), model.nvml_names[0])
    return name.replace(" ", "-")


def cpu_quantity(cores: float) -> str:
    """A CPU quantity Kubernetes reads: whole cores as `8`, others in millicores (`9500m`)."""
    if float(cores).is_integer():
        return str(int(cores))
    return f"{math.ceil(cores * 1000)}m"
