"""The daemon's own cluster configuration: kubeconfigs and the service account read without the
`kubernetes` package, over real TLS (trustme's CA, server and client certificates) against a
loopback HTTPS server that records what each request carried. Credentials that take running
something — an exec plugin (client-go's protocol, run by gpuscope), an auth-provider (the
kubernetes package's loader) — run only when a request needs them, bounded in time and output; a
failure is one line naming the plugin, logged once, tried again later."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import trustme
import urllib3
import yaml

from exporter.attribution import credentials
from exporter.attribution.access import resolve_cluster
from exporter.attribution.cluster import (
    ApiError,
    CredentialError,
    KubernetesClient,
    TokenFile,
)
from exporter.attribution.credentials import (
    API_VERSIONS,
    RETRY_SECONDS,
    AuthProvider,
    ExecPlugin,
    ExecSpec,
)
from exporter.attribution.jsonstream import TEXT, Fields, Items
from exporter.config import ConfigError
from tests.helpers import ManualClock, eventually
from tests.lazy_imports import loaded_lazily

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from exporter.attribution import ClusterAccess

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"
TIMEOUT = (5.0, 5.0)
POD_LIST = Fields({"kind": TEXT, "items": Items(TEXT)})


class Recorder(http.server.ThreadingHTTPServer):
    seen: list[dict[str, Any]]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Recorder

    def do_GET(self) -> None:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        self.server.seen.append(
            {"path": self.path, "authorization": self.headers.get("Authorization"), "peer": peer}
        )
        status = 404 if self.path.startswith("/missing") else 200
        body = json.dumps({"kind": "PodList", "items": []}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        """Quiet."""


def serve(context: ssl.SSLContext | None) -> Iterator[Recorder]:
    server = Recorder(("127.0.0.1", 0), Handler)
    server.seen = []
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def https(ca: trustme.CA) -> Iterator[Recorder]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "kubernetes.default.svc").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate is checked when presented
    yield from serve(context)


@pytest.fixture
def named_only(ca: trustme.CA) -> Iterator[Recorder]:
    """An API server whose certificate names it, not its address."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("kubernetes.default.svc").configure_cert(context)
    yield from serve(context)


@pytest.fixture
def plain() -> Iterator[Recorder]:
    yield from serve(None)


def url(server: Recorder, scheme: str = "https") -> str:
    return f"{scheme}://127.0.0.1:{server.server_address[1]}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}] if user is not None else [],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def access(path: Path) -> ClusterAccess:
    found = resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
    assert found is not None
    return found


def get(found: ClusterAccess, path: str = "/api/v1/pods") -> object:
    client = KubernetesClient(found.configuration)
    try:
        return client.get_object(path, POD_LIST, limit=1024, timeout=TIMEOUT)
    finally:
        client.close()


def test_token_and_ca_data(tmp_path: Path, ca: trustme.CA, https: Recorder) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": url(https), "certificate-authority-data": b64(ca.cert_pem.bytes())},
        {"token": "s3cret"},
    )
    assert get(access(path)) == {"kind": "PodList", "items": []}
    assert https.seen[-1]["authorization"] == "Bearer s3cret"
    assert https.seen[-1]["peer"] is None


