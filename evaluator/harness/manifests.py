"""The registry of preregistered load manifests and the only way to load one.

A manifest is identified by the sha256 of its bytes, not by its name or version field: a file
that differs by one byte is a different manifest and is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluator.harness.errors import ManifestFormatError, UnknownManifestError

__all__ = [
    "REGISTERED_MANIFESTS",
    "LoadManifest",
    "RegisteredManifest",
    "byte_digest",
    "load_manifest",
    "parse_manifest",
    "registered_manifest",
]


@dataclass(frozen=True, slots=True)
class RegisteredManifest:
    """What the project preregistered about one manifest."""

    schema: str
    version: str
    file_name: str
    evidence_dir: str


REGISTERED_MANIFESTS: Mapping[str, RegisteredManifest] = {
    "sha256:9c6db981b0e1d124e317651ed15e8972fbf27b7a7596b15aa23ea3baac4bb03f": RegisteredManifest(
        schema="decision-load-manifest/v1",
        version="1.0.0",
        file_name="load-manifest.v1.json",
        evidence_dir="load-offline-v1",
    ),
    "sha256:416a41466dc58063f45b5e5e9a7ad78b011cf6d3be50b081bab6e47c76a28a0c": RegisteredManifest(
        schema="decision-load-manifest/v2",
        version="2.0.0",
        file_name="load-manifest.v2.json",
        evidence_dir="load-offline-v2",
    ),
}


@dataclass(frozen=True, slots=True)
class LoadManifest:
    """A registered manifest: its byte digest, identity and parsed document."""

    digest: str
    schema: str
    version: str
    document: Mapping[str, Any]
    source: str | None = None

    @property
    def registration(self) -> RegisteredManifest:
        return REGISTERED_MANIFESTS[self.digest]

    @property
    def bounds(self) -> Mapping[str, Any]:
        return self.document["bounds"]

    def section(self, name: str) -> Mapping[str, Any]:
        """A top-level object of the document, or ``ManifestFormatError`` naming what is missing."""
        value = self.document.get(name)
        if not isinstance(value, Mapping):
            raise ManifestFormatError(
                f"manifest {self.schema} {self.version} has no {name!r} section"
            )
        return value

    def identity(self) -> dict[str, str]:
        """The ``manifest`` object of a load result record."""
        return {"schema": self.schema, "version": self.version, "digest": self.digest}


def _registered_labels() -> tuple[str, ...]:
    return tuple(f"v{entry.version} {digest}" for digest, entry in REGISTERED_MANIFESTS.items())


def byte_digest(data: bytes) -> str:
    """``"sha256:" + hex(sha256(data))``, the digest under which manifests are registered."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def registered_manifest(digest: str) -> RegisteredManifest:
    """The registration of ``digest``, or ``UnknownManifestError``."""
    entry = REGISTERED_MANIFESTS.get(digest)
    if entry is None:
        raise UnknownManifestError(digest, registered=_registered_labels())
    return entry


def parse_manifest(data: bytes, source: str | None = None) -> LoadManifest:
    """Check the byte digest of ``data`` against the registry, then parse it."""
    digest = byte_digest(data)
    entry = REGISTERED_MANIFESTS.get(digest)
    if entry is None:
        raise UnknownManifestError(digest, source, _registered_labels())
    document = json.loads(data)
    # The digest pins the bytes, so a mismatch here means the registry itself is wrong.
    if document.get("schema") != entry.schema or document.get("version") != entry.version:
        raise ManifestFormatError(
            f"manifest {digest} declares {document.get('schema')} {document.get('version')}, "
            f"registered as {entry.schema} {entry.version}"
        )
    return LoadManifest(
        digest=digest,
        schema=entry.schema,
        version=entry.version,
        document=document,
        source=source,
    )


def load_manifest(path: str | Path) -> LoadManifest:
    """Read a manifest file and refuse it unless its bytes are preregistered.

    Raises ``FileNotFoundError`` for a missing file and ``UnknownManifestError`` (which names
    the digest it found) for any file that is not byte-identical to a registered manifest.
    """
    path = Path(path)
    return parse_manifest(path.read_bytes(), source=str(path))
