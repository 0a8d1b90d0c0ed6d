"""``manage.py run_load_harness``: run a preregistered load manifest offline on virtual time, or
at real time against the deployment's staged provider (``--target staged-provider``).

The offline targets are the same run as ``python -m evaluator.harness`` (``evaluator.harness.cli``,
no Django); the staged provider needs the deployment's settings, so only this command offers it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from evaluator.deployment import AdapterConfigError, staged_endpoints, staged_window_seconds
from evaluator.harness.cli import (
    DESCRIPTION,
    ProgressBar,
    add_arguments,
    resolve_manifest,
    summary_lines,
)
from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.records import TARGET_STAGED
from evaluator.harness.service import LOAD_TARGETS, evidence_path, run_manifest, write_record
from evaluator.harness.staged_target import run_staged
from evaluator.harness.target import Progress


class Command(BaseCommand):
    help = DESCRIPTION

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser, [*sorted(LOAD_TARGETS), TARGET_STAGED])
        parser.add_argument(
            "--window-seconds",
            type=float,
            help="staged-provider only: seconds of the timeline to run at real time "
            "(default: SLUICE_STAGED_PROVIDER.windowSeconds)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        target = options["target"]
        try:
            manifest = resolve_manifest(options["manifest"], Path(settings.BASE_DIR))
        except LoadHarnessError as error:
            raise CommandError(str(error)) from error
        destinations: list[Path] = []
        if options["output"]:
            destinations.append(Path(options["output"]))
        if options["write_evidence"]:
            if target == TARGET_STAGED:
                raise CommandError(
                    "--write-evidence keeps offline records; write a staged record with --output"
                )
            destinations.append(evidence_path(settings.BASE_DIR / "evidence", manifest, target))
        # With nowhere else to go, the record is the command's output and the summary steps aside.
        summary_out = self.stdout if destinations else OutputWrapper(sys.stderr)

        progress = None
        if summary_out.isatty():
            progress = ProgressBar(
                lambda text: summary_out.write(text, ending=""), f"{target} {manifest.version}"
            )
        try:
            record = self._run(manifest, target, options["window_seconds"], progress)
        except (LoadHarnessError, AdapterConfigError) as error:
            raise CommandError(str(error)) from error
        finally:
            if progress is not None:
                progress.close()

        for destination in destinations:
            write_record(record, destination)
        styles = {"pass": self.style.SUCCESS, "fail": self.style.ERROR}
        for style, line in summary_lines(record):
            summary_out.write(styles[style](line) if style else line)
        for destination in destinations:
            summary_out.write(f"wrote {destination}")
        if not destinations:
            self.stdout.write(json.dumps(record, indent=2, ensure_ascii=False))

    def _run(
        self,
        manifest: LoadManifest,
        target: str,
        window_seconds: float | None,
        progress: Progress | None,
    ) -> dict[str, Any]:
        if target != TARGET_STAGED:
            if window_seconds is not None:
                raise CommandError("--window-seconds is for --target staged-provider only")
            return run_manifest(manifest, target, progress)
        endpoints = staged_endpoints(sorted(manifest.section("providers")))
        window = staged_window_seconds() if window_seconds is None else window_seconds
        return run_staged(manifest, endpoints, window, progress)