def test_client_certificate_as_data_or_files_relative_to_the_kubeconfig(
    tmp_path: Path, ca: trustme.CA, https: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Certificate and key data reach OpenSSL from memory: no file is made for them (the chart's
    root is read-only, and a key belongs on no disk)."""

    def nowhere(*_args: object, **_kwargs: object) -> object:
        raise AssertionError("a temporary file was made")

    for name in ("mkstemp", "NamedTemporaryFile", "TemporaryFile", "mkdtemp", "TemporaryDirectory"):
        monkeypatch.setattr(tempfile, name, nowhere)
    client_cert = ca.issue_cert("gpuscope@cluster")
    cert_pem = client_cert.cert_chain_pems[0].bytes()
    key_pem = client_cert.private_key_pem.bytes()
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (tmp_path / "certs" / "client.pem").write_bytes(cert_pem)
    (tmp_path / "certs" / "client.key").write_bytes(key_pem)
    as_data = kubeconfig(
        tmp_path / "data",
        {"server": url(https), "certificate-authority": "certs/ca.pem"},
        {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
    )
    as_files = kubeconfig(
        tmp_path / "files",
        {"server": url(https), "certificate-authority": "certs/ca.pem"},
        {"client-certificate": "certs/client.pem", "client-key": "certs/client.key"},
    )
    for path in (as_data, as_files):
        get(access(path))
        assert https.seen[-1]["peer"]  # presented, and verified against the CA
        assert https.seen[-1]["authorization"] is None


@pytest.mark.parametrize("key", ["certificate-authority", "client-certificate", "client-key"])
def test_a_special_file_named_for_tls_is_refused_at_once(
    tmp_path: Path, ca: trustme.CA, key: str
) -> None:
    """OpenSSL opened these paths itself: a FIFO there blocked the daemon's start for ever, with
    nothing listening and nothing logged. Each is read as every file is, regular files only."""
    client = ca.issue_cert("gpuscope@cluster")
    files = {
        "certificate-authority": tmp_path / "ca.pem",
        "client-certificate": tmp_path / "client.pem",
        "client-key": tmp_path / "client.key",
    }
    files["certificate-authority"].write_bytes(ca.cert_pem.bytes())
    files["client-certificate"].write_bytes(client.cert_chain_pems[0].bytes())
    files["client-key"].write_bytes(client.private_key_pem.bytes())
    files[key].unlink()
    os.mkfifo(files[key])
    path = kubeconfig(
        tmp_path / "kubeconfig",
        {
            "server": "https://127.0.0.1:6443",
            "certificate-authority": str(files["certificate-authority"]),
        },
        {
            "client-certificate": str(files["client-certificate"]),
            "client-key": str(files["client-key"]),
        },
    )
    with pytest.raises(ConfigError, match=rf"{files[key].name}: not a regular file \(a FIFO\)$"):
        resolve_cluster(kubeconfig=path, node_name=NODE, environ={})


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_tls_server_name_and_insecure_skip_verify(
    tmp_path: Path, ca: trustme.CA, named_only: Recorder
) -> None:
    ca_data = b64(ca.cert_pem.bytes())
    unnamed = kubeconfig(
        tmp_path / "a", {"server": url(named_only), "certificate-authority-data": ca_data}, None
    )
    with pytest.raises(urllib3.exceptions.HTTPError):
        get(access(unnamed))
    named = kubeconfig(
        tmp_path / "b",
        {
            "server": url(named_only),
            "certificate-authority-data": ca_data,
            "tls-server-name": "kubernetes.default.svc",
        },
        None,
    )
    get(access(named))
    insecure = kubeconfig(
        tmp_path / "c", {"server": url(named_only), "insecure-skip-tls-verify": True}, None
    )
    get(access(insecure))
    assert len(named_only.seen) == 2


def test_basic_auth_token_file_and_http_status(tmp_path: Path, plain: Recorder) -> None:
    basic = kubeconfig(
        tmp_path / "basic", {"server": url(plain, "http")}, {"username": "u", "password": "p"}
    )
    get(access(basic))
    assert plain.seen[-1]["authorization"] == "Basic " + b64(b"u:p")
    (tmp_path / "token").write_text("from-a-file\n")
    from_file = kubeconfig(
        tmp_path / "file", {"server": url(plain, "http")}, {"tokenFile": "token"}
    )
    get(access(from_file))
    assert plain.seen[-1]["authorization"] == "Bearer from-a-file"
    with pytest.raises(ApiError) as refused:
        get(access(from_file), "/missing")
    assert refused.value.status == 404


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    clock = ManualClock()
    token = TokenFile(str(path), clock=clock)
    path.write_text("second")
    assert token() == "Bearer first"
    clock.advance(60)
    assert token() == "Bearer second"
    path.write_text("")  # caught mid-rotation: the last good token stays
    clock.advance(60)
    assert token() == "Bearer second"


def test_in_cluster(tmp_path: Path, ca: trustme.CA, https: Recorder) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    environ = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(https.server_address[1]),
    }
    found = resolve_cluster(
        kubeconfig=None,
        node_name=NODE,
        environ=environ,
        token_file=str(token),
        ca_file=str(tmp_path / "ca.crt"),
    )
    assert found is not None
    assert found.source == "in-cluster"
    get(found)
    assert https.seen[-1]["authorization"] == "Bearer sa-token"
    environ["KUBERNETES_SERVICE_HOST"] = "fd00::1"
    (tmp_path / "bad.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match=r"^invalid in-cluster configuration: .*bad\.crt"):
        resolve_cluster(
            kubeconfig=None,
            node_name=NODE,
            environ=environ,
            token_file=str(token),
            ca_file=str(tmp_path / "bad.crt"),
        )


def test_kubeconfigs_merge_as_kubectl_python_client(tmp_path: Path, plain: Recorder) -> None:
    first = tmp_path / "first"
    first.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": url(plain, "http")}}],
                "users": [{"name": "u", "user": {"token": "first"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "nowhere",
            }
        )
    )
    second = tmp_path / "second"
    second.write_text(
        yaml.safe_dump(
            {
                "users": [{"name": "u", "user": {"token": "second"}}],
                "current-context": "x",
            }
        )
    )
    paths = f"{first}:{tmp_path / 'absent'}:{second}"
    found = resolve_cluster(kubeconfig=None, node_name=NODE, environ={"KUBECONFIG": paths})
    assert found is not None
    get(found)
    assert plain.seen[-1]["authorization"] == "Bearer first"


def test_an_exec_plugin_gives_the_token(tmp_path: Path, plain: Recorder) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json\nprint(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',"
        " 'kind': 'ExecCredential', 'status': {'token': 'from-exec'}}))\n"
    )
    path = kubeconfig(
        tmp_path / "config",
        {"server": url(plain, "http")},
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": sys.executable,
                "args": [str(plugin)],
                "interactiveMode": "Never",
            }
        },
    )
    get(access(path))
    assert plain.seen[-1]["authorization"] == "Bearer from-exec"


@pytest.mark.parametrize(
    ("cluster", "user", "problem"),
    [
        ({"server": "https://127.0.0.1:1", "certificate-authority-data": "%%%"}, None, "base64"),
        ({"server": "https://127.0.0.1:1", "certificate-authority": "absent.pem"}, None, "No such"),
        ({"server": "ftp://127.0.0.1:1"}, None, "is not a URL"),
        ({"server": "http://127.0.0.1:1"}, {"token": 7}, "expected a string"),
    ],
)
def test_an_unusable_kubeconfig_is_one_line(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any] | None, problem: str
) -> None:
    path = kubeconfig(tmp_path / "config", cluster, user)
    with pytest.raises(ConfigError) as caught:
        resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
    message = str(caught.value)
    assert message.startswith("invalid --kubeconfig: ")
    assert problem in message
    assert "\n" not in message


def test_the_daemon_never_imports_the_kubernetes_package_nor_the_simulator(
    tmp_path: Path, plain: Recorder
) -> None:
    path = kubeconfig(tmp_path / "config", {"server": url(plain, "http")}, {"token": "t"})
    program = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "import exporter.cli, exporter.app, exporter.attribution.live\n"
        "from exporter.attribution.access import resolve_cluster\n"
        "from exporter.attribution.cluster import KubernetesClient\n"
        "from exporter.attribution.jsonstream import TEXT\n"
        f"access = resolve_cluster(kubeconfig=Path({str(path)!r}), node_name='n', environ={{}})\n"
        "KubernetesClient(access.configuration).get_object('/api/v1/pods', TEXT, limit=1024, timeout=(5, 5))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    # Nor anything else another feature alone needs (tests/lazy_imports.py) but csv, which
    # urllib3 imports through importlib.metadata.
    assert loaded_lazily(json.loads(result.stdout), but=["csv"]) == []


# -- exec plugins and auth-providers: run when a request needs them ------------------------------


V1 = API_VERSIONS[0]


def credential(status: dict[str, Any], api_version: str = V1) -> str:
    return json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "status": status})


def script(tmp_path: Path, body: str, name: str = "plugin.py") -> Path:
    path = tmp_path / name
    path.write_text(f"import json, os, sys, time\nfrom pathlib import Path\n{body}\n")
    return path


def plugin(path: Path, **options: Any) -> ExecPlugin:
    return ExecPlugin(
        ExecSpec(sys.executable, (str(path),)), tls=None, with_certificate=None, **options
    )


def runs(counter: Path) -> int:
    return len(counter.read_text()) if counter.exists() else 0


def counted(counter: Path, then: str) -> str:
    return f"with open({str(counter)!r}, 'a') as f:\n    f.write('x')\n{then}"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hanging_plugin_is_killed_with_what_it_started_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    child = tmp_path / "child.pid"
    counter = tmp_path / "runs"
    hanging = script(
        tmp_path,
        counted(
            counter,
            "import subprocess\n"
            "sleeper = subprocess.Popen(['sleep', '600'])\n"
            f"Path({str(child)!r}).write_text(str(sleeper.pid))\n"
            "time.sleep(600)",
        ),
    )
    clock = ManualClock(100.0)
    hung = plugin(hanging, timeout=1.0, clock=lambda: clock() + time.monotonic())
    started = time.monotonic()
    with pytest.raises(CredentialError) as caught:
        hung.authorization()
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message == f"the kubeconfig's exec plugin {sys.executable!r} did not answer within 1s"
    eventually(lambda: not alive(int(child.read_text())), 10, "the plugin's child killed too")
    for _ in range(3):  # within RETRY_SECONDS: the same answer, nothing run again
        with pytest.raises(CredentialError, match="did not answer"):
            hung.authorization()
    assert runs(counter) == 1
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1
    assert logged[0].getMessage().startswith(message)
    assert "\n" not in logged[0].getMessage()
    assert logged[0].command == sys.executable  # type: ignore[attr-defined]
    clock.advance(RETRY_SECONDS)
    with pytest.raises(CredentialError):
        hung.authorization()
    assert runs(counter) == 2, "asked again after RETRY_SECONDS"
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1, "said once"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            (
                "sys.stderr.write('warming up\\nerror: the token service is unreachable\\n')\n"
                "sys.exit(3)"
            ),
            "failed with exit status 3: error: the token service is unreachable",
        ),
        ("print('Please open https://login.example.com in a browser')", "not JSON"),
        (
            f"print({credential({'token': 't'}, api_version=API_VERSIONS[1])!r})",
            f"apiVersion: {API_VERSIONS[1]!r}, not {V1!r}",
        ),
        ("print(json.dumps({'apiVersion': 'v1', 'kind': 'Pod'}))", "apiVersion: 'v1', not"),
        (f"print({credential({})!r})", "neither a token nor clientCertificateData"),
        (f"print({credential({'token': 't', 'expirationTimestamp': 'soon'})!r})", "RFC 3339"),
        ("sys.stdout.write('x' * (2 * 1024 * 1024))", "answered more than 1 MiB"),
    ],
)
def test_a_failing_plugin_is_one_line_naming_it(tmp_path: Path, body: str, problem: str) -> None:
    with pytest.raises(CredentialError) as caught:
        plugin(script(tmp_path, body)).authorization()
    message = str(caught.value)
    assert message.startswith(f"the kubeconfig's exec plugin {sys.executable!r}")
    assert problem in message
    assert "\n" not in message


def test_a_plugin_failing_differently_each_run_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    failing = plugin(
        script(tmp_path, "sys.stderr.write(f'error at {time.time()}\\n')\nsys.exit(1)"),
        clock=lambda: clock() + time.monotonic(),
    )
    for _ in range(3):
        with pytest.raises(CredentialError, match="failed with exit status 1: error at"):
            failing.authorization()
        clock.advance(RETRY_SECONDS)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1


def test_a_plugin_that_is_not_there(tmp_path: Path) -> None:
    missing = ExecPlugin(
        ExecSpec(str(tmp_path / "aws-iam-authenticator")), tls=None, with_certificate=None
    )
    with pytest.raises(CredentialError, match=r"aws-iam-authenticator' could not be started: No"):
        missing.authorization()


def test_credentials_are_kept_until_they_expire_or_are_refused(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    expires = "2030-01-01T00:10:00Z"
    status = f"{{'token': 'run-' + str(len(open({str(counter)!r}).read())), 'expirationTimestamp': {expires!r}}}"
    body = counted(
        counter,
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', 'status': {status}}}))",
    )
    clock = ManualClock()
    now = datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    fresh = plugin(script(tmp_path, body), clock=clock, wall_clock=lambda: now + clock())
    assert fresh.authorization() == "Bearer run-1"
    clock.advance(500)  # ten minutes' token, renewed a minute before it expires
    assert fresh.authorization() == "Bearer run-1"
    assert runs(counter) == 1
    clock.advance(41)
    assert fresh.authorization() == "Bearer run-2"
    fresh.rejected()  # the API server answered 401
    assert fresh.authorization() == "Bearer run-3"
    assert fresh.client_tls() is None


def test_the_request_says_who_asks_and_for_which_cluster(tmp_path: Path, plain: Recorder) -> None:
    echo = script(
        tmp_path,
        "info = os.environ['KUBERNETES_EXEC_INFO']\n"
        "token = __import__('base64').b64encode(info.encode()).decode()\n"
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', "
        "'status': {'token': token + '.' + os.environ['EXTRA']}}))",
    )
    (tmp_path / "ca.pem").write_text("not read by a plain-HTTP request\n")
    path = kubeconfig(
        tmp_path / "config",
        {
            "server": url(plain, "http"),
            "certificate-authority": "ca.pem",
            "extensions": [
                {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "x"}}
            ],
        },
        {
            "exec": {
                "apiVersion": V1,
                "command": sys.executable,
                "args": [str(echo)],
                "env": [{"name": "EXTRA", "value": "e"}],
                "interactiveMode": "Never",
                "provideClusterInfo": True,
            }
        },
    )
    found = access(path)
    get(found)
    header = plain.seen[-1]["authorization"]
    encoded, _, extra = header.removeprefix("Bearer ").partition(".")
    assert extra == "e"
    info = json.loads(base64.b64decode(encoded))
    assert info["apiVersion"] == V1
    assert info["kind"] == "ExecCredential"
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == url(plain, "http")
    assert base64.b64decode(info["spec"]["cluster"]["certificate-authority-data"]) == (
        b"not read by a plain-HTTP request\n"
    )
    assert info["spec"]["cluster"]["config"] == {"audience": "x"}


def test_a_client_certificate_from_the_plugin_is_presented(
    tmp_path: Path, ca: trustme.CA, https: Recorder
) -> None:
    client = ca.issue_cert("gpuscope@cluster")
    status = {
        "clientCertificateData": client.cert_chain_pems[0].bytes().decode(),
        "clientKeyData": client.private_key_pem.bytes().decode(),
    }
    issuing = script(tmp_path, f"print({credential(status)!r})")
    path = kubeconfig(
        tmp_path / "config",
        {
            "server": url(https),
            "certificate-authority-data": base64.b64encode(ca.cert_pem.bytes()).decode(),
        },
        {"exec": {"apiVersion": V1, "command": sys.executable, "args": [str(issuing)]}},
    )
    get(access(path))
    assert https.seen[-1]["peer"], "the plugin's certificate was presented"
    assert https.seen[-1]["authorization"] is None


def test_reading_the_kubeconfig_runs_nothing(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    hanging = tmp_path / "bin" / "hang.sh"
    hanging.parent.mkdir()
    hanging.write_text(f"#!/bin/sh\ntouch {ran}\nsleep 600\n")
    hanging.chmod(0o755)
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://127.0.0.1:1"},
        {"exec": {"apiVersion": V1, "command": "./bin/hang.sh"}},
    )
    started = time.monotonic()
    found = access(path)
    assert time.monotonic() - started < 5
    assert not ran.exists()
    with pytest.raises(CredentialError, match=r"exec plugin '.*/bin/hang\.sh' did not answer"):
        ExecPlugin(
            ExecSpec(str(tmp_path / "bin" / "hang.sh")),
            tls=None,
            with_certificate=None,
            timeout=0.5,
        ).authorization()
    assert found.configuration.client_tls is not None


@pytest.mark.parametrize(
    ("exec_section", "problem"),
    [
        (
            {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"},
            "user.exec.apiVersion: 'client.authentication.k8s.io/v1alpha1' is not one of",
        ),
        ({"apiVersion": V1}, "user.exec.command: expected a string"),
        (
            {"apiVersion": V1, "command": "x", "interactiveMode": "Always"},
            "user.exec.interactiveMode: 'Always' needs a terminal",
        ),
        ({"apiVersion": V1, "command": "x", "env": [{"name": "A"}]}, "missing field value"),
        ({"apiVersion": V1, "command": "x", "args": "--all"}, "user.exec.args: expected a list"),
    ],
)
def test_an_exec_section_that_cannot_work_is_a_config_error(
    tmp_path: Path, exec_section: dict[str, Any], problem: str
) -> None:
    path = kubeconfig(
        tmp_path / "config", {"server": "https://127.0.0.1:1"}, {"exec": exec_section}
    )
    with pytest.raises(ConfigError) as caught:
        resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
    assert problem in str(caught.value)
    assert "\n" not in str(caught.value)


def jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.signature"


def test_an_auth_provider_token_comes_from_the_kubernetes_loader_when_asked(
    tmp_path: Path, plain: Recorder
) -> None:
    token = jwt({"exp": int(time.time()) + 3600, "sub": "gpuscope"})
    provider = {"name": "oidc", "config": {"id-token": token, "idp-issuer-url": "https://x"}}
    path = kubeconfig(
        tmp_path / "config", {"server": url(plain, "http")}, {"auth-provider": provider}
    )
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from exporter.attribution.access import resolve_cluster\n"
        f"found = resolve_cluster(kubeconfig=Path({str(path)!r}), node_name='n', environ={{}})\n"
        "print('kubernetes' in sys.modules)\n"
        "print(found.configuration.authorization())\n"
        "print('kubernetes' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split() == ["False", "Bearer", token, "True"]


def test_an_auth_provider_without_the_kubernetes_client_is_refused_at_start_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://127.0.0.1:1"},
        {"auth-provider": {"name": "gcp", "config": {}}},
    )
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as in the core install
    with pytest.raises(ConfigError) as caught:
        resolve_cluster(kubeconfig=path, node_name=NODE, environ={})
    assert str(caught.value) == (
        f"invalid --kubeconfig: {path}: user.auth-provider: needs gpuscope[auth-providers] "
        "(kubernetes not installed): pip install 'gpuscope[auth-providers]'"
    )


def test_an_auth_provider_that_fails_or_hangs_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = kubeconfig(
        tmp_path / "config",
        {"server": "http://127.0.0.1:1"},
        {"auth-provider": {"name": "oidc", "config": {}}},
    )
    with pytest.raises(CredentialError) as caught:
        AuthProvider(str(path), "oidc")()
    assert str(caught.value).startswith("the kubeconfig's auth-provider 'oidc' failed: ")
    assert "\n" not in str(caught.value)

    def hang(_self: AuthProvider, _call: object) -> None:
        time.sleep(600)

    monkeypatch.setattr(credentials.AuthProvider, "_token", hang)
    hanging = AuthProvider(str(path), "gcp", timeout=0.3)
    for _ in range(2):
        with pytest.raises(CredentialError, match=r"^the kubeconfig's auth-provider 'gcp' did not"):
            hanging()
    said = [r for r in caplog.records if "auth-provider 'gcp'" in r.getMessage()]
    assert len(said) == 1


def test_the_plugins_environment_is_the_daemons_plus_its_own(tmp_path: Path) -> None:
    token = "os.environ['HOME'] + ':' + os.environ['ONE']"
    body = (
        f"print(json.dumps({{'apiVersion': {V1!r}, 'kind': 'ExecCredential', "
        f"'status': {{'token': {token}}}}}))"
    )
    spec = ExecSpec(sys.executable, (str(script(tmp_path, body)),), env=(("ONE", "1"),))
    found = ExecPlugin(spec, tls=None, with_certificate=None).authorization()
    assert found == f"Bearer {os.environ['HOME']}:1"
