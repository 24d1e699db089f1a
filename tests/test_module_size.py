"""No module of the package over 700 lines: a module that grows past it is split where it has a
seam (a class and what reads it, a table of data, a format), so that each stays one room a reader
can hold. Generated code (protoc's output) is not counted."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(30)

LIMIT = 700


def test_no_module_of_the_package_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "exporter").rglob("*.py"))
        if not path.name.endswith("_pb2.py")
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not long, f"modules over {LIMIT} lines: {long}"
