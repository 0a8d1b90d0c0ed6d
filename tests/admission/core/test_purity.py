"""The pure core imports no framework, and the manifests are the preregistered bytes."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

MANIFEST_DIGESTS = {
    "load-manifest.v1.json": "9c6db981b0e1d124e317651ed15e8972fbf27b7a7596b15aa23ea3baac4bb03f",
    "load-manifest.v2.json": "416a41466dc58063f45b5e5e9a7ad78b011cf6d3be50b081bab6e47c76a28a0c",
}


@pytest.mark.parametrize("module", ["admission.core", "evaluator.harness"])
def test_pure_packages_import_no_framework_in_a_fresh_interpreter(module):
    frameworks = "{'django', 'rest_framework', 'celery', 'kombu'}"
    probe = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {frameworks}); "
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
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
