"""``python -m evaluator.harness``: run a preregistered load manifest without Django.

The same run as ``manage.py run_load_harness`` (which uses the pieces below), without importing
Django, the apps or a settings module, so the whole command costs what the run costs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.manifests import LoadManifest, load_manifest
from evaluator.harness.native import compiled_in_use
from evaluator.harness.records import MODE_STAGED
from evaluator.harness.service import (
    LOAD_TARGETS,
    evidence_path,
    run_manifest,
    write_record,
)

__all__ = [
    "DESCRIPTION",
    "PROJECT_ROOT",
    "ProgressBar",
    "add_arguments",
    "main",
    "resolve_manifest",
    "summary_lines",
]

# The repository root: documented commands name manifests and evidence relative to it.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
_BAR_WIDTH = 30


class ProgressBar:
    """A one-line bar redrawn in place; use it only when the output is a terminal."""

    def __init__(self, write: Callable[[str], Any], label: str) -> None:
        self.write = write
        self.label = label
        self.shown = -1

    def __call__(self, fraction: float) -> None:
        percent = int(fraction * 100)
        if percent == self.shown:
            return
        self.shown = percent
        filled = _BAR_WIDTH * percent // 100
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self.write(f"\r{self.label} [{bar}] {percent:3d}%")

    def close(self) -> None:
        if self.shown >= 0:
            self.write("\n")


def resolve_manifest(given: str, root: Path = PROJECT_ROOT) -> LoadManifest:
    """Load a manifest named by path, relative paths also tried against the project root.

    Raises ``LoadHarnessError`` with a message for a missing or unregistered manifest.
    """
    path = Path(given)
    if not path.is_absolute() and not path.exists():
        path = root / path
    try:
        return load_manifest(path)
    except FileNotFoundError:
        raise LoadHarnessError(f"load manifest not found: {given}") from None
    except IsADirectoryError:
        raise LoadHarnessError(f"load manifest is a directory: {given}") from None


def summary_lines(record: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The human summary of a record, as (style, line); style is "", "pass" or "fail"."""
    manifest = record["manifest"]
    observed = record["observations"]
    resources = record["resources"]
    yield (
        "",
        f"{record['target']} · {record['mode']} · {manifest['schema']} {manifest['version']} "
        f"({manifest['digest'][:19]}…) · {record['window']['seconds']} "
        f"{'real' if record['mode'] == MODE_STAGED else 'virtual'} s",
    )
    yield (
        "",
        f"arrivals {observed['arrivals']}  attempts {observed['attempts']}  "
        f"completed {observed['completed']}  failed {observed['failed']}  "
        f"shed {observed['shed']}  cancelled {observed['cancelled']}",
    )
    if observed["shedReasons"]:
        reasons = ", ".join(f"{k} {v}" for k, v in observed["shedReasons"].items())
        yield "", f"shed reasons: {reasons}"
    yield (
        "",
        f"cpu {resources['cpuSeconds']} s ({resources['cpuPercentOneCore']} % of one core)  "
        f"heap peak {resources['heapPeakMiB']} MiB  rss {resources['rssMiB']} MiB",
    )
    for comparison in record["comparisons"]:
        verdict = "pass" if comparison["pass"] else "FAIL"
        yield (
            "",
            f"  {verdict}  {comparison['bound']}: observed {comparison['observed']}, "
            f"limit {comparison['limit']}",
        )
    if record["passed"]:
        yield "pass", f"passed · {record['digest']}"
    else:
        yield "fail", f"FAILED · {record['digest']}"


DESCRIPTION = (
    "Release a preregistered load manifest's arrivals into the admission controller or the "
    "evaluator on virtual time and write the digest-bound decision-load-result/v1 record."
)


def add_arguments(parser: argparse.ArgumentParser, targets: Sequence[str] = ()) -> None:
    """The command's arguments (shared with ``manage.py run_load_harness``, which offers more
    ``targets`` than the offline ones)."""
    parser.add_argument("--manifest", required=True, help="path of a preregistered load manifest")
    parser.add_argument("--target", required=True, choices=targets or sorted(LOAD_TARGETS))
    parser.add_argument("--output", help="also write the record to this file")
    parser.add_argument(
        "--write-evidence",
        action="store_true",
        help="replace the retained record under evidence/<manifest>/<target>.json",
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the command; returns the exit status (0 run and written, 2 refused)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = argparse.ArgumentParser(prog="python -m evaluator.harness", description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument(
        "--pure",
        action="store_true",
        help="run the admission core as Python even when a compiled build matches the sources",
    )
    options = parser.parse_args(argv)
    destinations = [Path(options.output)] if options.output else []
    try:
        manifest = resolve_manifest(options.manifest)
        if options.write_evidence:
            destinations.append(evidence_path(PROJECT_ROOT / "evidence", manifest, options.target))
        # With nowhere else to go, the record is the command's output and the summary steps aside.
        summary = out if destinations else err
        progress = None
        if summary.isatty():
            progress = ProgressBar(summary.write, f"{options.target} {manifest.version}")
        try:
            record = run_manifest(manifest, options.target, progress)
        finally:
            if progress is not None:
                progress.close()
    except LoadHarnessError as error:
        err.write(f"error: {error}\n")
        return 2
    for destination in destinations:
        write_record(record, destination)
    for _style, line in summary_lines(record):
        summary.write(line + "\n")
    summary.write(f"admission core: {'compiled (mypyc)' if compiled_in_use() else 'Python'}\n")
    for destination in destinations:
        summary.write(f"wrote {destination}\n")
    if not destinations:
        out.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return 0
