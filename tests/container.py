"""Build and run gpuscope's image with Debian's podman, without a Docker engine or a registry.

No registry is reachable here, so the base image the Dockerfile names (python:3.11-slim) is
replaced by a stand-in made from Debian's packages with debootstrap: Debian bookworm's python3
(3.11) with venv and pip, plus this machine's CA bundle and pip settings so that `pip install`
inside the build reaches PyPI the way the host does. That stand-in is test-only; the production
Dockerfile is built unchanged, with `--build-arg PYTHON_IMAGE=<stand-in>`.

Everything podman keeps (storage, the stand-in rootfs) lives in a cache directory, so only the
first run on a machine pays for debootstrap (about a minute).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from pathlib import Path

from tests.helpers import ROOT

BASE_IMAGE = "localhost/gpuscope-test-base:bookworm"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuscope-tests"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def debian_mirror() -> str:
    """The machine's own Debian mirror (from apt's sources), or Debian's default."""
    for source in [
        *sorted(Path("/etc/apt/sources.list.d").glob("*")),
        Path("/etc/apt/sources.list"),
    ]:
        if source.is_file():
            match = re.search(r"(?:URIs:\s*|deb\s+)(https?://\S+/debian)\b", source.read_text())
            if match:
                return match[1]
    return "http://deb.debian.org/debian"


def podman_env() -> dict[str, str]:
    """Environment selecting a podman configuration that works on these machines: runc (crun
    refuses hybrid cgroups), cgroupfs, a nofile limit within the hard limit, storage in CACHE."""
    CACHE.mkdir(parents=True, exist_ok=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = hard if hard != resource.RLIM_INFINITY else 1048576
    containers = CACHE / "containers.conf"
    containers.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={limit}:{limit}", "nproc=32768:32768"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )
    storage = CACHE / "storage.conf"
    storage.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{CACHE / "storage"}"\nrunroot = "{CACHE / "run"}"\n'
    )
    return {
        **os.environ,
        "CONTAINERS_CONF": str(containers),
        "CONTAINERS_STORAGE_CONF": str(storage),
    }


def podman(
    *args: str, env: dict[str, str], timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def ensure_base_image(env: dict[str, str]) -> str:
    if podman("image", "exists", BASE_IMAGE, env=env, check=False).returncode == 0:
        return BASE_IMAGE
    rootfs = CACHE / "rootfs"
    if not (rootfs / "usr" / "bin" / "python3").exists():
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,python3-pip,ca-certificates",
                "bookworm",
                str(rootfs),
                debian_mirror(),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    if CA_BUNDLE.exists():
        shutil.copyfile(CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        subprocess.run(
            ["podman", "import", "-", BASE_IMAGE],
            stdin=tar.stdout,
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
    return BASE_IMAGE


def build_image(
    env: dict[str, str], target: str, tag: str, *build_args: str, timeout: float = 900
) -> None:
    """The production Dockerfile's `target`, built unchanged over the stand-in base."""
    podman(
        "build",
        "--format=docker",
        "--pull=never",
        "--network=host",
        f"--build-arg=PYTHON_IMAGE={BASE_IMAGE}",
        *(f"--build-arg={argument}" for argument in build_args),
        f"--target={target}",
        f"--tag={tag}",
        str(ROOT),
        env=env,
        timeout=timeout,
    )
