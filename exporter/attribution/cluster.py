"""Access to the Kubernetes API: which cluster configuration to use, and raw GET requests.

Configuration is resolved once at start: `--kubeconfig` when given; else the in-cluster service
account; else `$KUBECONFIG` when set; else none, and pod attribution is off. A configuration that
exists but cannot be used is a configuration error (exit status 2).

Requests go through the `kubernetes` client's own `ApiClient` (its TLS, authentication and token
refresh) but skip its generated API classes and models: importing `CoreV1Api` alone costs ~22 MiB,
and turning 200 pods into model objects costs more CPU than the whole sampling cycle. Bodies are
read as JSON and only the fields gpuscope needs are kept (`exporter.attribution.pod`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import yaml
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    InClusterConfigLoader,
)
from kubernetes.config.kube_config import load_kube_config

from exporter import documents
from exporter.attribution import (
    IN_CLUSTER_ENV,
    KUBECONFIG_ENV,
    SERVICE_ACCOUNT_TOKEN,
    ClusterAccess,
    cluster_configured,
)
from exporter.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from urllib3 import BaseHTTPResponse

PODS_PATH: Final = "/api/v1/pods"
MAX_KUBECONFIG_BYTES: Final = 4 * 2**20
"""A kubeconfig with embedded certificates is a few KiB; many clusters, still far below this."""
_KUBECONFIG_KEYS: Final = ("clusters", "contexts", "users")
_KUBECONFIG_KEYS_TEXT: Final = "clusters, contexts and users"


def resolve_cluster(
    *,
    kubeconfig: Path | None,
    node_name: str | None,
    environ: Mapping[str, str],
    token_file: str = SERVICE_ACCOUNT_TOKEN,
    ca_file: str = SERVICE_CERT_FILENAME,
) -> ClusterAccess | None:
    """The cluster to attribute pods from, or None when there is no cluster configuration.

    Raises `ConfigError` for a configuration that is given but unusable, or a missing node name.
    """
    if not cluster_configured(kubeconfig, environ, token_file=token_file):
        return None
    configuration = Configuration()
    if kubeconfig is not None:
        _load_kubeconfig(str(kubeconfig), configuration, "--kubeconfig")
        source = str(kubeconfig)
    elif environ.get(IN_CLUSTER_ENV) and os.path.isfile(token_file):
        try:
            InClusterConfigLoader(
                token_filename=token_file, cert_filename=ca_file, environ=environ
            ).load_and_set(configuration)
        except (ConfigException, OSError) as error:
            raise ConfigError(
                "in-cluster configuration", f"{error} (is the service account token mounted?)"
            ) from error
        source = "in-cluster"
    else:
        _load_kubeconfig(environ[KUBECONFIG_ENV], configuration, KUBECONFIG_ENV)
        source = environ[KUBECONFIG_ENV]
    if not node_name:
        raise ConfigError(
            "--kubernetes.node-name",
            "needed to watch this node's pods: set NODE_NAME from the downward API "
            "(spec.nodeName) or pass the flag",
        )
    return ClusterAccess(configuration, node_name, source)


def _load_kubeconfig(path: str, configuration: Configuration, setting: str) -> None:
    _check_kubeconfig(path, setting)
    try:
        # persist_config=False: never write refreshed credentials back into the user's file.
        load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
    except yaml.YAMLError as error:
        raise ConfigError(setting, f"{path}: not valid YAML") from error
    except (TypeError, AttributeError, KeyError) as error:
        # the loader meets a mapping of the wrong shape with Python's own errors
        raise ConfigError(
            setting,
            f"{path} is not a kubeconfig: its {_KUBECONFIG_KEYS_TEXT} are not lists of "
            "named entries",
        ) from error
    except (ConfigException, OSError, ValueError) as error:
        problem = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ConfigError(setting, f"{path}: {problem}") from error


def _check_kubeconfig(paths: str, setting: str) -> None:
    """Refuse, in one line, a file that is not a kubeconfig (a key, a binary, anything huge)
    before the client's loader reads it whole and fails inside on a Python error: each file is
    read bounded and strict, its text never quoted (it holds credentials). `paths` may list
    several files, as $KUBECONFIG does; the loader skips those that do not exist."""

    def refused(message: str) -> ConfigError:
        return ConfigError(setting, message)

    for path in filter(None, paths.split(os.pathsep)):
        expanded = Path(path).expanduser()
        if expanded.exists() and os.access(expanded, os.R_OK):  # else the loader says why
            documents.load_file(
                expanded,
                _kubeconfig,
                refused,
                limit=MAX_KUBECONFIG_BYTES,
                secret=True,
                source=f"{path} is not a kubeconfig",
            )


def _kubeconfig(document: object) -> None:
    if not isinstance(document, dict) or not any(key in document for key in _KUBECONFIG_KEYS):
        raise documents.Invalid("", f"expected a mapping of {_KUBECONFIG_KEYS_TEXT}")


class KubernetesClient:
    """GET requests to the API server, answered as raw (streamable) responses. Blocking: call
    from a thread, never from the event loop."""

    def __init__(self, access: ClusterAccess) -> None:
        self._api = ApiClient(access.configuration)

    def get(
        self, path: str, query: list[tuple[str, str]], *, timeout: tuple[float, float]
    ) -> BaseHTTPResponse:
        """The response to `GET path?query`; raises `ApiException` for a status outside 2xx and
        urllib3's errors for a connection that fails."""
        method, url, headers, body, post_params = self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(
            method,
            url,
            header_params=headers,
            body=body,
            post_params=post_params,
            _request_timeout=timeout,
        )
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        raw: BaseHTTPResponse = response.response
        return raw

    def get_object(self, path: str, *, limit: int, timeout: tuple[float, float]) -> object:
        """One object's JSON (`GET path`), read at most `limit` bytes; raises as `get` does, and
        `ValueError` for an answer that is not JSON or is larger."""
        response = self.get(path, [], timeout=timeout)
        try:
            return json.loads(read_bounded(response, limit, path))
        finally:
            response.release_conn()

    def close(self) -> None:
        self._api.close()


class AnswerTooLarge(ValueError):
    """An answer past its size limit; `str()` names it and the limit."""


def read_bounded(response: BaseHTTPResponse, limit: int, what: str) -> bytes:
    """The whole body of an answer, refused (`AnswerTooLarge`) past `limit` bytes before more
    is read; `what` names the answer in the error."""
    body = bytearray()
    for chunk in response.stream(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise AnswerTooLarge(f"{what} is larger than {documents.size_text(limit)}")
    return bytes(body)
