"""Merge a profile into a ConfigMap, one key per GPU model, through the Kubernetes API.

Read, set this model's key, write back with the `resourceVersion` read: if someone else (the
calibration Job of another GPU type) wrote in between, the API answers 409 Conflict and the merge
starts over from a fresh read, so no model's entry is ever lost. A missing ConfigMap is created;
losing that race (409 AlreadyExists) also starts over. Retries follow `RETRY_DELAYS`; 429 and 5xx
answers and connection failures are retried the same way, any other error is final.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from exporter import documents

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_KUBECONFIG_BYTES: Final = 4 * 2**20
"""A kubeconfig with embedded certificates is a few KiB; many clusters, still far below this."""
RETRY_DELAYS: Final = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds to wait before each retry; the merge is tried once more than there are delays."""
RETRIED_STATUSES: Final = frozenset({409, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT_SECONDS: Final = 15.0
LABELS: Final = {
    "app.kubernetes.io/name": "gpuscope",
    "app.kubernetes.io/component": "calibration",
}


class ConfigMapError(Exception):
    """The profile could not be written; `str()` says where and why, in one line."""


def api_client(kubeconfig: Path | None) -> client.ApiClient:
    """`kubeconfig` if given, else in-cluster credentials, else the `KUBECONFIG` environment."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        elif kubeconfig is not None or os.environ.get("KUBECONFIG"):
            check_kubeconfig(
                str(kubeconfig) if kubeconfig is not None else os.environ["KUBECONFIG"]
            )
            config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig is not None else None,
                client_configuration=configuration,
            )
        else:
            raise ConfigMapError(
                "no Kubernetes API to write to: not in a cluster, and neither --kubeconfig nor "
                "KUBECONFIG is set"
            )
    except (ConfigException, OSError, ValueError, TypeError, AttributeError, KeyError) as error:
        # the client's loader fails on a mapping of the wrong shape with Python's own errors
        raise ConfigMapError(f"cannot load the Kubernetes configuration: {error}") from error
    return client.ApiClient(configuration)


def check_kubeconfig(paths: str) -> None:
    """Read each kubeconfig in `paths` (one, or several as $KUBECONFIG lists them) bounded and
    strict before the client's loader reads it whole: an alias bomb, binary bytes, a key given
    twice or a huge file is one `ConfigMapError` line. Files that do not exist are left to the
    loader, which skips them in a list. The text is never quoted: it holds credentials."""
    for path in filter(None, paths.split(os.pathsep)):
        expanded = Path(path).expanduser()
        if expanded.exists():
            documents.load_file(
                expanded,
                _kubeconfig,
                _unloadable,
                limit=MAX_KUBECONFIG_BYTES,
                secret=True,
            )


def _kubeconfig(document: object) -> None:
    documents.mapping(document, "")


def _unloadable(message: str) -> ConfigMapError:
    return ConfigMapError(f"cannot load the Kubernetes configuration: {message}")


def _reason(error: ApiException) -> str:
    """`403 Forbidden: configmaps "x" is forbidden: ...` from the API's Status body."""
    message = ""
    try:
        body = json.loads(error.body or "")
        if isinstance(body, dict):
            message = str(body.get("message", ""))
    except ValueError:
        message = ""
    head = f"{error.status} {error.reason or ''}".strip()
    return f"{head}: {message}" if message else head


def check_access(api: client.CoreV1Api, namespace: str, name: str) -> None:
    """Fail before a long measurement when the ConfigMap cannot even be read."""
    try:
        api.read_namespaced_config_map(name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS)
    except ApiException as error:
        if error.status in {401, 403}:
            raise ConfigMapError(
                f"cannot read ConfigMap {namespace}/{name}: {_reason(error)}"
            ) from error
    except (urllib3.exceptions.HTTPError, OSError) as error:
        log.warning(
            "Kubernetes API not reachable yet; the write will retry",
            extra={"configmap": f"{namespace}/{name}", "error": str(error)},
        )


def merge_profile(
    api: client.CoreV1Api,
    namespace: str,
    name: str,
    key: str,
    text: str,
    *,
    delays: tuple[float, ...] = RETRY_DELAYS,
    sleep: Callable[[float], None] = time.sleep,
) -> Literal["created", "updated"]:
    """Set `key` to `text` in ConfigMap `namespace/name`, keeping every other key."""
    attempts = len(delays) + 1
    attempt = 1
    while True:
        try:
            return _merge_once(api, namespace, name, key, text)
        except ApiException as error:
            if error.status not in RETRIED_STATUSES or attempt == attempts:
                raise ConfigMapError(
                    f"cannot write ConfigMap {namespace}/{name}: {_reason(error)}"
                ) from error
            cause = _reason(error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            if attempt == attempts:
                raise ConfigMapError(
                    f"cannot write ConfigMap {namespace}/{name}: {error}"
                ) from error
            cause = str(error)
        log.warning(
            "ConfigMap write failed; retrying",
            extra={
                "configmap": f"{namespace}/{name}",
                "attempt": f"#{attempt + 1}/{attempts}",
                "error": cause,
            },
        )
        sleep(delays[attempt - 1])
        attempt += 1


def _merge_once(
    api: client.CoreV1Api, namespace: str, name: str, key: str, text: str
) -> Literal["created", "updated"]:
    try:
        current = api.read_namespaced_config_map(
            name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
    except ApiException as error:
        if error.status != 404:
            raise
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=dict(LABELS)),
            data={key: text},
        )
        api.create_namespaced_config_map(namespace, body, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        return "created"
    data = dict(current.data or {})
    data[key] = text
    current.data = data
    # `current` carries the resourceVersion read: a write in between makes this a 409 Conflict.
    api.replace_namespaced_config_map(
        name, namespace, current, _request_timeout=REQUEST_TIMEOUT_SECONDS
    )
    return "updated"
