"""No import circles between the package's modules.

Every import counts, wherever it is written: at the top, inside a function, or under
`TYPE_CHECKING` — a circle of annotations is still two modules that cannot be read one before the
other. `from package import name` imports the module `package.name` where there is one, else
`package` itself. The layers contract (`lint-imports`) keeps the packages in order; this keeps
the modules inside each package in order too.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import pytest

from tests.helpers import ROOT

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`, by its dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, *, is_package: bool) -> list[str]:
    """The dotted names an import statement names (before they are matched to modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{alias.name}" for alias in node.names] or [base]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for dotted in _imported(node, name, is_package=is_package):
                target = dotted
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[module] = min(low[module], order[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == order[module]:
                group: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(frozenset(group))
    return found


def test_the_package_has_no_import_circles() -> None:
    """TYPE_CHECKING imports count: a circle there is a design knot all the same."""
    found = circles(import_graph(ROOT / "exporter"))
    assert not found, f"import circles: {[sorted(group) for group in found]}"


def test_a_circle_is_found_through_type_checking_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import thing\n"
    )
    (package / "c.py").write_text("from pkg import a\n\ndef later():\n    import pkg.c\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a"}
    assert circles(graph) == [frozenset({"pkg.a", "pkg.sub.b"})]
