from __future__ import annotations

from pathlib import Path

import pytest

from evaluator.harness.manifests import LoadManifest, load_manifest

PROJECT_ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = PROJECT_ROOT / "manifests"
EVIDENCE = PROJECT_ROOT / "evidence" / "load-offline-v2"


@pytest.fixture(scope="session")
def manifest_v1() -> LoadManifest:
    return load_manifest(MANIFESTS / "load-manifest.v1.json")


@pytest.fixture(scope="session")
def manifest_v2() -> LoadManifest:
    return load_manifest(MANIFESTS / "load-manifest.v2.json")
