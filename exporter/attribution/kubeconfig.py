"""A kubeconfig, read as kubectl's Python client reads it, into an `ApiConfig`.

Every file of the list (`$KUBECONFIG` may name several, `:`-separated; files that do not exist
are skipped) is read bounded and strict (`exporter.documents`), its text never quoted (it holds
credentials). Their clusters, contexts and users merge by name, the first file's entry winning;
the last file that names a `current-context` chooses it. Paths in a file are relative to that
file's directory.

Read here: the cluster's `server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`,
`tls-server-name`, `proxy-url`; the user's `token` or `tokenFile` (re-read every minute),
`client-certificate(-data)` and `client-key(-data)`, `username` and `password`, and its `exec`
plugin (without a token) or `auth-provider`, checked here and run only when a request needs
credentials (`exporter.attribution.credentials`): reading a kubeconfig never runs anything, so
the daemon starts and serves whatever its credentials cost. An auth-provider needs the Kubernetes
client (`gpuscope[auth-providers]`): a kubeconfig that has one is refused, naming the extra, when
it is not installed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import urllib3

from exporter import documents, extras
from exporter.attribution.cluster import ApiConfig, TokenFile, tls_context
from exporter.attribution.credentials import API_VERSIONS, AuthProvider, ExecPlugin, ExecSpec
from exporter.config import ConfigError
from exporter.extras import MissingExtra

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_KUBECONFIG_BYTES: Final = 4 * 2**20
"""A kubeconfig with embedded certificates is a few KiB; many clusters, still far below this."""
_KEYS: Final = ("clusters", "contexts", "users")
_KEYS_TEXT: Final = "clusters, contexts and users"
_EXEC_EXTENSION: Final = "client.authentication.k8s.io/exec"
"""The cluster extension whose value an exec plugin gets as `spec.cluster.config`."""


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
        return _configuration(merged, paths)
    except documents.Invalid as problem:
        raise ConfigError(setting, f"{paths}: {problem}") from None
    except (ssl.SSLError, OSError, ValueError) as error:
        raise ConfigError(setting, f"{paths}: {_problem(error)}") from error


def _kubeconfig(document: object) -> dict[str, Any]:
    if not isinstance(document, dict) or not any(key in document for key in _KEYS):
        raise documents.Invalid("", f"expected a mapping of {_KEYS_TEXT}")
    return document


def _configuration(merged: _Merged, paths: str) -> ApiConfig:
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
    server = documents.text(cluster.get("server"), "cluster.server", max_length=2048).rstrip("/")
    tls = None
    if server.startswith("https"):
        tls = _tls(cluster, cluster_dir, user, user_dir)
    elif not server.startswith("http://"):
        raise documents.Invalid("cluster.server", f"{documents.quote(server)} is not a URL")
    config = ApiConfig(
        server,
        tls=tls,
        tls_server_name=_optional_text(cluster, "tls-server-name"),
        proxy=_optional_text(cluster, "proxy-url"),
    )
    if "auth-provider" in user:
        provider = documents.mapping(user["auth-provider"], "user.auth-provider")
        name = documents.text(provider.get("name"), "user.auth-provider.name")
        try:
            # Checked here, at start, not at the first request: without it attribution would
            # only ever log that its credentials fail.
            extras.require("auth-providers")
        except MissingExtra as missing:
            raise documents.Invalid("user.auth-provider", str(missing)) from None
        return dataclasses.replace(config, authorization=AuthProvider(paths, name))
    if "exec" in user and not ("token" in user or "tokenFile" in user):
        spec = _exec_spec(user["exec"], user_dir, cluster, cluster_dir, server)

        def with_certificate(cert: str, key: str) -> ssl.SSLContext:
            return _tls(cluster, cluster_dir, {}, user_dir, cert=cert, key=key)

        plugin = ExecPlugin(spec, tls=tls, with_certificate=with_certificate if tls else None)
        return dataclasses.replace(
            config,
            authorization=plugin.authorization,
            client_tls=plugin.client_tls,
            rejected=plugin.rejected,
        )
    return dataclasses.replace(config, authorization=_authorization(user, user_dir))


def _exec_spec(
    value: object, directory: Path, cluster: dict[str, Any], cluster_dir: Path, server: str
) -> ExecSpec:
    """A user's `exec` section, checked as client-go checks it."""
    path = "user.exec"
    entry = documents.mapping(value, path)
    api_version = documents.choice(
        entry.get("apiVersion"), documents.join(path, "apiVersion"), API_VERSIONS
    )
    command = documents.text(entry.get("command"), documents.join(path, "command"), max_length=4096)
    if os.sep in command and not os.path.isabs(command):
        command = str(directory / command)  # a path, not a program on PATH: client-go's rule
    args_path = documents.join(path, "args")
    args = tuple(
        documents.text(arg, documents.join(args_path, index), max_length=65536)
        for index, arg in enumerate(documents.sequence(entry.get("args") or [], args_path))
    )
    env_path = documents.join(path, "env")
    env: list[tuple[str, str]] = []
    for index, item in enumerate(documents.sequence(entry.get("env") or [], env_path)):
        where = documents.join(env_path, index)
        variable = documents.mapping(item, where, required=("name", "value"))
        name = documents.text(variable["name"], documents.join(where, "name"))
        env.append(
            (
                name,
                documents.text(
                    variable["value"],
                    documents.join(where, "value"),
                    max_length=65536,
                    allow_empty=True,
                ),
            )
        )
    if entry.get("interactiveMode") == "Always":
        raise documents.Invalid(
            documents.join(path, "interactiveMode"),
            "'Always' needs a terminal to ask someone at, and a daemon has none",
        )
    provided = documents.boolean(
        entry.get("provideClusterInfo", False), documents.join(path, "provideClusterInfo")
    )
    return ExecSpec(
        command,
        args,
        tuple(env),
        api_version,
        _cluster_info(cluster, cluster_dir, server) if provided else None,
    )


