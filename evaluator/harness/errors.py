"""Typed errors of the load harness, so callers can tell a refused manifest from a bad record."""

from __future__ import annotations

__all__ = [
    "LoadHarnessError",
    "ManifestFormatError",
    "RecordDigestMismatchError",
    "RecordFormatError",
    "RecordManifestMismatchError",
    "RecordVerificationError",
    "UnknownManifestError",
    "UnknownTargetError",
]


class LoadHarnessError(Exception):
    """Base class of every error raised by ``evaluator.harness``."""


class UnknownManifestError(LoadHarnessError):
    """A manifest whose sha256 byte digest is not one of the preregistered manifests."""

    def __init__(
        self, digest: str, source: str | None = None, registered: tuple[str, ...] = ()
    ) -> None:
        super().__init__(digest, source, registered)
        self.digest = digest
        self.source = source
        self.registered = registered

    def __str__(self) -> str:
        where = f"{self.source} " if self.source else ""
        known = f" (registered: {', '.join(self.registered)})" if self.registered else ""
        return (
            f"load manifest {where}has byte digest {self.digest}, which is not a preregistered "
            f"load manifest{known}; a changed manifest needs a new version"
        )


class ManifestFormatError(LoadHarnessError):
    """A registered manifest lacks what the requested path needs (for example v1 has no
    arrival model for the controller path)."""


class UnknownTargetError(LoadHarnessError):
    """A load target name that the harness does not know."""


class RecordVerificationError(LoadHarnessError):
    """A ``decision-load-result/v1`` record that cannot be trusted as evidence."""


class RecordDigestMismatchError(RecordVerificationError):
    """The record's content does not hash to its ``digest``: it was altered after the run."""


class RecordManifestMismatchError(RecordVerificationError):
    """The record is bound to another manifest than the one given, or to an unknown one."""


class RecordFormatError(RecordVerificationError):
    """The record is malformed or internally inconsistent (schema, mode, comparisons)."""
