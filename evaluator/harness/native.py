"""Compiled builds of the load harness's hot modules, used only while they match the sources.

The admission-controller path spends nearly all of its time inside the admission controller and
its scopes, buckets and rotation. ``python -m evaluator.harness`` therefore runs those modules,
and the arrival generator, as C extensions compiled from the very same Python sources by mypyc
(the compiler that builds mypy itself). Nothing else loads them: the web server, the workers, the
management command and the tests import the Python modules as always.

``build`` compiles the modules in a scratch copy of the sources (so no extension ever lands beside
a ``.py`` file) and writes them, with a stamp naming each source's SHA-256, under
``build/native/``; ``make install`` runs it. ``activate`` serves those extensions in place of the
modules, all of them or none: only when the stamp's digests equal the sources' digests now and the
build is for this interpreter. An edited source, a build for another Python or no build at all
leaves the harness on the Python modules, which decide exactly the same (the harness tests compare
the records of both). Modules of one build call into each other directly, so a partial swap is
never made.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = [
    "COMPILED_MODULES",
    "DEFAULT_BUILD_DIR",
    "activate",
    "build",
    "compiled_in_use",
    "main",
    "stale_modules",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUILD_DIR = PROJECT_ROOT / "build" / "native"
STAMP_NAME = "stamp.json"
STAMP_SCHEMA = "sluice-native-build/v1"

COMPILED_MODULES = (
    "admission.core.controller",
    "admission.core.evidence",
    "admission.core.request",
    "admission.core.rotation",
    "admission.core.rules",
    "admission.core.scopes",
    "admission.core.ticket",
    "evaluator.harness.arrivals",
)

# What mypy must see to type the compiled modules: their packages and everything they import.
_SOURCE_TREES = (
    "admission/__init__.py",
    "admission/core",
    "evaluator/__init__.py",
    "evaluator/harness",
)

# mypyc needs a program that type-checks on its own terms; the project's mypy settings load the
# Django plugin, which a Django-free build must not.
_MYPY_CONFIG = "[mypy]\npython_version = 3.11\nignore_missing_imports = True\n"


def _source_path(module: str, root: Path) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extension_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def build(build_dir: Path = DEFAULT_BUILD_DIR, root: Path = PROJECT_ROOT) -> Path:
    """Compile ``COMPILED_MODULES`` from the sources under ``root`` into ``build_dir``.

    Returns the stamp's path. The previous build is replaced only once the new one is complete.
    Raises ``RuntimeError`` with mypyc's output when compiling fails (no C compiler, no Python
    headers, a source mypyc cannot compile).
    """
    suffix = _extension_suffix()
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-native-") as scratch_name:
        scratch = Path(scratch_name)
        for tree in _SOURCE_TREES:
            source, target = root / tree, scratch / tree
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
        config = scratch / "mypyc.ini"
        config.write_text(_MYPY_CONFIG, encoding="utf-8")
        sources = [str(_source_path(module, Path())) for module in COMPILED_MODULES]
        command = [sys.executable, "-m", "mypyc", "--config-file", str(config), *sources]
        done = subprocess.run(command, cwd=scratch, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"mypyc failed:\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
        support = list(scratch.glob(f"*__mypyc{suffix}"))
        if len(support) != 1:
            raise RuntimeError(f"expected one mypyc support library, found {len(support)}")
        staging = scratch / "native"
        staging.mkdir()
        modules: dict[str, dict[str, str]] = {}
        for module in COMPILED_MODULES:
            compiled = _source_path(module, scratch).with_suffix(suffix)
            shutil.copy2(compiled, staging / f"{module}{suffix}")
            modules[module] = {
                "file": f"{module}{suffix}",
                "sourceSha256": _digest(_source_path(module, scratch)),
            }
        # The support library every compiled module of the build imports by name.
        shutil.copy2(support[0], staging / support[0].name)
        stamp = {
            "schema": STAMP_SCHEMA,
            "python": sys.version,
            "extensionSuffix": suffix,
            "support": {"module": support[0].name[: -len(suffix)], "file": support[0].name},
            "modules": modules,
        }
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        if build_dir.exists():
            shutil.rmtree(build_dir)
        shutil.copytree(staging, build_dir)
    return build_dir / STAMP_NAME


def _read_stamp(build_dir: Path) -> dict[str, object] | None:
    try:
        stamp = json.loads((build_dir / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("schema") != STAMP_SCHEMA:
        return None
    return stamp


def stale_modules(build_dir: Path = DEFAULT_BUILD_DIR, root: Path = PROJECT_ROOT) -> list[str]:
    """The compiled modules whose sources changed since ``build_dir`` was built (all of them
    when there is no usable build for this interpreter); empty when the build can be used."""
    stamp = _read_stamp(build_dir)
    if (
        stamp is None
        or stamp.get("python") != sys.version
        or stamp.get("extensionSuffix") != _extension_suffix()
    ):
        return list(COMPILED_MODULES)
    built = stamp.get("modules")
    if not isinstance(built, dict):
        return list(COMPILED_MODULES)
    stale = []
    for module in COMPILED_MODULES:
        entry = built.get(module)
        source = _source_path(module, root)
        if (
            not isinstance(entry, dict)
            or not source.is_file()
            or entry.get("sourceSha256") != _digest(source)
            or not (build_dir / str(entry.get("file"))).is_file()
        ):
            stale.append(module)
    return stale


class _CompiledModules(importlib.abc.MetaPathFinder):
    """Finds the build's extension for each compiled module name, before any other finder."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        location = self.files.get(fullname)
        if location is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(location))
        return importlib.util.spec_from_file_location(fullname, location, loader=loader)


def activate(build_dir: Path = DEFAULT_BUILD_DIR, root: Path = PROJECT_ROOT) -> bool:
    """Serve the compiled modules from now on if the build matches the sources; True if so.

    Call it before anything imports ``admission.core`` or the harness's modules: a module
    already imported stays what it is, so activating late is refused (False).
    """
    if any(isinstance(finder, _CompiledModules) for finder in sys.meta_path):
        return True
    if stale_modules(build_dir, root):
        return False
    watched = {*COMPILED_MODULES, "admission.core", "evaluator.harness.service"}
    if any(name in sys.modules for name in watched):
        return False
    stamp = _read_stamp(build_dir)
    assert stamp is not None
    modules = stamp["modules"]
    support = stamp["support"]
    assert isinstance(modules, dict) and isinstance(support, dict)
    files = {name: build_dir / entry["file"] for name, entry in modules.items()}
    files[str(support["module"])] = build_dir / str(support["file"])
    sys.meta_path.insert(0, _CompiledModules(files))
    return True


def compiled_in_use() -> bool:
    """Whether the admission controller imported in this process is the compiled one."""
    controller = sys.modules.get("admission.core.controller")
    return controller is not None and not str(getattr(controller, "__file__", "")).endswith(".py")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m evaluator.harness.native [build|status]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "status"
    if command == "build":
        try:
            stamp = build()
        except RuntimeError as error:
            sys.stderr.write(
                f"compiled modules not built; the harness runs them as Python.\n{error}\n"
            )
            return 1
        sys.stdout.write(f"compiled {len(COMPILED_MODULES)} modules into {stamp.parent}\n")
        return 0
    if command == "status":
        stale = stale_modules()
        if not stale:
            sys.stdout.write(f"compiled build in {DEFAULT_BUILD_DIR} matches the sources\n")
            return 0
        sys.stdout.write(f"not used (stale or missing): {', '.join(stale)}\n")
        return 1
    sys.stderr.write("usage: python -m evaluator.harness.native [build|status]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
