"""The interpreter the benchmarks run the daemon with: a virtualenv holding gpuscope and its
runtime dependencies only (`pip install .`), as the container image does.

The development venv would distort the figures: it also holds the test tools, and some runtime
dependencies import optional packages when they find them (the kubernetes client imports
kubernetes-validate and with it jsonschema, about 2 MiB more per daemon).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".cache" / "bench-runtime"


def runtime_python() -> str:
    """The runtime venv's python, created on first use. pip rebuilds a project given by path
    every time, so the benchmark measures the working tree (and new dependencies arrive)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        check=True,
    )
    return str(python)
