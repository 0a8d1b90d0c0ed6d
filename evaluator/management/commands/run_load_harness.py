"""``manage.py run_load_harness``: run a preregistered load manifest offline on virtual time, or
at real time against the deployment's staged provider (``--target staged-provider``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from evaluator.deployment import AdapterConfigError, staged_endpoints, staged_window_seconds
from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.manifests import LoadManifest, load_manifest
from evaluator.harness.records import TARGET_STAGED
from evaluator.harness.service import LOAD_TARGETS, evidence_path, run_manifest, write_record
from evaluator.harness.staged_target import run_staged
from evaluator.harness.target import Progress

_BAR_WIDTH = 30


class _ProgressBar:
    """A one-line bar redrawn in place; only used when the output is a terminal."""

    def __init__(self, out: OutputWrapper, label: str) -> None:
        self.out = out
        self.label = label
        self.shown = -1

    def __call__(self, fraction: float) -> None:
        percent = int(fraction * 100)
        if percent == self.shown:
            return
        self.shown = percent
        filled = _BAR_WIDTH * percent // 100
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self.out.write(f"\r{self.label} [{bar}] {percent:3d}%", ending="")
        self.out.flush()

    def close(self) -> None:
        if self.shown >= 0:
            self.out.write("")


class Command(BaseCommand):
    help = (
        "Release a preregistered load manifest's arrivals into the admission controller or the "
        "evaluator on virtual time and write the digest-bound decision-load-result/v1 record."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--manifest", required=True, help="path of a preregistered load manifest"
        )
        parser.add_argument(
            "--target", required=True, choices=[*sorted(LOAD_TARGETS), TARGET_STAGED]
        )
        parser.add_argument(
            "--window-seconds",
            type=float,
            help="staged-provider only: seconds of the timeline to run at real time "
            "(default: SLUICE_STAGED_PROVIDER.windowSeconds)",
        )
        parser.add_argument("--output", help="also write the record to this file")
        parser.add_argument(
            "--write-evidence",
            action="store_true",
            help="replace the retained record under evidence/<manifest>/<target>.json",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        manifest = self._manifest(options["manifest"])
        target = options["target"]
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
            progress = _ProgressBar(summary_out, f"{target} {manifest.version}")
        try:
            record = self._run(manifest, target, options["window_seconds"], progress)
        except (LoadHarnessError, AdapterConfigError) as error:
            raise CommandError(str(error)) from error
        finally:
            if progress is not None:
                progress.close()

        for destination in destinations:
            write_record(record, destination)
        self._summarise(summary_out, record, destinations)
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

    def _manifest(self, given: str) -> LoadManifest:
        path = Path(given)
        if not path.is_absolute() and not path.exists():
            # Documented commands name the manifest relative to the project root.
            path = Path(settings.BASE_DIR) / path
        try:
            return load_manifest(path)
        except FileNotFoundError:
            raise CommandError(f"load manifest not found: {given}") from None
        except IsADirectoryError:
            raise CommandError(f"load manifest is a directory: {given}") from None
        except LoadHarnessError as error:
            raise CommandError(str(error)) from error

    def _summarise(
        self, out: OutputWrapper, record: dict[str, Any], destinations: list[Path]
    ) -> None:
        manifest = record["manifest"]
        observed = record["observations"]
        resources = record["resources"]
        out.write(
            f"{record['target']} · {record['mode']} · {manifest['schema']} {manifest['version']} "
            f"({manifest['digest'][:19]}…) · {record['window']['seconds']} "
            f"{'real' if record['mode'] == TARGET_STAGED else 'virtual'} s"
        )
        out.write(
            f"arrivals {observed['arrivals']}  attempts {observed['attempts']}  "
            f"completed {observed['completed']}  failed {observed['failed']}  "
            f"shed {observed['shed']}  cancelled {observed['cancelled']}"
        )
        if observed["shedReasons"]:
            reasons = ", ".join(f"{k} {v}" for k, v in observed["shedReasons"].items())
            out.write(f"shed reasons: {reasons}")
        out.write(
            f"cpu {resources['cpuSeconds']} s ({resources['cpuPercentOneCore']} % of one core)  "
            f"heap peak {resources['heapPeakMiB']} MiB  rss {resources['rssMiB']} MiB"
        )
        for comparison in record["comparisons"]:
            verdict = "pass" if comparison["pass"] else "FAIL"
            out.write(
                f"  {verdict}  {comparison['bound']}: observed {comparison['observed']}, "
                f"limit {comparison['limit']}"
            )
        verdict = self.style.SUCCESS("passed") if record["passed"] else self.style.ERROR("FAILED")
        out.write(f"{verdict} · {record['digest']}")
        for destination in destinations:
            out.write(f"wrote {destination}")