def _cluster_info(cluster: dict[str, Any], directory: Path, server: str) -> dict[str, object]:
    """The cluster as an exec plugin gets it (`spec.cluster`, with `provideClusterInfo`): its
    CA as base64 data even where the kubeconfig names a file, as client-go gives it."""
    info: dict[str, object] = {"server": server}
    ca_file = _file(cluster, "certificate-authority", directory)
    if "certificate-authority-data" in cluster:
        info["certificate-authority-data"] = documents.text(
            cluster["certificate-authority-data"],
            "cluster.certificate-authority-data",
            max_length=MAX_KUBECONFIG_BYTES,
        )
    elif ca_file is not None:
        data = documents.read_bounded(Path(ca_file), MAX_KUBECONFIG_BYTES)
        info["certificate-authority-data"] = base64.b64encode(data).decode()
    for key in ("tls-server-name", "proxy-url"):
        if cluster.get(key):
            info[key] = _optional_text(cluster, key)
    if cluster.get("insecure-skip-tls-verify") is True:
        info["insecure-skip-tls-verify"] = True
    extensions = documents.sequence(cluster.get("extensions") or [], "cluster.extensions")
    for index, extension in enumerate(extensions):
        named = documents.mapping(extension, documents.join("cluster.extensions", index))
        if named.get("name") == _EXEC_EXTENSION:
            info["config"] = named.get("extension")
    return info


def _tls(
    cluster: dict[str, Any],
    cluster_dir: Path,
    user: dict[str, Any],
    user_dir: Path,
    *,
    cert: str | None = None,
    key: str | None = None,
) -> ssl.SSLContext:
    """The cluster's TLS context with the user's client certificate, or with `cert` and `key`
    (PEM text: an exec plugin's) when given."""
    insecure = cluster.get("insecure-skip-tls-verify", False)
    verify = not documents.boolean(insecure, "cluster.insecure-skip-tls-verify")
    ca_data = _data(cluster, "certificate-authority-data")
    ca_file = _file(cluster, "certificate-authority", cluster_dir)
    return tls_context(
        ca_file=None if ca_data else ca_file,
        ca_data=ca_data,
        cert_file=_file(user, "client-certificate", user_dir),
        key_file=_file(user, "client-key", user_dir),
        cert_data=cert if cert is not None else _data(user, "client-certificate-data"),
        key_data=key if key is not None else _data(user, "client-key-data"),
        verify=verify,
    )


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
