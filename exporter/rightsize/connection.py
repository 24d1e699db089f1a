"""The PromQL connection the settings describe (`options.py`): the bearer token or basic-auth
password from their variables or files, the CA certificates, the URL's userinfo, checked
together. Secrets are read bounded and never quoted in an error."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Final, Protocol

from exporter import documents
from exporter.rightsize.prometheus import (
    Connection,
    url_credentials,
)
from exporter.settings import (
    ConfigError,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

TOKEN_ENV: Final = "GPUSCOPE_PROMETHEUS_BEARER_TOKEN"  # noqa: S105 - a variable name, not a secret
PASSWORD_ENV: Final = "GPUSCOPE_PROMETHEUS_PASSWORD"  # noqa: S105 - a variable name, not a secret
SECRET_FILE_LIMIT: Final = 64 * 1024
"""A bearer token (a JWT: a few KiB) or a password file."""
CA_FILE_LIMIT: Final = 4 * 1024 * 1024
"""CA certificates: a whole system bundle is about 220 KiB."""


class ConnectionSettings(Protocol):
    """The settings a connection is made of (`RightsizeSettings` has them)."""

    @property
    def prometheus(self) -> str: ...
    @property
    def token_file(self) -> Path | None: ...
    @property
    def password_file(self) -> Path | None: ...
    @property
    def username(self) -> str | None: ...
    @property
    def ca_file(self) -> Path | None: ...
    @property
    def insecure_skip_verify(self) -> bool: ...
    @property
    def headers(self) -> Sequence[tuple[str, str]]: ...
    @property
    def timeout(self) -> float: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def read_timeout(self) -> float: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def max_response_size(self) -> int: ...


def connection(settings: ConnectionSettings, environ: Mapping[str, str]) -> Connection:
    """The connection, its secrets read and every combination checked: `ConfigError` else."""
    token = _secret_variable(environ, TOKEN_ENV)
    if settings.token_file is not None:
        token = _secret_file("--prometheus.bearer-token-file", settings.token_file)
    password = _secret_variable(environ, PASSWORD_ENV)
    if settings.password_file is not None:
        if settings.username is None:
            raise ConfigError("--prometheus.password-file", "needs --prometheus.username")
        password = _secret_file("--prometheus.password-file", settings.password_file)
    if password and settings.username is None:
        raise ConfigError(PASSWORD_ENV, "a password needs --prometheus.username")
    if token and settings.username is not None:
        raise ConfigError("--prometheus.username", "choose bearer token or basic auth, not both")
    if url_credentials(settings.prometheus) is not None and (token or settings.username):
        raise ConfigError(
            "--prometheus",
            "its URL carries credentials, and --prometheus.username or a bearer token is given "
            "too: choose one",
        )
    return Connection(
        url=settings.prometheus,
        bearer_token=token or None,
        username=settings.username,
        password=password,
        ca_certificates=_certificates(settings.ca_file) if settings.ca_file else None,
        insecure_skip_verify=settings.insecure_skip_verify,
        headers=dict(settings.headers),
        timeout_seconds=settings.timeout,
        connect_timeout_seconds=settings.connect_timeout,
        read_timeout_seconds=settings.read_timeout,
        concurrency=settings.concurrency,
        max_response_bytes=settings.max_response_size,
    )


def _secret_variable(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    if value is not None and not value.isprintable():
        raise ConfigError(name, "has control characters")  # never quoted: a secret
    return value


def _secret_file(flag: str, path: Path) -> str:
    """A token or password: the file's text without surrounding whitespace, never quoted."""
    try:
        secret = documents.read_bounded(path, SECRET_FILE_LIMIT).decode("utf-8").strip()
    except documents.Invalid as problem:
        raise ConfigError(flag, f"{path}: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(flag, f"{path}: not UTF-8 text") from None
    if not secret.isprintable():
        raise ConfigError(flag, f"{path}: has control characters")
    return secret


def _certificates(path: Path) -> str:
    """The PEM text of the CA certificates in the file, checked by loading them."""
    flag = "--prometheus.ca-file"
    try:
        pem = documents.decode(documents.read_bounded(path, CA_FILE_LIMIT))
        ssl.create_default_context().load_verify_locations(cadata=pem)
    except documents.Invalid as problem:
        raise ConfigError(flag, f"{path}: {problem}") from None
    except (ssl.SSLError, ValueError) as error:
        reason = getattr(error, "reason", None) or "unreadable"
        raise ConfigError(flag, f"{path}: no PEM certificates in it ({reason})") from None
    return pem
