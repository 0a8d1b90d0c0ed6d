"""Load qualification harness: preregistered manifests run on virtual time.

Pure Python, like ``admission.core``: no Django, DRF or Celery import, so the management
command, a Celery task and the tests all call the same ``run_load``.
"""

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
