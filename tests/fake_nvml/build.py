"""Compile the fake ``libnvidia-ml.so.1`` against the real ``nvml.h``."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
_HEADER_DIST = "nvidia-nvml-dev"

# -Wmissing-prototypes: every exported function must be declared by nvml.h, so a typo in a
# symbol name (an export pynvml would never find) fails the build instead of a test.
CFLAGS = (
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wmissing-prototypes",
    "-O1",
    "-shared",
    "-fPIC",
    "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
)
# The soname makes a library loaded by absolute path satisfy pynvml's later
# CDLL("libnvidia-ml.so.1"); -z defs rejects unresolved symbols at link time.
LDFLAGS = (f"-Wl,-soname,{LIBRARY_NAME}", "-Wl,-z,defs", "-pthread")


def nvml_header_dir() -> Path:
    """The include directory holding ``nvml.h`` from the installed nvidia-nvml-dev wheel."""
    try:
        files = importlib.metadata.files(_HEADER_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "nvml.h":
            header = Path(str(file.locate())).resolve()
            if header.is_file():
                return header.parent
    msg = (
        f"nvml.h not found: install the {_HEADER_DIST!r} wheel "
        "(it is in the project's 'dev' extra) to build the fake NVML library"
    )
    raise RuntimeError(msg)


@cache
def exported_functions() -> tuple[str, ...]:
    """NVML symbols the fake exports: one ``#ifndef FAKE_OMIT_<symbol>`` guard each."""
    text = SOURCE.read_text(encoding="utf-8")
    return tuple(re.findall(r"^#ifndef FAKE_OMIT_(\w+)$", text, flags=re.MULTILINE))


def build_fake_nvml(out_dir: Path, *, omit: Sequence[str] = ()) -> Path:
    """Compile into ``out_dir/libnvidia-ml.so.1`` and return ``out_dir``.

    ``omit`` names exported functions to leave out, so calling them through pynvml raises
    ``NVMLError_FunctionNotFound`` as with a driver older than the binding.
    """
    unknown = sorted(set(omit) - set(exported_functions()))
    if unknown:
        msg = f"cannot omit {unknown}: not exported by {SOURCE.name}"
        raise ValueError(msg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY_NAME
    # Link beside the target and rename: overwriting a library that a running process has
    # mapped would corrupt that process.
    partial = out_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    cmd = [
        os.environ.get("CC", "gcc"),
        *CFLAGS,
        f"-I{nvml_header_dir()}",
        *(f"-DFAKE_OMIT_{name}" for name in omit),
        "-o",
        str(partial),
        str(SOURCE),
        *LDFLAGS,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or result.stderr.strip():
        partial.unlink(missing_ok=True)
        msg = f"building the fake NVML library failed:\n$ {shlex.join(cmd)}\n{result.stderr}"
        raise RuntimeError(msg)
    partial.replace(target)
    return out_dir
