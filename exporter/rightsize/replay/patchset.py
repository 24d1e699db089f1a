"""Patches for the winning placement of a policy replay, where Kubernetes can express it. Pure.

The winning placement is the cheapest (`cost_usd_per_month`) of the simulated policies other
than `current` whose replay has `contention_share` 0 and `memory_overcommit_steps` 0; a tie
goes to the fewer GPUs, then to the policy listed first. None wins when no such policy is priced.

Kubernetes cannot say which pods share which GPU, only which nodes a pod may run on and how many
pods a GPU takes, so the set says this much:

- a time-sliced pool (a cluster's time-sliced GPUs of one model, `engine.SharedPool`): a key of
  the NVIDIA device plugin's config file (`version: v1`, `sharing.timeSlicing` with the pool's
  replicas, the resource renamed `nvidia.com/gpu.shared` so that no other pod takes a replica)
  in a ConfigMap, chosen per node by the `nvidia.com/device-plugin.config` label; the pool's
  pods ask for `nvidia.com/gpu.shared` and select that label. The scheduler may put *any*
  `replicas` of the pool's pods on one GPU, so `replicas` is the safe sharing
  (`placement.safe_replicas`), not the placement's: when it is lower, the pool needs more GPUs
  than the placement, and the set says so; below 2 the pool is not written at all;
- MIG: one mig-parted layout (`version: v1`, `mig-configs`) per distinct GPU layout of the
  placement, in a ConfigMap for the MIG manager, chosen per node by `nvidia.com/mig.config`; the
  pods' MIG resource as a recommendation's move names it (`patches.placement_patch`);
- a GPU of its own on another model (or off MIG or time-slicing): the move's resource and
  product node selector.

A pod patch that would let a workload's memory peak exceed what it is given is never written.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import yaml

from exporter.rightsize.replay.policies import CURRENT, POLICIES

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from exporter.rightsize.hardware import Option
    from exporter.rightsize.patches import Patch
    from exporter.rightsize.replay.engine import PolicyResult, SharedPool

DEVICE_PLUGIN_LABEL: Final = "nvidia.com/device-plugin.config"
"""The node label whose value names the device plugin's config (a key of its ConfigMap)."""
MIG_CONFIG_LABEL: Final = "nvidia.com/mig.config"
"""The node label whose value names the mig-parted layout the MIG manager applies."""
SHARED_RESOURCE: Final = "nvidia.com/gpu.shared"
"""`nvidia.com/gpu` as the device plugin renames it on time-sliced nodes (`renameByDefault`)."""
PLUGIN_CONFIGMAP: Final = "gpuscope-time-slicing"
MIG_CONFIGMAP: Final = "gpuscope-mig-parted-config"
OPERATOR_NAMESPACE: Final = "gpu-operator"
CANNOT: Final = (
    (
        "which pods share which GPU: the scheduler puts any of a pool's pods on any of its GPUs, "
        "so a pool's sharing is the one safe for any pods of it together, not the placement's "
        "groups"
    ),
    (
        "memory isolation under time-slicing: a pod can still take more memory than its peak in "
        "the window, and then its GPU's neighbours fail"
    ),
    "per-pod compute limits: time-sliced pods take turns, none is held to its share",
    "which nodes to use: label (for MIG, partition) nodes holding the GPUs each node step counts",
)
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class Manifest:
    """An object to apply as it is (a ConfigMap)."""

    cluster: str
    file: str
    heading: tuple[str, ...]
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeStep:
    """What to do to nodes by hand: the placement cannot name them."""

    cluster: str
    heading: str
    command: tuple[str, ...]
    """kubectl's arguments, `NODE` standing for each node's name."""


@dataclass(frozen=True, slots=True)
class PlacementPatches:
    policy: str
    contains: tuple[str, ...]
    """What the set holds and what it saves, a line each."""
    cannot: tuple[str, ...]
    """What it cannot express, a line each (the pools it could not write among them)."""
    manifests: tuple[Manifest, ...]
    nodes: tuple[NodeStep, ...]
    patches: tuple[Patch, ...]


def winner(results: Sequence[PolicyResult]) -> PolicyResult | None:
    """The winning placement, as the module says."""
    fit = [
        result
        for result in results
        if result.policy != CURRENT
        and result.contention_share == 0
        and result.memory_overcommit_steps == 0
        and result.cost_usd_per_month is not None
    ]
    return min(
        fit,
        key=lambda r: (r.cost_usd_per_month or 0.0, r.gpus.max, POLICIES.index(r.policy)),
        default=None,
    )


def plugin_key(pool: SharedPool) -> str:
    """The device plugin config's name for a pool: a label value (63 characters at most)."""
    return f"gpuscope-{pool.model_key}-x{pool.replicas}"[:63].rstrip("-._")


