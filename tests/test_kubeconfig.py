"""The daemon's own cluster configuration: kubeconfigs and the service account read without the
`kubernetes` package, over real TLS (trustme's CA, server and client certificates) against a
loopback HTTPS server that records what each request carried."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest
import trustme
import urllib3
import yaml

from exporter.attribution.cluster import ApiError, KubernetesClient, TokenFile, resolve_cluster
from exporter.attribution.jsonstream import TEXT, Fields, Items
from exporter.config import ConfigError
from tests.helpers import ManualClock
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
    client = KubernetesClient(found)
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
    tmp_path: Path, ca: trustme.CA, https: Recorder
) -> None:
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
    assert not any(tmp_path.glob("gpuscope-*"))  # the data's files lived for the loading alone


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


def test_an_exec_plugin_goes_to_the_kubernetes_loader(tmp_path: Path, plain: Recorder) -> None:
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
        "from exporter.attribution.cluster import KubernetesClient, resolve_cluster\n"
        "from exporter.attribution.jsonstream import TEXT\n"
        f"access = resolve_cluster(kubeconfig=Path({str(path)!r}), node_name='n', environ={{}})\n"
        "KubernetesClient(access).get_object('/api/v1/pods', TEXT, limit=1024, timeout=(5, 5))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    # Nor anything else another feature alone needs (tests/lazy_imports.py) but csv, which
    # urllib3 imports through importlib.metadata.
    assert loaded_lazily(json.loads(result.stdout), but=["csv"]) == []
