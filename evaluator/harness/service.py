"""The one entry point of the harness: run a manifest against a target and get its record.

The management command and the Celery task both call ``run_load``; neither decides the mode,
which is whatever the path that actually ran reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from evaluator.harness.arrivals import Arrival, ArrivalModel, generate_arrivals
from evaluator.harness.controller_target import CONTROLLER_TARGET
from evaluator.harness.errors import UnknownTargetError
from evaluator.harness.evaluator_target import EVALUATOR_TARGET
from evaluator.harness.manifests import LoadManifest, load_manifest
from evaluator.harness.records import build_record
from evaluator.harness.resources import HeapSampler, cpu_time_of, resources
from evaluator.harness.target import LoadTarget, Progress, TargetRun

__all__ = [
    "LOAD_TARGETS",
    "evidence_path",
    "measure",
    "run_load",
    "run_manifest",
    "run_target",
    "write_record",
]

LOAD_TARGETS: Mapping[str, LoadTarget] = {
    target.name: target for target in (CONTROLLER_TARGET, EVALUATOR_TARGET)
}


def _target(name: str) -> LoadTarget:
    target = LOAD_TARGETS.get(name)
    if target is None:
        known = ", ".join(sorted(LOAD_TARGETS))
        raise UnknownTargetError(f"unknown load target {name!r} (known: {known})")
    return target


def measure(
    runner: LoadTarget,
    manifest: LoadManifest,
    make_arrivals: Callable[[], list[Arrival]],
    progress: Progress | None = None,
) -> tuple[TargetRun, dict[str, Any]]:
    """Build the timeline, run it through ``runner`` and sample the host while it runs.

    Returns what the target observed and the record's ``resources``; the timeline is the run's
    input, so its CPU is counted with the run's.
    """
    arrivals, timeline_cpu = cpu_time_of(make_arrivals)
    heap = HeapSampler()

    def tick(fraction: float) -> None:
        heap.sample()
        if progress is not None:
            progress(fraction)

    timed, run_cpu = cpu_time_of(lambda: runner.run(manifest, arrivals, tick))
    heap.sample()
    used = resources(timed.virtual_duration_ms, timeline_cpu + run_cpu, heap.peak_bytes)
    return timed, used


def run_target(
    manifest: LoadManifest, runner: LoadTarget, progress: Progress | None = None
) -> dict[str, Any]:
    """Release ``manifest``'s arrivals over ``runner``'s window; returns the record, whose mode
    is the one the runner reports."""
    model = ArrivalModel.from_manifest(manifest)
    end_ms = runner.window_end_ms(manifest)
    timed, used = measure(runner, manifest, lambda: generate_arrivals(model, end_ms), progress)
    return build_record(
        manifest=manifest,
        mode=timed.mode,
        target=runner.name,
        window=timed.window,
        observations=timed.observations,
        resources=used,
    )


def run_manifest(
    manifest: LoadManifest, target: str, progress: Progress | None = None
) -> dict[str, Any]:
    """Run an already loaded (hence registered) manifest; returns the digest-bound record."""
    return run_target(manifest, _target(target), progress)


def run_load(
    manifest_path: str | Path, target: str, progress: Progress | None = None
) -> dict[str, Any]:
    """Load the manifest at ``manifest_path``, refusing unregistered bytes, and run ``target``.

    Raises ``FileNotFoundError`` for a missing file, ``UnknownManifestError`` for a manifest
    that is not preregistered and ``UnknownTargetError`` for an unknown target.
    """
    _target(target)
    return run_manifest(load_manifest(manifest_path), target, progress)


def evidence_path(evidence_root: str | Path, manifest: LoadManifest, target: str) -> Path:
    """Where the retained record of ``target`` for ``manifest`` lives under ``evidence_root``."""
    return Path(evidence_root) / manifest.registration.evidence_dir / f"{target}.json"


def write_record(record: Mapping[str, Any], path: str | Path) -> Path:
    """Write a record as indented JSON; the digest does not depend on the layout."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