def pool_limits(pools: Iterable[SharedPool]) -> list[str]:
    """What the set cannot express of each pool: none at all, or not all of its saving."""
    cannot = []
    for pool in pools:
        where = _where(pool.cluster, pool.gpu_model)
        if pool.replicas < 2:
            cannot.append(
                f"the time-sliced {where}: no two of its {pool.pods} pods are safe together "
                "at every step, so it is not written (its workloads stay as they are)"
            )
        elif pool.gpus_needed > pool.gpus:
            cannot.append(
                f"the time-sliced {where}: the placement shares a GPU up to "
                f"{pool.largest_group} ways, but only {pool.replicas} of its pods are safe "
                f"together whichever they are: {pool.gpus_needed} GPUs, not {pool.gpus}"
            )
    return cannot


def time_slicing(
    pools: Iterable[SharedPool], contains: list[str]
) -> tuple[list[Manifest], list[NodeStep]]:
    """Per cluster, the device plugin's ConfigMap with a config per pool, and the node labels."""
    by_cluster: dict[str, list[SharedPool]] = defaultdict(list)
    for pool in pools:
        by_cluster[pool.cluster].append(pool)
    manifests, nodes = [], []
    for cluster, members in sorted(by_cluster.items()):
        data = {}
        for pool in members:
            config = {
                "version": "v1",
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        # Asking for two replicas of a time-sliced GPU buys no more of it.
                        "failRequestsGreaterThanOne": not pool.multi_gpu_pods,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": pool.replicas}],
                    }
                },
            }
            data[plugin_key(pool)] = yaml.safe_dump(config, sort_keys=False)
            contains.append(
                f"time-slicing {_where(cluster, pool.gpu_model)}: {pool.pods} pods of "
                f"{len(pool.members)} workloads on {pool.gpus_needed} GPUs, {pool.replicas} "
                f"per GPU (config {plugin_key(pool)})"
            )
            nodes.append(
                NodeStep(
                    cluster,
                    f"{pool.gpus_needed} {pool.gpu_model} GPUs' worth of nodes: time-sliced "
                    f"{pool.replicas} ways",
                    ("label", "node", "NODE", f"{DEVICE_PLUGIN_LABEL}={plugin_key(pool)}"),
                )
            )
        manifests.append(
            Manifest(
                cluster,
                _file(cluster, "device-plugin-config"),
                (
                    (
                        "The NVIDIA device plugin's time-sliced configs, one per pool: merge "
                        "them into the ConfigMap the plugin reads (GPU operator: ClusterPolicy "
                        "spec.devicePlugin.config.name; its Helm chart: config.name)"
                    ),
                ),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": PLUGIN_CONFIGMAP, "namespace": OPERATOR_NAMESPACE},
                    "data": data,
                },
            )
        )
    return manifests, nodes


def mig_layouts(
    layouts: dict[tuple[str, str], dict[str, Counter[str]]], contains: list[str]
) -> tuple[list[Manifest], list[NodeStep]]:
    """Per cluster, a mig-parted config with each distinct GPU layout, and the node labels."""
    by_cluster: dict[str, dict[str, Any]] = defaultdict(dict)
    nodes = []
    for (cluster, model_key), groups in sorted(layouts.items()):
        counted = Counter(tuple(sorted(profiles.items())) for profiles in groups.values())
        for number, (layout, gpus) in enumerate(sorted(counted.items()), start=1):
            name = f"gpuscope-{model_key}-{number}"[:63].rstrip("-._")
            by_cluster[cluster][name] = [
                {"devices": "all", "mig-enabled": True, "mig-devices": dict(layout)}
            ]
            shown = ", ".join(f"{count} x {profile}" for profile, count in layout)
            contains.append(f"MIG {_where(cluster, model_key)}: {gpus} GPUs as {shown} ({name})")
            nodes.append(
                NodeStep(
                    cluster,
                    f"{gpus} {model_key} GPUs' worth of nodes: every GPU as {shown}",
                    ("label", "node", "NODE", f"{MIG_CONFIG_LABEL}={name}", "--overwrite"),
                )
            )
    manifests = [
        Manifest(
            cluster,
            _file(cluster, "mig-parted-config"),
            (
                (
                    "The MIG manager's layouts: merge them into the mig-parted config it reads "
                    "(GPU operator: ClusterPolicy spec.migManager.config.name, key config.yaml)"
                ),
            ),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": MIG_CONFIGMAP, "namespace": OPERATOR_NAMESPACE},
                "data": {
                    "config.yaml": yaml.safe_dump(
                        {"version": "v1", "mig-configs": configs}, sort_keys=False
                    )
                },
            },
        )
        for cluster, configs in sorted(by_cluster.items())
    ]
    return manifests, nodes


def _where(cluster: str, model: str) -> str:
    return f"pool of {model}" + (f" in {cluster}" if cluster else "")


def workload_label(key: tuple[str, str, str, str]) -> str:
    cluster, namespace, kind, name = key
    return f"{cluster + '/' if cluster else ''}{namespace}/{kind}/{name}"


def option_name(option: Option) -> str:
    profile = option.mig_profile
    return f"a {option.model.name}" + (f" {profile.profile} instance" if profile else "")


def _file(cluster: str, stem: str) -> str:
    prefix = f"{_UNSAFE.sub('_', cluster).strip('.') or '_'}." if cluster else ""
    return f"{prefix[:100]}{stem}.yaml"
