"""The test suite's own layout: no module under tests/ imports another test module. What tests
share lives in helper modules (tests/helpers.py, tests/fake_nvml/, tests/attributed_node.py,
tests/golden_fleet.py, ...) or in conftest.py fixtures, so that running, moving or deleting one
test file never changes another."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from tests.helpers import ROOT

if TYPE_CHECKING:
    from pathlib import Path

TESTS = ROOT / "tests"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported_test_modules(source: str, module: str) -> list[tuple[int, str]]:
    """The other test modules that `module` (whose text is `source`) imports: (line, name)."""
    package = module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .x import y, from .. import x
                parent = ".".join(package[: len(package) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            # `from package import name` may import a module named `name`
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [
            (node.lineno, name)
            for name in names
            if name.startswith("tests.")
            and name.rsplit(".", 1)[-1].startswith("test_")
            and name != module
        ]
    return found


def test_no_module_under_tests_imports_another_test_module() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len([path for path in files if path.name.startswith("test_")]) > 50
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in files
        for line, module in imported_test_modules(
            path.read_text(encoding="utf-8"), module_name(path)
        )
    ]
    assert not offenders, (
        "a test module imports another; move what they share into a helper module under tests/ "
        "(or a conftest.py fixture) and import it from there:\n" + "\n".join(offenders)
    )


def test_the_check_sees_every_form_of_import() -> None:
    source = (
        "import tests.test_a\n"
        "import tests.test_b as b\n"
        "from tests.test_c import x\n"
        "from tests import test_d, helpers\n"
        "from . import test_e\n"
        "from .test_f import y\n"
        "from tests.fake_nvml.test_g import z\n"
        "from .. import test_h\n"
        "from tests.helpers import eventually\n"
        "from tests.fake_nvml.node import fake_env\n"
        "from aiohttp.test_utils import TestClient\n"
        "from tests.sub.test_self import itself\n"
        "import pytest\n"
    )
    assert imported_test_modules(source, "tests.sub.test_self") == [
        (1, "tests.test_a"),
        (2, "tests.test_b"),
        (3, "tests.test_c"),
        (4, "tests.test_d"),
        (5, "tests.sub.test_e"),
        (6, "tests.sub.test_f"),
        (7, "tests.fake_nvml.test_g"),
        (8, "tests.test_h"),
    ]
