from __future__ import annotations

import subprocess
import sys

from .conftest import PROJECT_ROOT

FORBIDDEN = ("django", "rest_framework", "celery", "kombu", "drf_spectacular")


def test_harness_imports_neither_django_drf_nor_celery():
    script = (
        "import importlib, pkgutil, sys\n"
        "import evaluator.harness as harness\n"
        "for module in pkgutil.walk_packages(harness.__path__, 'evaluator.harness.'):\n"
        "    importlib.import_module(module.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    # A fresh interpreter without DJANGO_SETTINGS_MODULE: nothing may pull the framework in.
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"framework modules imported: {result.stdout}{result.stderr}"
