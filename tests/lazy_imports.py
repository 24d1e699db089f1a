"""What `gpuscope serve` imports only when the feature that needs it is configured, declared once
(README, Running at scale, Memory), and how a test reads the modules a real daemon held: a
`sitecustomize` on the daemon's `PYTHONPATH` writes `sys.modules` to a file when it exits."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

LAZY: Final = {
    "kubernetes": "a kubeconfig whose user has an auth-provider (at its first request)",
    "google.protobuf": "nothing: the kubelet's answer is walked on the wire (its generated "
    "messages serve the tests' gRPC server)",
    "exporter.simulator": "--simulate",
    "exporter.dcgm": "--compat.dcgm",
    "csv": "--compat.dcgm-counters",
    "bcrypt": "basic_auth_users in --web.config.file",
    "exporter.calibration.parse": "--calibration.path",
    "exporter.calibrate": "gpuscope calibrate",
    "exporter.rightsize": "gpuscope rightsize",
    "torch": "gpuscope calibrate",
    "aiohttp": "gpuscope rightsize (its Prometheus client and webhooks)",
}
"""A package (with its submodules) and what alone may import it."""
JOBS_LIBRARIES: Final = (
    "aiohttp",
    "rich",
    "jinja2",
    "kubernetes",
    "torch",
    "numpy",
    "protobuf",
    "grpcio",
)
"""The jobs' libraries (and the tests' gRPC): none of them is in the core install or the daemon's
image, whose every node pulls them."""
MODULES_ENV: Final = "GPUSCOPE_TEST_MODULES_FILE"
_SITECUSTOMIZE: Final = f"""
import atexit, json, os, sys

def _write_modules():
    with open(os.environ[{MODULES_ENV!r}], "w", encoding="utf-8") as out:
        json.dump(sorted(sys.modules), out)

atexit.register(_write_modules)
"""


def loaded_lazily(modules: Iterable[str], *, but: Iterable[str] = ()) -> list[str]:
    """The modules among `modules` that belong to a package of `LAZY`, except those of `but`."""
    packages = tuple(package for package in LAZY if package not in set(but))
    return sorted(
        name
        for name in modules
        if any(name == package or name.startswith(f"{package}.") for package in packages)
    )


def modules_env(scratch: Path) -> dict[str, str]:
    """The environment under which a daemon writes its `sys.modules` (`written_modules`) when
    it exits."""
    site = scratch / "modules-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    path = os.pathsep.join(filter(None, (str(site), os.environ.get("PYTHONPATH"))))
    return {"PYTHONPATH": path, MODULES_ENV: str(scratch / "modules.json")}


def written_modules(scratch: Path) -> list[str]:
    """What the daemon run under `modules_env(scratch)` had imported when it exited."""
    modules: list[str] = json.loads((scratch / "modules.json").read_text(encoding="utf-8"))
    return modules
