"""``run_load``: the entry point the command and the Celery task share."""

from __future__ import annotations

import pytest

from evaluator.harness import LOAD_TARGETS, run_load
from evaluator.harness.errors import UnknownManifestError, UnknownTargetError

from .conftest import MANIFESTS


def test_both_targets_are_registered():
    assert set(LOAD_TARGETS) == {"admission-controller", "evaluator"}


def test_unknown_target_is_refused_before_anything_runs():
    with pytest.raises(UnknownTargetError, match="unknown load target 'shadow'"):
        run_load(MANIFESTS / "load-manifest.v2.json", "shadow")


def test_unknown_manifest_is_refused_by_run_load(tmp_path):
    forged = tmp_path / "manifest.json"
    forged.write_text('{"schema": "decision-load-manifest/v2"}')
    with pytest.raises(UnknownManifestError, match="not a preregistered load manifest"):
        run_load(forged, "admission-controller")
    with pytest.raises(FileNotFoundError):
        run_load(tmp_path / "absent.json", "admission-controller")
