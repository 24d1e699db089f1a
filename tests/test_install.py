"""The core install, as a GPU node gets it: `pip install gpuscope` in a fresh virtualenv holds the
daemon's dependencies only, under 100 MB of site-packages (benchmarks/install.py measures it),
serves the simulator — with and without a cluster's kubeconfig, with and without a web config of
TLS and basic auth — and answers a job, or a kubeconfig auth-provider, with the extra to install.
"""

from __future__ import annotations

import base64
import os
import signal
import ssl
import subprocess
import tomllib
import urllib.request
from typing import TYPE_CHECKING

import bcrypt
import pytest
import trustme
import yaml

from benchmarks.install import TARGET_MB, install, measure
from exporter import extras
from tests.helpers import ROOT, eventually
from tests.lazy_imports import JOBS_LIBRARIES, loaded_lazily, modules_env, written_modules
from tests.prometheus_server import free_port

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh virtualenv holding the core install."""
    return install(tmp_path_factory.mktemp("lean") / "venv")


def test_the_core_install_is_the_daemons_dependencies_under_100_mb(lean: Path) -> None:
    measured = measure(lean)
    installed = {name.lower().replace("_", "-") for name in measured["distributions_mb"]}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for requirement in declared["project"]["dependencies"]:
        assert requirement.split(">")[0].split("<")[0].lower() in installed
    assert installed.isdisjoint(JOBS_LIBRARIES), measured["distributions_mb"]
    assert measured["site_packages_mb"] < TARGET_MB, measured


def serve(
    python: Path,
    scratch: Path,
    *flags: str,
    scheme: str = "http",
    context: ssl.SSLContext | None = None,
) -> list[str]:
    """`gpuscope serve --simulate 8` from the core install, with `flags`: its /metrics answered
    (with basic auth when `context` is given), then a clean stop; the modules it had loaded."""
    port = free_port()
    command = [
        str(python.parent / "gpuscope"),
        "serve",
        "--simulate=8",
        "--collect.interval=200ms",
        f"--web.listen-address=127.0.0.1:{port}",
        *flags,
    ]
    environ = {
        key: value for key, value in os.environ.items() if key not in {"KUBECONFIG", "PYTHONPATH"}
    }
    daemon = subprocess.Popen(
        command,
        env={**environ, **modules_env(scratch)},
        stderr=subprocess.PIPE,
        text=True,
        cwd=scratch,
    )
    token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(
        f"{scheme}://127.0.0.1:{port}/metrics", headers={"Authorization": f"Basic {token}"}
    )

    def metrics() -> str | None:
        if daemon.poll() is not None:
            raise AssertionError(f"it exited ({daemon.returncode}): {daemon.communicate()[1]}")
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                body = str(response.read().decode())
        except OSError:
            return None
        return body if 'gpu_up{gpu="7"' in body else None

    try:
        eventually(metrics, 60, "the simulated node's /metrics")
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, log
    return written_modules(scratch)


def test_the_core_install_serves_the_simulator(lean: Path, tmp_path: Path) -> None:
    assert loaded_lazily(serve(lean, tmp_path), but=["exporter.simulator"]) == []


def test_the_core_install_serves_with_a_cluster_tls_and_basic_auth(
    lean: Path, tmp_path: Path
) -> None:
    """A kubeconfig brings attribution's modules (its API server answers nothing here: pods are
    simply not attributed), the web config TLS and bcrypt."""
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    certificate.cert_chain_pems[0].write_to_path(str(tmp_path / "server.crt"))
    certificate.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    context = ssl.create_default_context()
    authority.configure_trust(context)
    modules = serve(
        lean,
        tmp_path,
        f"--kubeconfig={kubeconfig}",
        "--kubernetes.node-name=node-a",
        f"--web.config.file={web}",
        scheme="https",
        context=context,
    )
    assert "exporter.attribution.live" in modules
    # csv (the standard library's): urllib3 imports importlib.metadata, which imports it.
    assert loaded_lazily(modules, but=["exporter.simulator", "bcrypt", "csv"]) == []


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["rightsize", "--prometheus=http://127.0.0.1:1"], "rightsize"),
        (["rightsize", "serve", "--prometheus=http://127.0.0.1:1"], "rightsize"),
        (["calibrate", "--device=cpu"], "calibrate"),
    ],
)
def test_a_job_on_the_core_install_exits_2_naming_its_extra(
    lean: Path, argv: list[str], extra: str
) -> None:
    result = subprocess.run(
        [str(lean.parent / "gpuscope"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    missing = ", ".join(extras.EXTRAS[extra])
    assert result.stderr == (
        f"gpuscope {argv[0]}: error: needs gpuscope[{extra}] ({missing} not installed): "
        f"pip install 'gpuscope[{extra}]'\n"
    )


def test_a_kubeconfig_auth_provider_on_the_core_install_names_its_extra(
    lean: Path, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"auth-provider": {"name": "oidc"}}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    result = subprocess.run(
        [
            str(lean.parent / "gpuscope"),
            "serve",
            "--simulate=1",
            f"--kubeconfig={kubeconfig}",
            "--kubernetes.node-name=node-a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"gpuscope: error: invalid --kubeconfig: {kubeconfig}: user.auth-provider: needs "
        "gpuscope[auth-providers] (kubernetes not installed): pip install "
        "'gpuscope[auth-providers]'\n"
    )
