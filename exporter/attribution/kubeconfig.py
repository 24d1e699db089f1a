"""A kubeconfig, read as kubectl's Python client reads it, into an `ApiConfig`.

Every file of the list (`$KUBECONFIG` may name several, `:`-separated; files that do not exist
are skipped) is read bounded and strict (`exporter.documents`), its text never quoted (it holds
credentials). Their clusters, contexts and users merge by name, the first file's entry winning;
the last file that names a `current-context` chooses it. Paths in a file are relative to that
file's directory.

Read here: the cluster's `server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`,
`tls-server-name`, `proxy-url`; the user's `token` or `tokenFile` (re-read every minute),
`client-certificate(-data)` and `client-key(-data)`, `username` and `password`. A user that
authenticates through an `exec` plugin (without a token) or an `auth-provider` is read by the
`kubernetes` package's own loader instead, imported only then: the plugins' protocol, caching
and refresh are that package's.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import urllib3

from exporter import documents
from exporter.attribution.cluster import ApiConfig, TokenFile, tls_context
from exporter.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_KUBECONFIG_BYTES: Final = 4 * 2**20
"""A kubeconfig with embedded certificates is a few KiB; many clusters, still far below this."""
_KEYS: Final = ("clusters", "contexts", "users")
_KEYS_TEXT: Final = "clusters, contexts and users"
_DELEGATED: Final = ("exec", "auth-provider")


class _Merged:
    """The named entries of every file, each with the directory its paths are relative to."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {key: {} for key in _KEYS}
        self.current: str | None = None

    def add(self, document: dict[str, Any], directory: Path) -> None:
        for key in _KEYS:
            for index, item in enumerate(
                documents.sequence(document.get(key) or [], key, max_items=10_000)
            ):
                path = documents.join(key, index)
                entry = documents.mapping(item, path)
                name = documents.text(entry.get("name"), documents.join(path, "name"))
                body = documents.mapping(
                    entry.get(key[:-1]), documents.join(path, key[:-1]), null_is_empty=True
                )
                self.entries[key].setdefault(name, (body, directory))
        if document.get("current-context"):
            self.current = documents.text(document["current-context"], "current-context")

    def get(self, key: str, name: str) -> tuple[dict[str, Any], Path]:
        found = self.entries[key].get(name)
        if found is None:
            raise documents.Invalid(key, f"no {key[:-1]} named {documents.quote(name)}")
        return found


def load_kubeconfig(paths: str, setting: str) -> ApiConfig:
    """The API server, TLS and credentials of the current context of the kubeconfig(s) at
    `paths`; `ConfigError` naming `setting` for anything unusable."""
    merged = _Merged()
    read: list[str] = []
    for path in filter(None, paths.split(os.pathsep)):
        expanded = Path(path).expanduser()
        if not expanded.exists():
            continue
        document = documents.load_file(
            expanded,
            _kubeconfig,
            lambda message: ConfigError(setting, message),
            limit=MAX_KUBECONFIG_BYTES,
            secret=True,
            source=f"{path} is not a kubeconfig",
        )
        try:
            merged.add(document, expanded.resolve().parent)
        except documents.Invalid as problem:
            raise ConfigError(setting, f"{path} is not a kubeconfig: {problem}") from None
        read.append(path)
    if not read:
        raise ConfigError(setting, f"{paths}: No such file or directory")
    try:
        return _configuration(merged, paths, setting)
    except documents.Invalid as problem:
        raise ConfigError(setting, f"{paths}: {problem}") from None
    except (ssl.SSLError, OSError, ValueError) as error:
        raise ConfigError(setting, f"{paths}: {_problem(error)}") from error


def _kubeconfig(document: object) -> dict[str, Any]:
    if not isinstance(document, dict) or not any(key in document for key in _KEYS):
        raise documents.Invalid("", f"expected a mapping of {_KEYS_TEXT}")
    return document


def _configuration(merged: _Merged, paths: str, setting: str) -> ApiConfig:
    if merged.current is None:
        raise documents.Invalid("current-context", "not set")
    context, _ = merged.get("contexts", merged.current)
    cluster, cluster_dir = merged.get(
        "clusters", documents.text(context.get("cluster"), "context.cluster")
    )
    user: dict[str, Any] = {}
    user_dir = cluster_dir
    if context.get("user") and merged.entries["users"].get(context["user"]) is not None:
        user, user_dir = merged.get("users", documents.text(context["user"], "context.user"))
    if "auth-provider" in user or ("exec" in user and not ("token" in user or "tokenFile" in user)):
        return _delegated(paths, setting)
    server = documents.text(cluster.get("server"), "cluster.server", max_length=2048).rstrip("/")
    tls = None
    if server.startswith("https"):
        tls = _tls(cluster, cluster_dir, user, user_dir)
    elif not server.startswith("http://"):
        raise documents.Invalid("cluster.server", f"{documents.quote(server)} is not a URL")
    return ApiConfig(
        server,
        tls=tls,
        tls_server_name=_optional_text(cluster, "tls-server-name"),
        proxy=_optional_text(cluster, "proxy-url"),
        authorization=_authorization(user, user_dir),
    )


