"""Access to the Kubernetes API: which cluster configuration to use, and raw GET requests.

Configuration is resolved once at start: `--kubeconfig` when given; else the in-cluster service
account; else `$KUBECONFIG` when set; else none, and pod attribution is off. A configuration that
exists but cannot be used is a configuration error (exit status 2).

The daemon asks the API server for three things only (its node's pods and ResourceSlices, list
and watch, and a claim or DeviceClass now and then), as GETs answered with JSON, so it speaks
HTTP through urllib3 itself and reads the service account and kubeconfigs itself
(`exporter.attribution.kubeconfig`): the `kubernetes` package would cost every GPU node ~16 MiB
of resident memory for that (its client, models and configuration loaders). Only a kubeconfig
whose user authenticates through an `auth-provider` has that package get its token, imported
then and only then (`exporter.attribution.credentials`, which also runs `exec` plugins).
Resolving the configuration reads files only: credentials that take running something are got
by the first request that needs them, in a background thread, so the daemon serves from its
start whatever they cost. Bodies are read as they arrive and only the fields gpuscope needs are
kept (`exporter.attribution.jsonstream`).
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

import urllib3

from exporter import documents
from exporter.attribution import (
    IN_CLUSTER_ENV,
    KUBECONFIG_ENV,
    SERVICE_ACCOUNT_TOKEN,
    ClusterAccess,
    cluster_configured,
)
from exporter.attribution.jsonstream import CHUNK_BYTES, JsonStream
from exporter.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from urllib3 import BaseHTTPResponse

    from exporter.attribution.jsonstream import Shape

PODS_PATH: Final = "/api/v1/pods"
SERVICE_CA: Final = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
IN_CLUSTER_PORT_ENV: Final = "KUBERNETES_SERVICE_PORT"
TOKEN_SECONDS: Final = 60.0
"""A token file (the service account's is rotated by the kubelet) is read again after this long."""
MAX_TOKEN_BYTES: Final = 64 * 1024
UNAUTHORIZED: Final = 401
MAX_OBJECT_BYTES: Final = 8 * 1024 * 1024
"""One object as the API serves it in JSON. etcd holds at most 1.5 MiB of an object (encoded as
protobuf), which JSON can spell about three times longer (a list of tiny entries repeats its
field names); past this it is no object etcd could hold, and is refused. Only a limit on what is
read: objects are read as they arrive, and only what attribution uses of them is kept."""


class ApiError(Exception):
    """The API server answered with a status outside 2xx."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.reason}"


class CredentialError(Exception):
    """Credentials for the API server cannot be had now (an exec plugin failed, or did not
    answer in time); `str()` says why in one line. Whatever makes them has logged it once."""


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """How to reach one API server: its URL, TLS and the Authorization header."""

    host: str
    """`https://10.0.0.1:443`, no trailing slash."""
    tls: ssl.SSLContext | None = None
    """Server verification and client certificate; None for a plain-HTTP server."""
    tls_server_name: str | None = None
    """The name the server's certificate is checked against, when not the host's."""
    proxy: str | None = None
    authorization: Callable[[], str | None] = lambda: None
    """The Authorization header of the next request (a token is re-read when due, an exec
    plugin run when its credentials expire); may raise `CredentialError`."""
    client_tls: Callable[[], ssl.SSLContext | None] | None = None
    """For credentials that bring a client certificate (an exec plugin's): the TLS context of
    the next request, a new one whenever the certificate changes; may raise `CredentialError`."""
    rejected: Callable[[], None] = lambda: None
    """Told when the API server refuses the credentials (401): credentials that can be made
    again (an exec plugin's) are, for the next request."""


class TokenFile:
    """A bearer token read from a file, again every `TOKEN_SECONDS` (tokens are rotated). The
    watch threads and the kubelet poller share one: locked."""

    def __init__(self, path: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._header = self._read()
        self._read_at = clock()

    def _read(self) -> str:
        token = documents.decode(documents.read_bounded(Path(self._path), MAX_TOKEN_BYTES)).strip()
        if not token:
            raise documents.Invalid("", "the token file is empty")
        return f"Bearer {token}"

    def __call__(self) -> str:
        with self._lock:
            if self._clock() - self._read_at >= TOKEN_SECONDS:
                try:  # a token being rotated: keep the last one until the new one reads
                    self._header = self._read()
                    self._read_at = self._clock()
                except (documents.Invalid, OSError):
                    self._read_at = self._clock()  # and ask again a minute later
            return self._header


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
    from exporter.attribution.kubeconfig import load_kubeconfig  # noqa: PLC0415 - with a cluster only

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
        raise refused(f"{token_file}: {_problem(error)}") from error
    try:
        context = tls_context(ca_file=ca_file)
    except (ssl.SSLError, OSError, ValueError) as error:
        raise refused(f"{ca_file}: {_problem(error)}") from error
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return ApiConfig(f"https://{netloc}", tls=context, authorization=token)


def tls_context(
    *,
    ca_file: str | None = None,
    ca_data: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    cert_data: str | None = None,
    key_data: str | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client TLS context: the server checked against the CA given (else the system's), and a
    client certificate if given, from files or PEM text; `verify` False checks nothing
    (insecure-skip-tls-verify)."""
    context = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_data is None and key_data is None:
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
        return context
    # The ssl module loads a client certificate from files only: a private directory that
    # lives for the loading alone.
    with tempfile.TemporaryDirectory(prefix="gpuscope-") as scratch:
        if cert_data is not None:
            cert_file = _private_file(Path(scratch) / "client.crt", cert_data)
        if key_data is not None:
            key_file = _private_file(Path(scratch) / "client.key", key_data)
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
    return context


def _private_file(path: Path, content: str) -> str:
    path.touch(mode=0o600)
    path.write_text(content)
    return str(path)


def _problem(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


class KubernetesClient:
    """GET requests to the API server, answered as raw (streamable) responses. Blocking: call
    from a thread, never from the event loop."""

    def __init__(self, access: ClusterAccess) -> None:
        config = access.configuration
        self._config = config
        self._tls = config.tls
        self._pool = self._new_pool(config.tls)

    def _new_pool(self, tls: ssl.SSLContext | None) -> urllib3.PoolManager:
        config = self._config
        options: dict[str, Any] = {"maxsize": 2, "block": False}
        if tls is not None:
            options["ssl_context"] = tls
            options["cert_reqs"] = tls.verify_mode
            if config.tls_server_name:
                options["server_hostname"] = config.tls_server_name
            if not tls.check_hostname and tls.verify_mode == ssl.CERT_NONE:
                options["assert_hostname"] = False
        if config.proxy:
            return _proxy_manager(config.proxy, options)
        return urllib3.PoolManager(**options)

    def get(
        self, path: str, query: list[tuple[str, str]], *, timeout: tuple[float, float]
    ) -> BaseHTTPResponse:
        """The response to `GET path?query`; raises `ApiError` for a status outside 2xx,
        `CredentialError` when there are no credentials to send, and urllib3's errors for a
        connection that fails."""
        headers = {"Accept": "application/json", "User-Agent": "gpuscope"}
        authorization = self._config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if self._config.client_tls is not None:
            tls = self._config.client_tls()
            if tls is not self._tls:  # a new client certificate: new connections present it
                self._pool.clear()
                self._pool = self._new_pool(tls)
                self._tls = tls
        url = self._config.host + path + (f"?{urlencode(query)}" if query else "")
        response = self._pool.request(
            "GET",
            url,
            headers=headers,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            preload_content=False,
            redirect=False,
        )
        if not 200 <= response.status <= 299:
            response.drain_conn()
            response.release_conn()
            if response.status == UNAUTHORIZED:
                self._config.rejected()
            raise ApiError(response.status, response.reason or "")
        return response

    def get_object(
        self, path: str, shape: Shape, *, limit: int, timeout: tuple[float, float]
    ) -> object:
        """What `shape` keeps of one object (`GET path`), read as it arrives and refused past
        `limit` bytes; raises as `get` does, and `ValueError` (`JsonError`) for an answer that
        is not JSON or is larger."""
        response = self.get(path, [], timeout=timeout)
        try:
            return JsonStream(response.stream(CHUNK_BYTES), max_value_bytes=limit, what=path).value(
                shape
            )
        finally:
            response.release_conn()

    def close(self) -> None:
        self._pool.clear()


def _proxy_manager(proxy: str, options: dict[str, Any]) -> urllib3.PoolManager:
    if proxy.startswith("socks"):
        from urllib3.contrib.socks import SOCKSProxyManager  # noqa: PLC0415 - needs PySocks

        return SOCKSProxyManager(proxy, **options)
    return urllib3.ProxyManager(proxy, **options)
