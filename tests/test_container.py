"""The Dockerfile: linted with hadolint, and the daemon image built and smoke-run with podman."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
import uuid
from typing import TYPE_CHECKING

import pytest

from tests.container import ensure_base_image, podman, podman_env
from tests.helpers import ROOT, require_tool

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow
IMAGE = "localhost/gpuscope:test"


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
def image() -> Iterator[dict[str, str]]:
    for tool in ("podman", "runc", "debootstrap"):
        require_tool(tool)
    env = podman_env()
    base = ensure_base_image(env)
    podman(
        "build",
        "--format=docker",
        "--pull=never",
        "--network=host",
        f"--build-arg=PYTHON_IMAGE={base}",
        "--target=runtime",
        f"--tag={IMAGE}",
        str(ROOT),
        env=env,
        timeout=900,
    )
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
        IMAGE,
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
        inspected = json.loads(podman("image", "inspect", IMAGE, env=env).stdout)[0]
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
            "sh",
            "-c",
            "command -v gcc cc || python3 -c 'import torch' 2>/dev/null || echo lean",
            env=env,
        )
        assert lean.stdout.strip() == "lean", "no compiler and no torch in the daemon image"
        podman("stop", "--time=5", name, env=env)
        state = json.loads(podman("inspect", name, env=env).stdout)[0]["State"]
        assert state["ExitCode"] == 0, "SIGTERM stops the daemon cleanly"
    finally:
        podman("rm", "--force", "--time=1", name, env=env, check=False)
