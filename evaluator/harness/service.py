"""The one entry point of the harness: run a manifest against a target and get its record.

The management command and the Celery task both run a manifest here; neither decides the mode,
which is whatever the path that actually ran reports. A caller that plots the run passes
``keep_timeline``: it receives the run's bounded timeline, which stays out of the record.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from evaluator.harness.arrivals import Arrival, ArrivalModel, generate_arrivals
from evaluator.harness.errors import UnknownTargetError
from evaluator.harness.manifests import LoadManifest, load_manifest
from evaluator.harness.records import build_record
from evaluator.harness.resources import HeapSampler, cpu_time_of, resources
from evaluator.harness.target import LoadTarget, Progress, TargetRun

__all__ = [
    "LOAD_TARGETS",
    "KeepTimeline",
    "declares_lanes",
    "evidence_path",
    "measure",
    "run_load",
    "run_manifest",
    "run_target",
    "target_refusal",
    "write_record",
]

# Receives a run's timeline (evaluator/harness/timeline.py), kept beside its record.
KeepTimeline = Callable[[Mapping[str, Any]], None]

# name -> (module, attribute): a target is imported when it is asked for, so a run of one path
# does not pay for importing the other (the evaluator path brings the whole engine).
_TARGET_HOMES = {
    "admission-controller": ("evaluator.harness.controller_target", "CONTROLLER_TARGET"),
    "evaluator": ("evaluator.harness.evaluator_target", "EVALUATOR_TARGET"),
}


class _Targets(Mapping[str, LoadTarget]):
    """The load targets by name, each imported on first use."""

    def __getitem__(self, name: str) -> LoadTarget:
        module, attribute = _TARGET_HOMES[name]
        target: LoadTarget = getattr(importlib.import_module(module), attribute)
        return target

    def __iter__(self) -> Iterator[str]:
        return iter(_TARGET_HOMES)

    def __len__(self) -> int:
        return len(_TARGET_HOMES)


LOAD_TARGETS: Mapping[str, LoadTarget] = _Targets()


def _target(name: str, manifest: LoadManifest | None = None) -> LoadTarget:
    if name not in _TARGET_HOMES:
        known = ", ".join(sorted(LOAD_TARGETS))
        raise UnknownTargetError(f"unknown load target {name!r} (known: {known})")
    if manifest is not None and not declares_lanes(manifest):
        # v1 declares no principals or providers: its load run is the bounded-scheduler gate.
        refusal = target_refusal(manifest, name)
        if refusal is not None:
            raise UnknownTargetError(refusal)
        from evaluator.harness.scheduler_gate import SCHEDULER_GATE_TARGET

        return SCHEDULER_GATE_TARGET
    return LOAD_TARGETS[name]


def declares_lanes(manifest: LoadManifest) -> bool:
    """Whether the manifest names principals and providers to draw arrivals for (v2 does)."""
    return "principals" in manifest.document and "providers" in manifest.document


def target_refusal(manifest: LoadManifest, target: str) -> str | None:
    """Why ``target`` cannot run ``manifest`` (a message naming what can), or None when it can."""
    if not declares_lanes(manifest) and target != "evaluator":
        return (
            f"manifest {manifest.schema} {manifest.version} declares no principals or providers "
            f"for the {target} path; it runs as the bounded-scheduler gate (CNC-SCHED-005) "
            "through the evaluator: use target 'evaluator'"
        )
    return None


def measure(
    runner: LoadTarget,
    manifest: LoadManifest,
    make_arrivals: Callable[[], list[Arrival]],
    progress: Progress | None = None,
    keep_timeline: KeepTimeline | None = None,
) -> tuple[TargetRun, dict[str, Any]]:
    """Build the timeline, run it through ``runner`` and sample the host while it runs.

    Returns what the target observed and the record's ``resources``; the timeline is the run's
    input, so its CPU is counted with the run's. ``keep_timeline`` gets the run's sampled series.
    """
    arrivals, timeline_cpu = cpu_time_of(make_arrivals)
    heap = HeapSampler()

    def tick(fraction: float) -> None:
        heap.sample()
        if progress is not None:
            progress(fraction)

    timed, run_cpu = cpu_time_of(lambda: runner.run(manifest, arrivals, tick))
    heap.sample()
    used = resources(
        timed.virtual_duration_ms,
        timeline_cpu + run_cpu,
        heap.peak_bytes,
        heap.peak_resident_bytes,
    )
    if keep_timeline is not None and timed.timeline is not None:
        keep_timeline(timed.timeline)
    return timed, used


def run_target(
    manifest: LoadManifest,
    runner: LoadTarget,
    progress: Progress | None = None,
    keep_timeline: KeepTimeline | None = None,
) -> dict[str, Any]:
    """Release ``manifest``'s arrivals over ``runner``'s window; returns the record, whose mode
    is the one the runner reports."""
    end_ms = runner.window_end_ms(manifest)
    if runner.make_arrivals is not None:
        make = partial(runner.make_arrivals, manifest, end_ms)
    else:
        make = partial(generate_arrivals, ArrivalModel.from_manifest(manifest), end_ms)
    timed, used = measure(runner, manifest, make, progress, keep_timeline)
    return build_record(
        manifest=manifest,
        mode=timed.mode,
        target=runner.name,
        window=timed.window,
        observations=timed.observations,
        resources=used,
    )


def run_manifest(
    manifest: LoadManifest,
    target: str,
    progress: Progress | None = None,
    keep_timeline: KeepTimeline | None = None,
) -> dict[str, Any]:
    """Run an already loaded (hence registered) manifest; returns the digest-bound record."""
    return run_target(manifest, _target(target, manifest), progress, keep_timeline)


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
