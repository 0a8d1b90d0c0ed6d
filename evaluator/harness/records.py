"""``decision-load-result/v1`` records: building, verifying and turning them into gate flags.

A record's ``digest`` is the canonical-JSON sha256 of everything else in it, so any edit after
the run shows. The digest is not a signature: verification also re-derives every comparison from
the record's own observations so that a recomputed digest cannot hide a flipped verdict.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Iterable, Mapping
from typing import Any

from admission.core.canonical import sha256_digest
from evaluator.harness.errors import (
    LoadHarnessError,
    RecordDigestMismatchError,
    RecordFormatError,
    RecordManifestMismatchError,
)
from evaluator.harness.manifests import (
    REGISTERED_MANIFESTS,
    LoadManifest,
    byte_digest,
    parse_manifest,
)

__all__ = [
    "FLAG_OFFLINE_PASSED",
    "FLAG_QUALIFIED",
    "MODE_OFFLINE",
    "MODE_STAGED",
    "MODE_WHAT_IF",
    "RECORD_SCHEMA",
    "TARGETS",
    "TARGET_STAGED",
    "build_record",
    "compare_bounds",
    "environment",
    "evidence_flags",
    "verify_record",
]

RECORD_SCHEMA = "decision-load-result/v1"
MODE_OFFLINE = "offline-fake-provider"
MODE_STAGED = "staged-provider"
# The manifest's arrivals against a proposed profile's limits: advice for an approver, never
# evidence for a gate.
MODE_WHAT_IF = "what-if"
MODES = frozenset({MODE_OFFLINE, MODE_STAGED, MODE_WHAT_IF})
TARGET_STAGED = "staged-provider"
TARGETS = frozenset({"admission-controller", "evaluator", TARGET_STAGED})
WHAT_IF_KEY = "whatIf"

FLAG_OFFLINE_PASSED = "load-manifest-offline-passed"
FLAG_QUALIFIED = "load-manifest-qualified"

# bound -> (record section, field, "max": observed must not exceed it, "min": must reach it)
BOUND_SOURCES: Mapping[str, tuple[str, str, str]] = {
    "maximumActiveCalls": ("observations", "maximumActiveCalls", "max"),
    "maximumQueuedCalls": ("observations", "maximumQueuedCalls", "max"),
    "maximumEligibleLaneWaitMs": ("observations", "maximumEligibleLaneWaitMs", "max"),
    "maximumRetryAmplificationRatio": ("observations", "retryAmplificationRatio", "max"),
    "maximumCancellationLatencyMs": ("observations", "maximumCancellationLatencyMs", "max"),
    "minimumQuietPrincipalAdmissionRatio": ("observations", "quietPrincipalAdmissionRatio", "min"),
    "maximumHeapUsedMiB": ("resources", "heapPeakMiB", "max"),
    "maximumResidentMemoryMiB": ("resources", "rssMiB", "max"),
    "maximumCpuPercentOneCore": ("resources", "cpuPercentOneCore", "max"),
}

_TOP_LEVEL_KEYS = frozenset(
    {
        "schema",
        "manifest",
        "mode",
        "target",
        "window",
        "environment",
        "observations",
        "resources",
        "comparisons",
        "passed",
        "digest",
    }
)


def environment() -> dict[str, str]:
    """The host description carried by a record; informational only."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "implementation": platform.python_implementation(),
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _judge(direction: str, limit: Any, observed: Any) -> bool:
    # A missing observation never passes a bound: evidence fails closed.
    if not _is_number(observed) or not _is_number(limit):
        return False
    return observed <= limit if direction == "max" else observed >= limit


