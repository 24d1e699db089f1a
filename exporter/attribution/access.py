"""Which cluster to attribute pods from, resolved once at start: `--kubeconfig` when given; else
the in-cluster service account; else `$KUBECONFIG` when set; else none, and pod attribution is
off. A configuration that exists but cannot be used is a configuration error (exit status 2).
Resolving reads files only (`exporter.attribution.kubeconfig`); requests are
`exporter.attribution.cluster`'s.
"""

from __future__ import annotations

import os
import ssl
from typing import TYPE_CHECKING, Final

from exporter import documents
from exporter.attribution import (
    IN_CLUSTER_ENV,
    KUBECONFIG_ENV,
    SERVICE_ACCOUNT_TOKEN,
    ClusterAccess,
    cluster_configured,
)
from exporter.attribution.cluster import ApiConfig, TokenFile, problem_text, tls_context
from exporter.attribution.kubeconfig import load_kubeconfig
from exporter.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

SERVICE_CA: Final = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
IN_CLUSTER_PORT_ENV: Final = "KUBERNETES_SERVICE_PORT"


def resolve_cluster(
    *,
    kubeconfig: Path | None,
    node_name: str | None,
    environ: Mapping[str, str],
    token_file: str = SERVICE_ACCOUNT_TOKEN,
    ca_file: str = SERVICE_CA,
) -> ClusterAccess | None:
    """The cluster to attribute pods from, or None when there is no cluster configuration.

    Raises `ConfigError` for a configuration that is given but unusable, or a missing node name.
    """
    if not cluster_configured(kubeconfig, environ, token_file=token_file):
        return None
    if kubeconfig is not None:
        configuration = load_kubeconfig(str(kubeconfig), "--kubeconfig")
        source = str(kubeconfig)
    elif environ.get(IN_CLUSTER_ENV) and os.path.isfile(token_file):
        configuration = in_cluster(environ, token_file, ca_file)
        source = "in-cluster"
    else:
        configuration = load_kubeconfig(environ[KUBECONFIG_ENV], KUBECONFIG_ENV)
        source = environ[KUBECONFIG_ENV]
    if not node_name:
        raise ConfigError(
            "--kubernetes.node-name",
            "needed to watch this node's pods: set NODE_NAME from the downward API "
            "(spec.nodeName) or pass the flag",
        )
    return ClusterAccess(configuration, node_name, source)


def in_cluster(environ: Mapping[str, str], token_file: str, ca_file: str) -> ApiConfig:
    """The service account's configuration: the API server from the environment Kubernetes
    gives every pod, its token (re-read as the kubelet rotates it) and its CA."""

    def refused(problem: str) -> ConfigError:
        return ConfigError(
            "in-cluster configuration", f"{problem} (is the service account token mounted?)"
        )

    host, port = environ.get(IN_CLUSTER_ENV, ""), environ.get(IN_CLUSTER_PORT_ENV, "")
    if not host or not port:
        raise refused(f"{IN_CLUSTER_ENV} or {IN_CLUSTER_PORT_ENV} is not set")
    try:
        token = TokenFile(token_file)
    except (documents.Invalid, OSError) as error:
        raise refused(f"{token_file}: {problem_text(error)}") from error
    try:
        context = tls_context(ca_file=ca_file)
    except documents.Invalid as problem:
        raise refused(str(problem)) from None
    except (ssl.SSLError, OSError, ValueError) as error:
        raise refused(f"{ca_file}: {problem_text(error)}") from error
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return ApiConfig(f"https://{netloc}", tls=context, authorization=token)
