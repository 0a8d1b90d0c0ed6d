from __future__ import annotations

import copy
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


def solo_manifest(manifest_v2, concurrency, **arrival_model):
    # One principal on one provider, so the expected outcome can be worked out by hand.
    document = copy.deepcopy(dict(manifest_v2.document))
    document["workspace"] = {
        "concurrency": concurrency,
        "maxQueueLength": 10_000,
        "maxQueueWaitMs": 600_000,
    }
    document["providers"] = {"jev": {"concurrency": concurrency}}
    document["principals"] = [
        {"id": "solo", "class": "quiet", "weight": 1, "limits": {"concurrency": concurrency}}
    ]
    model = document["arrivalModel"]
    model.update(
        {
            "averageRequestsPerSecond": 5,
            "spikeMultiplier": 1,
            "hugeTokenShare": 0,
            "serviceTimeMs": {"minimum": 40, "maximum": 40},
            "retryableFailureRate": 0,
            "cancellationRate": 0,
        }
    )
    model.update(arrival_model)
    return LoadManifest(
        digest="sha256:" + "1" * 64,
        schema=manifest_v2.schema,
        version=manifest_v2.version,
        document=document,
    )


def accounted(observations):
    return (
        observations["completed"]
        + observations["failed"]
        + observations["shed"]
        + observations["cancelled"]
    )