def compare_bounds(
    bounds: Mapping[str, Any],
    observations: Mapping[str, Any],
    resources: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """One ``{bound, limit, observed, pass}`` per bound of the manifest, in manifest order."""
    sections = {"observations": observations, "resources": resources}
    comparisons = []
    for bound, limit in bounds.items():
        source = BOUND_SOURCES.get(bound)
        if source is None:
            raise LoadHarnessError(f"manifest bound {bound!r} has no observation to compare with")
        section, field, direction = source
        observed = sections[section].get(field)
        comparisons.append(
            {
                "bound": bound,
                "limit": limit,
                "observed": observed,
                "pass": _judge(direction, limit, observed),
            }
        )
    return comparisons


def build_record(
    *,
    manifest: LoadManifest,
    mode: str,
    target: str,
    window: Mapping[str, Any],
    observations: Mapping[str, Any],
    resources: Mapping[str, Any],
    host: Mapping[str, str] | None = None,
    what_if: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A digest-bound record; ``mode`` comes from the path that ran, never from a caller.

    Its parameters are the record's parts, keyword-only, one each (the schema's top-level keys).

    A what-if record (``mode`` ``what-if``) also carries ``what_if``: the profile whose limits
    replaced the manifest's, and how the manifest's ids were mapped onto it.
    """
    if mode not in MODES:
        raise LoadHarnessError(f"unknown load mode {mode!r}")
    if target not in TARGETS:
        raise LoadHarnessError(f"unknown load target {target!r}")
    if (mode == MODE_STAGED) != (target == TARGET_STAGED):
        raise LoadHarnessError(f"a {mode} record cannot come from the {target} target")
    if (mode == MODE_WHAT_IF) != (what_if is not None):
        raise LoadHarnessError("exactly the what-if records name the profile they ran against")
    comparisons = compare_bounds(manifest.bounds, observations, resources)
    record: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "manifest": manifest.identity(),
        "mode": mode,
        "target": target,
        "window": dict(window),
        "environment": dict(host if host is not None else environment()),
        "observations": dict(observations),
        "resources": dict(resources),
        "comparisons": comparisons,
        "passed": all(c["pass"] for c in comparisons),
    }
    if what_if is not None:
        record[WHAT_IF_KEY] = dict(what_if)
    record["digest"] = sha256_digest(record)
    return record


def _expected_manifest_digest(manifest: bytes | str | LoadManifest | None) -> str | None:
    if manifest is None:
        return None
    if isinstance(manifest, LoadManifest):
        return manifest.digest
    if isinstance(manifest, bytes | bytearray | memoryview):
        return byte_digest(bytes(manifest))
    return manifest


def verify_record(
    record: Mapping[str, Any],
    manifest_bytes_or_digest: bytes | str | LoadManifest | None = None,
) -> Mapping[str, Any]:
    """Return ``record`` when it is an untampered result bound to a registered manifest.

    With manifest bytes (or a digest, or a loaded manifest) the record must be bound to exactly
    that manifest. Raises ``RecordDigestMismatchError`` for an edited record,
    ``RecordManifestMismatchError`` for a record bound to another or an unknown manifest, and
    ``RecordFormatError`` for a malformed or self-contradicting one.
    """
    if not isinstance(record, Mapping) or record.get("schema") != RECORD_SCHEMA:
        raise RecordFormatError(f"not a {RECORD_SCHEMA} record")
    keys = set(record)
    expected_keys = _TOP_LEVEL_KEYS
    if record.get("mode") == MODE_WHAT_IF:
        expected_keys = _TOP_LEVEL_KEYS | {WHAT_IF_KEY}
    if keys != expected_keys:
        missing = sorted(expected_keys - keys)
        extra = sorted(keys - expected_keys)
        raise RecordFormatError(f"record fields differ: missing {missing}, unexpected {extra}")
    claimed = record["digest"]
    body = {key: value for key, value in record.items() if key != "digest"}
    try:
        actual = sha256_digest(body)
    except (TypeError, ValueError) as error:
        raise RecordFormatError(f"record is not canonical JSON: {error}") from None
    if claimed != actual:
        raise RecordDigestMismatchError(
            f"record digest {claimed} does not match its content ({actual}): it was altered"
        )

    identity = record["manifest"]
    bound_digest = identity.get("digest") if isinstance(identity, Mapping) else None
    entry = REGISTERED_MANIFESTS.get(bound_digest) if isinstance(bound_digest, str) else None
    if entry is None:
        raise RecordManifestMismatchError(
            f"record is bound to manifest digest {bound_digest}, which is not preregistered"
        )
    if identity.get("schema") != entry.schema or identity.get("version") != entry.version:
        raise RecordManifestMismatchError(
            f"record names {identity.get('schema')} {identity.get('version')} for {bound_digest}, "
            f"registered as {entry.schema} {entry.version}"
        )
    expected = _expected_manifest_digest(manifest_bytes_or_digest)
    if expected is not None and expected != bound_digest:
        raise RecordManifestMismatchError(
            f"record is bound to manifest {bound_digest}, not to {expected}"
        )

    if record["mode"] not in MODES:
        raise RecordFormatError(f"record mode {record['mode']!r} is not a load mode")
    if record["target"] not in TARGETS:
        raise RecordFormatError(f"record target {record['target']!r} is not a load target")
    if (record["mode"] == MODE_STAGED) != (record["target"] == TARGET_STAGED):
        raise RecordFormatError(
            f"record mode {record['mode']} does not match its target {record['target']}"
        )
    if record["mode"] == MODE_WHAT_IF and not isinstance(record[WHAT_IF_KEY], Mapping):
        raise RecordFormatError("a what-if record must name the profile it ran against")
    _verify_comparisons(record, manifest_bytes_or_digest)
    return record


def _verify_comparisons(
    record: Mapping[str, Any], manifest: bytes | str | LoadManifest | None
) -> None:
    comparisons = record["comparisons"]
    observations = record["observations"]
    resources = record["resources"]
    if not isinstance(comparisons, list) or not comparisons:
        raise RecordFormatError("record has no comparisons")
    if not isinstance(observations, Mapping) or not isinstance(resources, Mapping):
        raise RecordFormatError("record observations and resources must be objects")
    bounds = _manifest_bounds(manifest)
    if bounds is not None:
        declared = [(name, limit) for name, limit in bounds.items()]
        compared = [(c.get("bound"), c.get("limit")) for c in comparisons]
        if declared != compared:
            raise RecordFormatError("record comparisons do not cover exactly the manifest's bounds")
    sections = {"observations": observations, "resources": resources}
    for comparison in comparisons:
        source = BOUND_SOURCES.get(comparison.get("bound"))
        if source is None:
            raise RecordFormatError(f"record compares an unknown bound {comparison.get('bound')!r}")
        section, field, direction = source
        observed = sections[section].get(field)
        if comparison.get("observed") != observed:
            raise RecordFormatError(
                f"comparison {comparison['bound']} reports {comparison.get('observed')!r}, "
                f"the record observed {observed!r}"
            )
        if comparison.get("pass") is not _judge(direction, comparison.get("limit"), observed):
            raise RecordFormatError(f"comparison {comparison['bound']} has the wrong verdict")
    if record["passed"] is not all(c["pass"] for c in comparisons):
        raise RecordFormatError("record verdict disagrees with its comparisons")


def _manifest_bounds(manifest: bytes | str | LoadManifest | None) -> Mapping[str, Any] | None:
    if isinstance(manifest, LoadManifest):
        return manifest.bounds
    if isinstance(manifest, bytes | bytearray | memoryview):
        return parse_manifest(bytes(manifest)).bounds
    return None


def evidence_flags(records: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    """The gate flags a set of load records supports.

    ``load-manifest-offline-passed`` needs at least one verified, passing offline record and no
    failing or unverifiable one; ``load-manifest-qualified`` (gate G5) likewise needs verified,
    passing ``staged-provider`` evidence, and one failing staged record disqualifies the set.
    Offline records never set the qualified flag, whatever else they claim, and what-if records
    (another profile's limits) are ignored: they neither set nor spoil a flag.
    """
    good = {MODE_OFFLINE: 0, MODE_STAGED: 0}
    spoiled = {MODE_OFFLINE: False, MODE_STAGED: False}
    for record in records:
        claimed_mode = record.get("mode") if isinstance(record, Mapping) else None
        if claimed_mode == MODE_WHAT_IF:
            continue
        try:
            verify_record(record)
        except LoadHarnessError:
            # An unverifiable record counts against whatever mode it claims, if it claims one.
            if isinstance(claimed_mode, str) and claimed_mode in spoiled:
                spoiled[claimed_mode] = True
            continue
        if record["passed"] is True:
            good[record["mode"]] += 1
        else:
            spoiled[record["mode"]] = True
    return {
        FLAG_OFFLINE_PASSED: good[MODE_OFFLINE] > 0 and not spoiled[MODE_OFFLINE],
        FLAG_QUALIFIED: good[MODE_STAGED] > 0 and not spoiled[MODE_STAGED],
    }
