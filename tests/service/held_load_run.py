"""A test app: while the file named by SLUICE_TEST_HOLD_LOAD_RUN exists, each load run this
process runs holds still after its first progress report (after writing its id to
`<file>.held`), still answering cancel requests, so a test can kill or cancel it mid-run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from evaluator.services.load_runs import LoadRunWatch, ProgressHook


def _holder(path: Path) -> ProgressHook:
    held: set[object] = set()

    def hold(watch: LoadRunWatch, fraction: float) -> None:
        if fraction <= 0.0 or watch.run_id in held:
            return
        held.add(watch.run_id)
        Path(f"{path}.held").write_text(str(watch.run_id))
        while path.exists():
            watch.raise_if_stopped()
            time.sleep(0.05)

    return hold


class HeldLoadRunConfig(AppConfig):
    name = "tests.service.held_load_run"
    label = "held_load_run"

    def ready(self) -> None:
        # Imported once the apps are loaded: the module imports models.
        from evaluator.services import load_runs

        load_runs.on_progress(_holder(Path(os.environ["SLUICE_TEST_HOLD_LOAD_RUN"])))
