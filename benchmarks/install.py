"""How large an install of gpuscope is: a fresh virtualenv, `pip install gpuscope[EXTRAS]` from this
tree, its site-packages measured with `du -sm` and each distribution's share; prints one JSON
document.

    .venv/bin/python benchmarks/install.py                      # the core install: the daemon
    .venv/bin/python benchmarks/install.py --extras rightsize   # with extras, for comparison

The package is built from a copy of what the Dockerfile copies (pyproject.toml, README.md,
exporter/), so nothing is written into the working tree; pip takes the dependencies from its
index and cache as a user's pip would. The target from issue 28: the core install under 100 MB of
site-packages (tests/test_install.py checks it, and that it serves the simulator).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
TARGET_MB: Final = 100
_SHARES: Final = """
import json, os, sys
from importlib import metadata
shares = {}
for distribution in metadata.distributions():
    size = 0
    for file in distribution.files or ():
        path = file.locate()
        if os.path.isfile(path):
            size += os.path.getsize(path)
    shares[distribution.metadata["Name"]] = size
print(json.dumps(shares))
"""


def source_copy(into: Path) -> Path:
    """The files the package is built from, as the Dockerfile copies them."""
    source = into / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "exporter", source / "exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    return source


def install(venv: Path, *, extras: tuple[str, ...] = ()) -> Path:
    """A new virtualenv at `venv` with gpuscope[extras] installed; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="gpuscope-install-") as scratch:
        source = source_copy(Path(scratch))
        wanted = f"{source}[{','.join(extras)}]" if extras else str(source)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wanted],
            check=True,
            timeout=1800,
        )
    return python


def site_packages(python: Path) -> Path:
    found = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    return Path(found)


def measure(python: Path) -> dict[str, Any]:
    """site-packages in MB as `du -sm` counts it, and each distribution's files in MB."""
    site = site_packages(python)
    du = subprocess.run(
        ["du", "-sm", str(site)], capture_output=True, text=True, check=True, timeout=120
    )
    shares = json.loads(
        subprocess.run(
            [str(python), "-c", _SHARES], capture_output=True, text=True, check=True, timeout=120
        ).stdout
    )
    return {
        "site_packages_mb": int(du.stdout.split()[0]),
        "distributions_mb": {
            name: round(size / 1e6, 1)
            for name, size in sorted(shares.items(), key=lambda item: -item[1])
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="", help="comma-separated extras, e.g. rightsize")
    parser.add_argument("--keep", type=Path, help="build the virtualenv here and keep it")
    args = parser.parse_args()
    extras = tuple(filter(None, args.extras.split(",")))
    with tempfile.TemporaryDirectory(prefix="gpuscope-venv-") as scratch:
        venv = args.keep or Path(scratch) / "venv"
        started = time.monotonic()
        python = install(venv, extras=extras)
        took = time.monotonic() - started
        result = {
            "install": f"gpuscope[{','.join(extras)}]" if extras else "gpuscope",
            "python": sys.version.split()[0],
            **measure(python),
            "target_mb": TARGET_MB if not extras else None,
            "install_seconds": round(took, 1),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
