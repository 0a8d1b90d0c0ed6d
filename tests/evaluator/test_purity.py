"""The evaluation engine runs without Django, so the load harness can use it on its own."""

from __future__ import annotations

import subprocess
import sys

ENGINE = [
    "evaluator.engine.scheduler",
    "evaluator.engine.attempts",
    "evaluator.engine.lanes",
    "evaluator.engine.rulesets",
    "evaluator.engine.invocation",
    "evaluator.engine.outcomes",
    "evaluator.engine.receipts",
    "evaluator.engine.telemetry",
    "evaluator.engine.adapters",
]


def test_engine_modules_import_no_django():
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in ENGINE)
        + "leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'rest_framework', 'celery'))\n"
        "print(','.join(leaked))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == ""
