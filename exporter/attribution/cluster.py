"""Requests to the Kubernetes API: a configuration (`ApiConfig`: where, TLS, credentials) and
raw GET requests. Which configuration to use is `exporter.attribution.access`'s.

The daemon asks the API server for three things only (its node's pods and ResourceSlices, list
and watch, and a claim or DeviceClass now and then), as GETs answered with JSON, and, only when
asked to (`exporter.actions`), writes two: its node's status and Events, PATCH and POST of JSON; so it speaks
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

import contextlib
import json
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

import urllib3

from exporter import documents
from exporter.attribution.jsonstream import CHUNK_BYTES, JsonStream
from exporter.documents import memory_file

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from urllib3 import BaseHTTPResponse

    from exporter.attribution.jsonstream import Shape

PODS_PATH: Final = "/api/v1/pods"
TOKEN_SECONDS: Final = 60.0
"""A token file (the service account's is rotated by the kubelet) is read again after this long."""
MAX_TOKEN_BYTES: Final = 64 * 1024
MAX_PEM_BYTES: Final = 1024 * 1024
"""A CA bundle, client certificate or key file: the system's whole CA bundle is about 200 KiB."""
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
    (insecure-skip-tls-verify).

    Files are read here, bounded and regular files only (`documents.read_bounded`: a FIFO would
    block OpenSSL, opening it, for ever), and OpenSSL is handed their text: the CA as data, the
    certificate and key through memory files (it loads those from paths only), so nothing is
    written (the chart's root is read-only, and a key belongs on no disk). Raises
    `documents.Invalid` naming a file that cannot be read, `ssl.SSLError` for PEM it refuses."""
    if ca_file is not None and ca_data is None:
        ca_data = _pem(ca_file)
    context = ssl.create_default_context(cadata=ca_data)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_data is None and cert_file is not None:
        cert_data = _pem(cert_file)
    if key_data is None and key_file is not None:
        key_data = _pem(key_file)
    if cert_data is None:
        return context
    with contextlib.ExitStack() as files:
        cert = files.enter_context(memory_file(cert_data.encode(), "client-cert"))
        key = (
            files.enter_context(memory_file(key_data.encode(), "client-key"))
            if key_data is not None
            else None
        )
        context.load_cert_chain(cert, key)
    return context


def _pem(path: str) -> str:
    try:
        return documents.decode(documents.read_bounded(Path(path), MAX_PEM_BYTES))
    except documents.Invalid as problem:
        raise documents.Invalid("", f"{path}: {problem}") from None


def problem_text(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


class KubernetesClient:
    """GET requests to the API server, answered as raw (streamable) responses. Blocking: call
    from a thread, never from the event loop."""

    def __init__(self, config: ApiConfig) -> None:
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
        url = self._config.host + path + (f"?{urlencode(query)}" if query else "")
        return self._request("GET", url, None, {}, timeout)

    def send(
        self,
        method: str,
        path: str,
        body: Mapping[str, object],
        *,
        content_type: str,
        timeout: tuple[float, float],
    ) -> None:
        """`method` (POST, PATCH) of `body` as JSON to `path`; the answer is read and dropped
        (the writes' callers need only its status). Raises as `get` does."""
        data = json.dumps(body, separators=(",", ":")).encode()
        response = self._request(
            method, self._config.host + path, data, {"Content-Type": content_type}, timeout
        )
        response.drain_conn()
        response.release_conn()

    def _request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        extra_headers: dict[str, str],
        timeout: tuple[float, float],
    ) -> BaseHTTPResponse:
        headers = {"Accept": "application/json", "User-Agent": "gpuscope", **extra_headers}
        authorization = self._config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if self._config.client_tls is not None:
            tls = self._config.client_tls()
            if tls is not self._tls:  # a new client certificate: new connections present it
                self._pool.clear()
                self._pool = self._new_pool(tls)
                self._tls = tls
        response = self._pool.request(
            method,
            url,
            body=body,
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
