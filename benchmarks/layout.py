"""Figures of the layout: files and lines per layer, import circles, imports that run up a
layer, and the largest functions and longest signatures.

    .venv/bin/python benchmarks/layout.py [--top N]

Reads the source as text and the import graph with grimp (import-linter's graph); runs nothing.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.import_graph import circles as import_circles  # noqa: E402

# Top to bottom: a module may import its own layer and the layers below it.
LAYERS = ("config", "console", "evaluator", "admission")


def _layer(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if len(parts) > 2:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def _sources() -> list[Path]:
    return [
        path
        for package in LAYERS
        if (ROOT / package).is_dir()
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def _upward(graph: grimp.ImportGraph) -> list[str]:
    rank = {name: depth for depth, name in enumerate(LAYERS)}
    up = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            a, b = module.split(".")[0], imported.split(".")[0]
            if a in rank and b in rank and rank[b] < rank[a]:
                up.append(f"{module} -> {imported}")
    return up


def _reasoned(
    node: ast.FunctionDef | ast.AsyncFunctionDef, owner: ast.ClassDef | None, word: str
) -> bool:
    """Whether the function's docstring (for `__init__`, its class's too) gives a reason that
    names `word` ("parameters", "lines")."""
    texts = [ast.get_docstring(node) or ""]
    if owner is not None and node.name == "__init__":
        texts.append(ast.get_docstring(owner) or "")
    return any(word in text for text in texts)


def _functions(paths: list[Path]) -> list[tuple[int, int, str, bool, bool]]:
    """(lines, parameters, where, a reason for its length, a reason for its parameters) of
    every function and method."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owners: dict[ast.AST, ast.ClassDef] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for child in node.body:
                    owners[child] = node
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = node.args
                count = len(arguments.posonlyargs) + len(arguments.args)
                count += len(arguments.kwonlyargs)
                if arguments.args and arguments.args[0].arg in ("self", "cls"):
                    count -= 1
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                owner = owners.get(node)
                found.append(
                    (
                        lines,
                        count,
                        where,
                        _reasoned(node, owner, "long"),
                        _reasoned(node, owner, "parameters"),
                    )
                )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="how many functions to list")
    options = parser.parse_args(argv)
    paths = _sources()
    files: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    for path in paths:
        files[_layer(path)] += 1
        lines[_layer(path)] += len(path.read_text(encoding="utf-8").splitlines())
    print(f"{'layer':34} {'files':>6} {'lines':>7}")
    for layer in sorted(files):
        print(f"{layer:34} {files[layer]:>6} {lines[layer]:>7}")
    print(f"{'total':34} {sum(files.values()):>6} {sum(lines.values()):>7}")
    present = [package for package in LAYERS if (ROOT / package).is_dir()]
    graph = grimp.build_graph(*present, cache_dir=None)
    circles = import_circles(graph)
    print(f"\nimport circles (lazy imports included): {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(circle))
    upward = _upward(graph)
    print(f"imports up the layers {' > '.join(LAYERS)}: {len(upward)}")
    for edge in upward:
        print("  " + edge)
    functions = _functions(paths)
    print(f"\nlargest functions (of {len(functions)}):")
    for size, count, where, _, _ in sorted(functions, reverse=True)[: options.top]:
        print(f"  {size:>4} lines {count:>3} parameters  {where}")
    long_bodies = [f for f in functions if f[0] > 80]
    long_signatures = sorted((f for f in functions if f[1] > 6), key=lambda f: -f[1])
    # A reason: the docstring says why it runs long ("long") or takes so many ("parameters").
    unexplained = sum(1 for f in long_bodies if not f[3])
    print(f"functions over 80 lines: {len(long_bodies)} ({unexplained} without a reason)")
    unexplained = sum(1 for f in long_signatures if not f[4])
    print(f"functions over 6 parameters: {len(long_signatures)} ({unexplained} without a reason)")
    for size, count, where, _, reason in long_signatures[: options.top]:
        note = "" if reason else "  (no reason in its docstring)"
        print(f"  {count:>3} parameters {size:>4} lines  {where}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
