from __future__ import annotations

import pytest

from evaluator.harness.errors import UnknownManifestError
from evaluator.harness.manifests import REGISTERED_MANIFESTS, load_manifest, parse_manifest

from .conftest import MANIFESTS

V1_DIGEST = "sha256:9c6db981b0e1d124e317651ed15e8972fbf27b7a7596b15aa23ea3baac4bb03f"
V2_DIGEST = "sha256:416a41466dc58063f45b5e5e9a7ad78b011cf6d3be50b081bab6e47c76a28a0c"


def test_CNC_LOAD_001_manifest_digests_are_pinned(manifest_v1, manifest_v2):
    assert set(REGISTERED_MANIFESTS) == {V1_DIGEST, V2_DIGEST}
    assert manifest_v1.digest == V1_DIGEST
    assert (manifest_v1.schema, manifest_v1.version) == ("decision-load-manifest/v1", "1.0.0")
    assert manifest_v2.digest == V2_DIGEST
    assert (manifest_v2.schema, manifest_v2.version) == ("decision-load-manifest/v2", "2.0.0")
    assert manifest_v2.identity() == {
        "schema": "decision-load-manifest/v2",
        "version": "2.0.0",
        "digest": V2_DIGEST,
    }


def test_CNC_LOAD_001_unknown_manifest_is_refused_with_the_digest_it_found(tmp_path):
    original = (MANIFESTS / "load-manifest.v2.json").read_bytes()
    # Same JSON meaning, different bytes: still a different manifest.
    changed = tmp_path / "load-manifest.v2.json"
    changed.write_bytes(original.replace(b'"maximumActiveCalls": 4', b'"maximumActiveCalls": 5'))
    with pytest.raises(UnknownManifestError) as refused:
        load_manifest(changed)
    found = refused.value.digest
    assert found.startswith("sha256:") and found not in REGISTERED_MANIFESTS
    message = str(refused.value)
    assert found in message
    assert str(changed) in message
    assert "not a preregistered load manifest" in message
    assert V2_DIGEST in message

    with pytest.raises(UnknownManifestError):
        parse_manifest(original + b"\n")


def test_missing_manifest_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_manifest(tmp_path / "absent.json")
