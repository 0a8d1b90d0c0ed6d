"""The three kinds of load run and how each one runs: offline, what-if and staged-provider.

* **offline**: a preregistered manifest through an offline target on virtual time;
* **what-if**: the same, under a profile version's limits (the record never counts as evidence);
* **staged-provider**: the manifest at real time against the deployment's staged endpoint.

`check` refuses a run that could not start before a row exists; `execute` runs one. The run
rows and their lifecycle belong to `evaluator.services.runs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from admission.core import InvalidProfileError, Profile
from evaluator.deployment import AdapterConfigError, staged_endpoints, staged_window_seconds
from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.manifests import REGISTERED_MANIFESTS, LoadManifest, load_manifest
from evaluator.harness.records import TARGET_STAGED
from evaluator.harness.replay import WORKSPACE_ID
from evaluator.harness.service import LOAD_TARGETS, KeepTimeline, run_manifest, target_refusal
from evaluator.harness.staged_target import (
    StagedConfigError,
    check_capacity,
    run_staged,
    staged_window_ms,
)
from evaluator.harness.target import Progress
from evaluator.harness.what_if import WhatIfError, map_ids, run_what_if

if TYPE_CHECKING:
    from admission.models import ProfileVersion
    from evaluator.models import LoadRun

__all__ = [
    "TARGETS",
    "WHAT_IF_TARGETS",
    "QualificationError",
    "check",
    "execute",
    "manifest_path",
    "what_if_manifest_names",
]

# Every target a load run may name; what-if runs use only the offline ones.
WHAT_IF_TARGETS = tuple(sorted(LOAD_TARGETS))
TARGETS = (*WHAT_IF_TARGETS, TARGET_STAGED)


class QualificationError(Exception):
    """A load run that cannot start; ``field`` names the input at fault."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def manifest_path(manifest_name: str) -> Path:
    return Path(settings.BASE_DIR) / "manifests" / manifest_name


def what_if_manifest_names() -> list[str]:
    """The preregistered manifests with an arrival model, which a what-if run can replay."""
    names = []
    for entry in REGISTERED_MANIFESTS.values():
        try:
            manifest = load_manifest(manifest_path(entry.file_name))
        except (OSError, LoadHarnessError):
            continue
        if "arrivalModel" in manifest.document and "principals" in manifest.document:
            names.append(entry.file_name)
    return sorted(names)


def _manifest(manifest_name: str) -> LoadManifest:
    try:
        return load_manifest(manifest_path(manifest_name))
    except (OSError, LoadHarnessError) as error:
        raise QualificationError(str(error), field="manifest") from None


def check(
    manifest_name: str,
    target: str,
    *,
    what_if_version: ProfileVersion | None = None,
    mapping: Any = None,
) -> None:
    """Refuse, with a field, a run that could not start: an unknown target, a what-if that
    cannot map the manifest onto the version, a staged run the deployment cannot serve."""
    if target not in TARGETS:
        raise QualificationError(f"must be one of {', '.join(TARGETS)}", field="target")
    manifest = _manifest(manifest_name)
    refusal = target_refusal(manifest, target)
    if refusal is not None:
        raise QualificationError(refusal, field="target")
    if what_if_version is not None:
        if target not in WHAT_IF_TARGETS:
            raise QualificationError(
                f"a what-if run uses an offline target ({', '.join(WHAT_IF_TARGETS)})",
                field="target",
            )
        try:
            profile = Profile.from_dict(what_if_version.document, workspace_id=WORKSPACE_ID)
            map_ids(manifest, profile, mapping)
        except InvalidProfileError as error:
            raise QualificationError(str(error), field="version") from None
        except WhatIfError as error:
            raise QualificationError(str(error), field=error.field) from None
        except LoadHarnessError as error:
            raise QualificationError(str(error), field="manifest") from None
    elif mapping is not None:
        raise QualificationError("only a what-if run maps ids onto a version", field="mapping")
    if target == TARGET_STAGED:
        try:
            staged_window_ms(manifest, staged_window_seconds())
            check_capacity(manifest, _endpoints(manifest))
        except (AdapterConfigError, StagedConfigError) as error:
            raise QualificationError(str(error), field="target") from None


def _endpoints(manifest: LoadManifest) -> dict[str, Any]:
    return staged_endpoints(sorted(manifest.section("providers")))


def execute(
    run: LoadRun,
    keep_timeline: KeepTimeline | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the harness for ``run`` and return its record; ``keep_timeline`` receives the run's
    timeline for its page, ``progress`` how far it got (an exception it raises stops the run
    and comes out of here).

    Raises ``FileNotFoundError`` for a manifest that left ``manifests/``, ``LoadHarnessError``
    for a run the harness refuses and ``AdapterConfigError`` for a staged run whose deployment
    settings changed since it was submitted.
    """
    manifest = load_manifest(manifest_path(run.manifest_name))
    if run.what_if_version is not None:
        return run_what_if(
            manifest,
            run.what_if_version.document,
            run.target,
            mapping=run.mapping,
            progress=progress,
            keep_timeline=keep_timeline,
        )
    if run.target == TARGET_STAGED:
        return run_staged(
            manifest,
            _endpoints(manifest),
            staged_window_seconds(),
            progress=progress,
            keep_timeline=keep_timeline,
        )
    return run_manifest(manifest, run.target, progress=progress, keep_timeline=keep_timeline)
