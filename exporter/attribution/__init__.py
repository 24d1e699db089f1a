"""Pod attribution: who holds each GPU (kubelet PodResources), who actually uses it (NVML
processes + their cgroups), and which pod and workload that is (Kubernetes API).

Modules: `cgroups` (pure cgroup-path parser), `procfs` (process -> container), `pods` (the pod
cache: list + watch), `owners` (pod -> workload), `podresources` (kubelet allocations), `join`
(everything -> who holds and uses each GPU), `cluster` (API configuration and requests),
`jsonstream` (answers read as they arrive, keeping only what is used), `attributor` (one cycle
of all of it). The daemon never imports the `kubernetes` package (about 16 MiB resident) but for
a kubeconfig whose user has an auth-provider, at its first request (`credentials`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from exporter.attribution.cluster import ApiConfig

IN_CLUSTER_ENV: Final = "KUBERNETES_SERVICE_HOST"
KUBECONFIG_ENV: Final = "KUBECONFIG"
SERVICE_ACCOUNT_TOKEN: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"  # noqa: S105 - a path


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    """A usable client configuration and the node whose pods to watch."""

    configuration: ApiConfig
    node_name: str
    source: str
    """Where the configuration came from, for the log: in-cluster, or the kubeconfig path."""


def cluster_configured(
    kubeconfig: Path | None, environ: Mapping[str, str], *, token_file: str = SERVICE_ACCOUNT_TOKEN
) -> bool:
    """Whether there is any cluster configuration: `--kubeconfig`, a pod's service account (the
    in-cluster environment and a mounted token), or `$KUBECONFIG`. Without one, pod attribution
    is off."""
    in_cluster = bool(environ.get(IN_CLUSTER_ENV)) and os.path.isfile(token_file)
    return kubeconfig is not None or in_cluster or bool(environ.get(KUBECONFIG_ENV))
