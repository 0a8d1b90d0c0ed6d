"""The layout's rules that import-linter does not check: no import circle between modules
(lazy imports included) and no private name used across modules."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

from tests.import_graph import circles

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("admission", "evaluator", "console", "config")


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(module: str, tree: ast.AST) -> list[str]:
    """`from x import _name` and `alias._name` where `alias` is a module imported from another
    module of the project: each found as 'line: what'."""
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> project module it names
    known = {name for name, _ in _modules()}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    modules[alias.asname or alias.name] = full
                elif _private(alias.name) and node.module != module:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and modules.get(node.value.id, module) != module
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("module,path", list(_modules()), ids=lambda v: str(v))
def test_no_private_name_is_used_across_modules(module: str, path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert private_uses(module, tree) == []


def test_no_module_imports_itself_back_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert circles(graph) == []


def test_no_test_hook_in_production_code() -> None:
    # Tests inject their holds through public hooks (`doorbell.before_ring`,
    # `load_runs.on_progress`) from test apps; production code reads no test-only setting.
    found = [
        f"{module}:{number}"
        for module, path in _modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "SLUICE_TEST_" in line
    ]
    assert found == []


def test_the_circle_finder_finds_a_circle_through_three_modules() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert circles(graph) == [["a", "b", "c"]]
