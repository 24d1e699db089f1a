"""Keep the latest report in a ConfigMap (what the weekly CronJob does with `--configmap`).

Uses the official kubernetes client: in a pod its service account (see
`deploy/rightsize/rbac.yaml`), elsewhere `KUBECONFIG` or `~/.kube/config`. The ConfigMap is
replaced when it exists and created when it does not; only the answers' status is read.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Final

MAX_BYTES: Final = 1024 * 1024
"""The API server refuses ConfigMaps over 1 MiB."""
REQUEST_TIMEOUT_SECONDS: Final = (10.0, 60.0)
"""To connect, and to wait for the answer's status."""
_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class ConfigMapError(Exception):
    """The report could not be stored; `str()` is one line."""


@dataclass(frozen=True, slots=True)
class ConfigMapTarget:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_target(text: str) -> ConfigMapTarget:
    """`NAMESPACE/NAME`."""
    namespace, slash, name = text.strip().partition("/")
    if not slash or not _NAME.fullmatch(namespace) or not _NAME.fullmatch(name):
        raise ValueError(f"{text!r} is not NAMESPACE/NAME (e.g. gpuscope/gpuscope-rightsize)")
    if len(namespace) > 63 or len(name) > 253:
        raise ValueError(f"{text!r}: name too long")
    return ConfigMapTarget(namespace, name)


def write_report(target: ConfigMapTarget, key: str, content: str, *, generated_at: float) -> None:
    """Replace (or create) the ConfigMap so that it holds exactly this report under `key`."""
    size = len(content.encode("utf-8"))
    if size > MAX_BYTES:
        raise ConfigMapError(
            f"the report is {size:,} bytes, over the 1 MiB a ConfigMap holds: use --format "
            "markdown or json, or narrow it with --namespace/--selector"
        )
    # Imported here: the kubernetes client is large and only this output needs it.
    from kubernetes import client, config  # noqa: PLC0415 - see above
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415 - see above
    from urllib3.exceptions import HTTPError  # noqa: PLC0415 - see above

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as error:
            raise ConfigMapError(
                f"cannot write ConfigMap {target}: no in-cluster service account and no usable "
                f"kubeconfig ({error})"
            ) from error
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name=target.name,
            namespace=target.namespace,
            labels={
                "app.kubernetes.io/name": "gpuscope",
                "app.kubernetes.io/component": "rightsize",
            },
            annotations={
                "gpuscope.io/generated-at": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(generated_at)
                )
            },
        ),
        data={key: content},
    )
    path = "/api/v1/namespaces/{namespace}/configmaps"
    names = {"namespace": target.namespace, "name": target.name}
    try:
        with client.ApiClient() as api:
            status, reason = _send(api, "PUT", f"{path}/{{name}}", names, body)
            if status == 404:
                status, reason = _send(api, "POST", path, names, body)
    except (ApiException, HTTPError, OSError) as error:
        raise ConfigMapError(f"cannot write ConfigMap {target}: {error}") from error
    if not 200 <= status <= 299:
        raise ConfigMapError(f"cannot write ConfigMap {target}: HTTP {status} {reason}")


def _send(api: Any, method: str, path: str, names: dict[str, str], body: object) -> tuple[int, str]:
    """The status of `method path` with the ConfigMap as its body. The answer's body is never
    read (the status is all the job needs), so no answer, however large, costs memory."""
    method, url, headers, serialized, post_params = api.param_serialize(
        method=method,
        resource_path=path,
        path_params=names,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(
        method,
        url,
        header_params=headers,
        body=serialized,
        post_params=post_params,
        _request_timeout=REQUEST_TIMEOUT_SECONDS,
    )
    response.response.close()
    return int(response.status), str(response.reason)
