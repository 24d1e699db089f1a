"""The documentation: its reference tables equal what the code declares, the site builds with
every link and anchor resolved, and the README stays a landing page."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.helpers import ROOT, require_tool

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(120)

README_LINES = 400


def test_generated_sections_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a link to a page or an anchor that does not exist fails it."""
    mkdocs = require_tool("mkdocs")
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_LINES
    for command in ("scripts/try", "scripts/test", "helm install"):
        assert command in readme
