"""TLS for the listener, replaced without a restart.

The listening socket keeps the `ssl.SSLContext` it was created with, so a reload cannot hand it a
new one. Instead the listener's context picks, in its SNI callback (which OpenSSL runs for every
ClientHello, with or without a server name), the context built from the latest config: the
handshake then uses that context's certificate and key and verifies client certificates against
its CA store (so a CA removed from the file is really gone). What OpenSSL copies from the
listener into each connection before that callback — verify mode, protocol versions, cipher
list — is updated on the listener itself.

Certificates and keys reach OpenSSL through anonymous memory files (`memfd_create`, loaded by
their `/proc/self/fd` path): OpenSSL loads a chain and its key only from files, and the chart
runs the daemon on a read-only root with nothing writable at /tmp. So no key material is ever
written to a disk, a key given inline in the YAML loads the same way, and what OpenSSL loads is
exactly the bytes that were read and checked (`documents.read_bounded`: regular files only, at
most `MAX_BYTES`), not whatever the path holds a moment later.

Client certificates are asked for with `CERT_OPTIONAL` even for `RequireAndVerifyClientCert`:
a certificate that is sent must verify or the handshake fails, and one that is not sent is
refused by the HTTP layer on every path except the health probes, which the kubelet's HTTPS
probes (which never send one) must reach.
"""

from __future__ import annotations

import ssl
from functools import cache
from typing import Final

from exporter.documents import Invalid, memory_file, read_bounded
from exporter.web.config import MAX_BYTES, Pem, TlsServerConfig, WebConfigError

_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


@cache
def _default_ciphers() -> str:
    """Python's own default TLS 1.2 cipher list, to return to when a config drops its own."""
    fresh = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    return ":".join(c["name"] for c in fresh.get_ciphers() if c["protocol"] != "TLSv1.3")


def _no_password() -> bytes:
    """An encrypted key fails to load instead of prompting on a terminal nobody watches."""
    return b""


def _pem_text(pem: Pem, inline_key: str, file_key: str) -> str:
    """The PEM's text: inline, or its file's first `MAX_BYTES` (a larger file, or one that never
    ends, is refused before OpenSSL reads it: OpenSSL would scan it whole for a PEM header)."""
    if pem.path is None:
        assert pem.inline is not None
        return pem.inline
    try:
        data = read_bounded(pem.path, MAX_BYTES)
    except Invalid as problem:
        raise WebConfigError(f"{_where(pem, inline_key, file_key)}: {problem}") from None
    return data.decode("ascii", errors="replace")


def _where(pem: Pem, inline_key: str, file_key: str) -> str:
    if pem.path is not None:
        return f"tls_server_config.{file_key} {pem.path}"
    return f"tls_server_config.{inline_key}"


def _reason(error: OSError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or "not PEM, or not usable by OpenSSL"
    return error.strerror or type(error).__name__


def server_context(config: TlsServerConfig) -> ssl.SSLContext:
    """A new server context for `config`; raises `WebConfigError` naming what failed to load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    configure(context, config)
    cert_text = _pem_text(config.cert, "cert", "cert_file")
    key_text = _pem_text(config.key, "key", "key_file")
    where = f"{_where(config.cert, 'cert', 'cert_file')} and its key"
    try:
        with (
            memory_file(cert_text.encode("ascii", errors="replace"), "cert") as cert,
            memory_file(key_text.encode("ascii", errors="replace"), "key") as key,
        ):
            context.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as error:  # both read: not PEM, or a key that is not the certificate's
        raise WebConfigError(f"{where}: {_reason(error)}") from error
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise WebConfigError(
            f"{where}: cannot hand them to OpenSSL in memory ({reason}; memfd_create and /proc "
            "are needed)"
        ) from error
    if config.client_ca is not None:
        cadata = _pem_text(config.client_ca, "client_ca", "client_ca_file")
        try:
            context.load_verify_locations(cadata=cadata)
        except (OSError, ValueError) as error:
            reason = _reason(error) if isinstance(error, OSError) else "not PEM certificates"
            raise WebConfigError(
                f"{_where(config.client_ca, 'client_ca', 'client_ca_file')}: {reason}"
            ) from error
    return context


def configure(context: ssl.SSLContext, config: TlsServerConfig) -> None:
    """The settings OpenSSL copies into each connection when it starts."""
    context.minimum_version = _VERSIONS[config.min_version]
    context.maximum_version = _VERSIONS[config.max_version]
    if config.cipher_suites:
        try:
            context.set_ciphers(":".join(config.cipher_suites))
        except ssl.SSLError as error:
            raise WebConfigError(
                "tls_server_config.cipher_suites: none of them is available in this OpenSSL"
            ) from error
    else:
        context.set_ciphers(_default_ciphers())
    if config.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    context.verify_mode = ssl.CERT_OPTIONAL if config.verifies_clients else ssl.CERT_NONE


class LiveTls:
    """The listener's context, and the latest context it hands each new handshake."""

    def __init__(self, config: TlsServerConfig) -> None:
        self._current = server_context(config)
        self.listener = server_context(config)
        self.listener.sni_callback = self._select

    def install(self, config: TlsServerConfig, fresh: ssl.SSLContext) -> None:
        """Serve `config` (whose context `server_context` built) from the next handshake on.
        Call it on the event loop: OpenSSL must not see the listener change while it makes a
        connection from it."""
        configure(self.listener, config)
        self._current = fresh

    def _select(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, _: object
    ) -> None:
        connection.context = self._current
