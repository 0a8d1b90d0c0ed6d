"""Load qualification harness: preregistered manifests run on virtual time.

Pure Python, like ``admission.core``: no Django, DRF or Celery import, so the management
command, a Celery task and the tests all call the same ``run_load``.

The names below are imported on first use, not with the package: ``python -m evaluator.harness``
must be able to choose the compiled modules (``evaluator.harness.native``) before anything
imports the admission core.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evaluator.harness.errors import (
        LoadHarnessError,
        ManifestFormatError,
        RecordDigestMismatchError,
        RecordFormatError,
        RecordManifestMismatchError,
        RecordVerificationError,
        UnknownManifestError,
        UnknownTargetError,
    )
    from evaluator.harness.manifests import REGISTERED_MANIFESTS, LoadManifest, load_manifest
    from evaluator.harness.records import build_record, evidence_flags, verify_record
    from evaluator.harness.service import LOAD_TARGETS, run_load, run_manifest

_HOMES = {
    "LoadHarnessError": "errors",
    "ManifestFormatError": "errors",
    "RecordDigestMismatchError": "errors",
    "RecordFormatError": "errors",
    "RecordManifestMismatchError": "errors",
    "RecordVerificationError": "errors",
    "UnknownManifestError": "errors",
    "UnknownTargetError": "errors",
    "REGISTERED_MANIFESTS": "manifests",
    "LoadManifest": "manifests",
    "load_manifest": "manifests",
    "build_record": "records",
    "evidence_flags": "records",
    "verify_record": "records",
    "LOAD_TARGETS": "service",
    "run_load": "service",
    "run_manifest": "service",
}

__all__ = [
    "LOAD_TARGETS",
    "REGISTERED_MANIFESTS",
    "LoadHarnessError",
    "LoadManifest",
    "ManifestFormatError",
    "RecordDigestMismatchError",
    "RecordFormatError",
    "RecordManifestMismatchError",
    "RecordVerificationError",
    "UnknownManifestError",
    "UnknownTargetError",
    "build_record",
    "evidence_flags",
    "load_manifest",
    "run_load",
    "run_manifest",
    "verify_record",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
