"""The README's generated tables (flags, metrics) equal what the code declares."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_generated_sections_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