def _tls(
    cluster: dict[str, Any], cluster_dir: Path, user: dict[str, Any], user_dir: Path
) -> ssl.SSLContext:
    insecure = cluster.get("insecure-skip-tls-verify", False)
    verify = not documents.boolean(insecure, "cluster.insecure-skip-tls-verify")
    ca_data = _data(cluster, "certificate-authority-data")
    ca_file = _file(cluster, "certificate-authority", cluster_dir)
    cert = _data(user, "client-certificate-data")
    key = _data(user, "client-key-data")
    cert_file = _file(user, "client-certificate", user_dir)
    key_file = _file(user, "client-key", user_dir)
    if cert is None and key is None:
        return tls_context(
            ca_file=None if ca_data else ca_file,
            ca_data=ca_data,
            cert_file=cert_file,
            key_file=key_file,
            verify=verify,
        )
    # The ssl module loads a client certificate from files only: a private directory that
    # lives for the loading alone.
    with tempfile.TemporaryDirectory(prefix="gpuscope-") as scratch:
        if cert is not None:
            cert_file = _write(Path(scratch) / "client.crt", cert)
        if key is not None:
            key_file = _write(Path(scratch) / "client.key", key)
        return tls_context(
            ca_file=None if ca_data else ca_file,
            ca_data=ca_data,
            cert_file=cert_file,
            key_file=key_file,
            verify=verify,
        )


def _write(path: Path, content: str) -> str:
    path.touch(mode=0o600)
    path.write_text(content)
    return str(path)


def _authorization(user: dict[str, Any], directory: Path) -> Callable[[], str | None]:
    if "token" in user:
        header = f"Bearer {documents.text(user['token'], 'user.token', max_length=65536)}"
        return lambda: header
    token_file = _file(user, "tokenFile", directory)
    if token_file is not None:
        return TokenFile(token_file)
    if "username" in user and "password" in user:
        username = documents.text(user["username"], "user.username", allow_empty=True)
        password = documents.text(user["password"], "user.password", allow_empty=True)
        header = urllib3.util.make_headers(basic_auth=f"{username}:{password}")["authorization"]
        return lambda: header
    return lambda: None


def _data(entry: dict[str, Any], key: str) -> str | None:
    if key not in entry:
        return None
    encoded = documents.text(entry[key], key, max_length=MAX_KUBECONFIG_BYTES)
    try:
        decoded = base64.b64decode("".join(encoded.split()), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as error:
        raise documents.Invalid(key, "not base64 of PEM text") from error
    if not decoded.strip():
        raise documents.Invalid(key, "empty")
    return decoded


def _file(entry: dict[str, Any], key: str, directory: Path) -> str | None:
    if key not in entry:
        return None
    name = documents.text(entry[key], key, max_length=4096)
    return str(directory / Path(name).expanduser())


def _optional_text(entry: dict[str, Any], key: str) -> str | None:
    return documents.text(entry[key], key, max_length=2048) if entry.get(key) else None


def _problem(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _delegated(paths: str, setting: str) -> ApiConfig:
    """A kubeconfig whose user runs an exec plugin or an auth-provider, read by the kubernetes
    package's loader (imported only here) and its refreshing token asked per request."""
    import yaml  # noqa: PLC0415
    from kubernetes.client import Configuration  # noqa: PLC0415 - costs ~16 MiB
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415
    from kubernetes.config.kube_config import load_kube_config  # noqa: PLC0415

    configuration = Configuration()
    try:
        # persist_config=False: never write refreshed credentials back into the user's file.
        load_kube_config(
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except yaml.YAMLError as error:
        raise ConfigError(setting, f"{paths}: not valid YAML") from error
    except (TypeError, AttributeError, KeyError) as error:
        raise ConfigError(
            setting, f"{paths} is not a kubeconfig: its {_KEYS_TEXT} are not lists of named entries"
        ) from error
    except (ConfigException, OSError, ValueError) as error:
        raise ConfigError(setting, f"{paths}: {_problem(error)}") from error
    host: str = configuration.host
    tls = None
    if host.startswith("https"):
        tls = tls_context(
            ca_file=configuration.ssl_ca_cert,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
            verify=configuration.verify_ssl,
        )

    def authorization() -> str | None:
        header: str | None = configuration.get_api_key_with_prefix("BearerToken")
        return header

    return ApiConfig(
        host,
        tls=tls,
        tls_server_name=configuration.tls_server_name,
        proxy=configuration.proxy,
        authorization=authorization,
    )
