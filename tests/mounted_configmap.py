"""A directory updated the way the kubelet updates a mounted ConfigMap, for the tests that
publish calibration profiles to a running daemon (tests/test_faults.py,
tests/test_calibration_e2e.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def publish(root: Path, files: dict[str, str], generation: int) -> None:
    """Write `files` as the kubelet does: a new timestamped directory, the `..data` symlink
    swapped to it atomically, and one `key -> ..data/key` symlink per key."""
    root.mkdir(exist_ok=True)
    version = root / f"..2026_11_22_{generation:02d}"
    version.mkdir()
    for key, text in files.items():
        (version / key).write_text(text)
    (root / "..data_tmp").symlink_to(version.name)
    os.replace(root / "..data_tmp", root / "..data")
    for key in files:
        if not (root / key).is_symlink():
            (root / key).symlink_to(f"..data/{key}")
