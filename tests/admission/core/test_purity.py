"""The pure packages import no framework, and the manifests are the preregistered bytes.

The import contracts themselves live in pyproject.toml (`[tool.importlinter]`) and are checked by
`lint-imports`, statically, in `make lint`; the test below also runs them, and then imports every
module of the pure packages in a fresh interpreter, which catches what a static graph cannot
see (an import made at run time).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PURE = ("admission.core", "evaluator.engine", "evaluator.harness")
FRAMEWORKS = ("django", "rest_framework", "celery", "kombu", "drf_spectacular")

MANIFEST_DIGESTS = {
    "load-manifest.v1.json": "9c6db981b0e1d124e317651ed15e8972fbf27b7a7596b15aa23ea3baac4bb03f",
    "load-manifest.v2.json": "416a41466dc58063f45b5e5e9a7ad78b011cf6d3be50b081bab6e47c76a28a0c",
}


def test_import_contracts_are_kept():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("package", PURE)
def test_every_module_of_a_pure_package_imports_no_framework_at_run_time(package):
    script = (
        "import importlib, pkgutil, sys\n"
        f"root = importlib.import_module({package!r})\n"
        "for module in pkgutil.walk_packages(root.__path__, root.__name__ + '.'):\n"
        # A __main__ module runs a command when imported; its imports are its package's.
        "    if not module.name.endswith('.__main__'):\n"
        "        importlib.import_module(module.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(','.join(bad))\n"
    )
    # A fresh interpreter without DJANGO_SETTINGS_MODULE: nothing may pull a framework in.
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("name", sorted(MANIFEST_DIGESTS))
def test_manifests_are_byte_identical_to_the_preregistered_ones(name):
    digest = hashlib.sha256((ROOT / "manifests" / name).read_bytes()).hexdigest()
    assert digest == MANIFEST_DIGESTS[name]
