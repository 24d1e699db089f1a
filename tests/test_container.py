"""The Dockerfile: linted with hadolint; the daemon image and the jobs' image built and smoke-run
with podman."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.container import build_image, ensure_base_image, podman, podman_env
from tests.helpers import ROOT, require_tool
from tests.lazy_imports import JOBS_LIBRARIES

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow
TAG = f"test-{uuid.uuid4().hex[:8]}"
"""This run's images, apart from those of a run beside it (podman's storage is the machine's)."""
DAEMON_IMAGE = f"localhost/gpuscope:{TAG}"
JOBS_IMAGE = f"localhost/gpuscope-jobs-rightsize:{TAG}"


def test_dockerfile_passes_hadolint() -> None:
    hadolint = require_tool("hadolint")
    result = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    """podman's environment, the stand-in base built; this run's images removed at the end."""
    for tool in ("podman", "runc", "debootstrap"):
        require_tool(tool)
    environment = podman_env()
    ensure_base_image(environment)
    yield environment
    for image in (DAEMON_IMAGE, JOBS_IMAGE):
        podman("rmi", "--force", image, env=environment, check=False)


@pytest.fixture(scope="module")
def image(env: dict[str, str]) -> dict[str, str]:
    build_image(env, "daemon", DAEMON_IMAGE)
    return env


@pytest.fixture(scope="module")
def jobs_image(env: dict[str, str]) -> dict[str, str]:
    """The jobs' image with the rightsizing job's extra alone: the whole `jobs` extra is
    PyTorch's CUDA build, a multi-GB download (README: the container image, for its size)."""
    build_image(env, "jobs", JOBS_IMAGE, "JOBS_EXTRAS=rightsize")
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.timeout(1200)
def test_image_runs_the_daemon_as_non_root(image: dict[str, str]) -> None:
    env = image
    name = f"gpuscope-smoke-{uuid.uuid4().hex[:8]}"
    port = free_port()
    podman(
        "run",
        "--detach",
        f"--name={name}",
        f"--publish=127.0.0.1:{port}:9455",
        "--no-healthcheck",
        DAEMON_IMAGE,
        "--simulate=2",
        env=env,
    )
    try:
        body = ""
        for _ in range(100):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=2
                ) as response:
                    body = response.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        assert 'gpu_up{gpu="1"' in body, podman("logs", name, env=env, check=False).stderr
        assert podman("exec", name, "id", "-u", env=env).stdout.strip() == "65532"
        # The image's own HEALTHCHECK command, run inside the container (podman's scheduler for
        # health checks needs systemd, which these machines lack).
        inspected = json.loads(podman("image", "inspect", DAEMON_IMAGE, env=env).stdout)[0]
        config = inspected["Config"]
        health = inspected["Healthcheck"]["Test"]
        assert health[0] == "CMD"
        podman("exec", name, *health[1:], env=env)
        assert config["Entrypoint"] == ["gpuscope", "serve"]
        assert config["User"] == "65532:65532"
        labels = config["Labels"]
        assert labels["org.opencontainers.image.title"] == "gpuscope"
        assert "org.opencontainers.image.version" in labels
        lean = podman(
            "exec",
            name,
            "python3",
            "-c",
            "import json, shutil; from importlib import metadata; print(json.dumps(["
            "sorted(d.metadata['Name'].lower() for d in metadata.distributions()), "
            "[tool for tool in ('gcc', 'cc') if shutil.which(tool)]]))",
            env=env,
        )
        installed, compilers = json.loads(lean.stdout)
        assert "gpuscope" in installed
        assert not {"pip", "setuptools", *JOBS_LIBRARIES} & set(installed), installed
        assert compilers == []
        podman("stop", "--time=5", name, env=env)
        state = json.loads(podman("inspect", name, env=env).stdout)[0]["State"]
        assert state["ExitCode"] == 0, "SIGTERM stops the daemon cleanly"
    finally:
        podman("rm", "--force", "--time=1", name, env=env, check=False)


@pytest.mark.timeout(1200)
def test_the_jobs_image_runs_a_job_and_names_a_missing_extra(jobs_image: dict[str, str]) -> None:
    env = jobs_image
    config = json.loads(podman("image", "inspect", JOBS_IMAGE, env=env).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["gpuscope"]
    assert config["User"] == "65532:65532"
    assert config["Labels"]["org.opencontainers.image.title"] == "gpuscope-jobs"
    run = ("run", "--rm", "--network=none", JOBS_IMAGE)
    helped = podman(*run, "rightsize", "--help", env=env)
    assert "--prometheus" in helped.stdout
    refused = podman(*run, "rightsize", "--prometheus=http://127.0.0.1:1", env=env, check=False)
    assert refused.returncode == 1, "aiohttp is there: the job ran and found no Prometheus"
    assert "cannot reach Prometheus at http://127.0.0.1:1" in refused.stderr
    calibrate = podman(*run, "calibrate", "--device=cpu", env=env, check=False)
    assert calibrate.returncode == 2
    assert calibrate.stderr == (
        "gpuscope calibrate: error: needs gpuscope[calibrate] (torch not installed): "
        "pip install 'gpuscope[calibrate]'\n"
    )
