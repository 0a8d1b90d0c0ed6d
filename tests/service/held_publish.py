"""A test app: while the file named by SLUICE_TEST_HOLD_PUBLISH exists, every doorbell this
process publishes waits (after touching `<file>.held`), so a test can kill the web process
between a run's commit and its doorbell."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.apps import AppConfig

from evaluator.services import doorbell


def _hold(path: Path) -> None:
    Path(f"{path}.held").touch()
    while path.exists():
        time.sleep(0.02)


class HeldPublishConfig(AppConfig):
    name = "tests.service.held_publish"
    label = "held_publish"

    def ready(self) -> None:
        path = Path(os.environ["SLUICE_TEST_HOLD_PUBLISH"])
        doorbell.before_ring(lambda: _hold(path))
