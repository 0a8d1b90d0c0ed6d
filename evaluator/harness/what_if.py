"""What-if qualification: a manifest's arrivals and bounds against another profile's limits.

An approver asks "does the offline manifest pass with *these* limits?". The answer keeps the
manifest's arrival model, service times, durations and bounds, and swaps its four profile
sections (``profileVersion``, ``workspace``, ``providers``, ``principals``) for the proposed
profile's. The manifest's principals and providers are mapped onto the profile's ids:

1. an explicit mapping wins for every id it names;
2. otherwise an id the profile also configures maps to itself;
3. otherwise ids map by position: the i-th manifest principal (manifest order) or provider
   (sorted, as the arrival model draws them) onto the i-th of the profile's ids sorted,
   wrapping around when the profile has fewer.

Several manifest ids mapped onto one profile id become one caller (or one provider lane): their
arrivals share that id's quota, as they would in production. Arrivals keep their manifest
principal class, so the quiet principals' admission ratio is still measured per class.

The record has mode ``what-if`` and a ``whatIf`` object naming the profile and the mapping;
``evidence_flags`` ignores it, so a what-if run never sets or spoils a gate flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from admission.core import InvalidProfileError, Profile
from evaluator.harness.arrivals import Arrival, ArrivalModel, iter_arrivals
from evaluator.harness.errors import LoadHarnessError, UnknownTargetError
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.records import MODE_WHAT_IF, build_record
from evaluator.harness.replay import WORKSPACE_ID
from evaluator.harness.service import LOAD_TARGETS, measure
from evaluator.harness.target import Progress

__all__ = ["IdMapping", "WhatIfError", "map_ids", "run_what_if"]

_PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")
_SECTIONS = ("principals", "providers")


class WhatIfError(LoadHarnessError):
    """A what-if run that cannot start; ``field`` names the input at fault (``profile`` or a
    ``mapping.…`` path)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True, slots=True)
class IdMapping:
    """Manifest id → profile id, for principals and for providers."""

    principals: Mapping[str, str]
    providers: Mapping[str, str]

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"principals": dict(self.principals), "providers": dict(self.providers)}


def _requested(mapping: Any) -> Mapping[str, Mapping[str, str]]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise WhatIfError("the mapping must be an object", field="mapping")
    for key, section in mapping.items():
        if key not in _SECTIONS:
            raise WhatIfError(
                "unknown key; the mapping has 'principals' and 'providers'", field=f"mapping.{key}"
            )
        if not isinstance(section, Mapping) or not all(
            isinstance(source, str) and isinstance(target, str)
            for source, target in section.items()
        ):
            raise WhatIfError(
                "must map manifest ids to profile ids (strings)", field=f"mapping.{key}"
            )
    return mapping


def _map_section(
    section: str,
    manifest_ids: Sequence[str],
    profile_ids: Sequence[str],
    explicit: Mapping[str, str],
) -> dict[str, str]:
    for source, target in explicit.items():
        if source not in manifest_ids:
            raise WhatIfError(
                f"the manifest has no {section[:-1]} {source!r} (it has {', '.join(manifest_ids)})",
                field=f"mapping.{section}.{source}",
            )
        if target not in profile_ids:
            raise WhatIfError(
                f"the profile has no {section[:-1]} {target!r} (it has {', '.join(profile_ids)})",
                field=f"mapping.{section}.{source}",
            )
    ordered = sorted(profile_ids)
    if not ordered:
        raise WhatIfError(f"the profile configures no {section}", field=f"profile.{section}")
    mapped = {}
    for index, source in enumerate(manifest_ids):
        if source in explicit:
            mapped[source] = explicit[source]
        elif source in profile_ids:
            mapped[source] = source
        else:
            mapped[source] = ordered[index % len(ordered)]
    return mapped


def map_ids(manifest: LoadManifest, profile: Profile, mapping: Any = None) -> IdMapping:
    """Where each manifest principal and provider goes in ``profile`` (see the module docs).

    Raises ``WhatIfError`` for a malformed mapping or one that names unknown ids.
    """
    requested = _requested(mapping)
    model = ArrivalModel.from_manifest(manifest)
    manifest_principals = [weight.principal_id for weight in model.principals]
    return IdMapping(
        principals=_map_section(
            "principals",
            manifest_principals,
            list(profile.principals),
            requested.get("principals", {}),
        ),
        providers=_map_section(
            "providers",
            list(model.provider_ids),
            list(profile.providers),
            requested.get("providers", {}),
        ),
    )


def run_what_if(
    manifest: LoadManifest,
    profile_document: Any,
    target: str,
    *,
    mapping: Any = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run ``manifest``'s arrivals through ``target`` under ``profile_document``'s limits.

    Returns a digest-bound ``decision-load-result/v1`` record of mode ``what-if``. Raises
    ``WhatIfError`` for an invalid profile or mapping, ``UnknownTargetError`` for a target
    that is not an offline harness target, and ``ManifestFormatError`` for a manifest without
    an arrival model.
    """
    runner = LOAD_TARGETS.get(target)
    if runner is None:
        known = ", ".join(sorted(LOAD_TARGETS))
        raise UnknownTargetError(f"what-if runs use an offline target ({known}), not {target!r}")
    try:
        profile = Profile.from_dict(profile_document, workspace_id=WORKSPACE_ID)
    except InvalidProfileError as error:
        raise WhatIfError(str(error), field="profile") from None
    ids = map_ids(manifest, profile, mapping)
    model = ArrivalModel.from_manifest(manifest)
    end_ms = runner.window_end_ms(manifest)

    def arrivals() -> list[Arrival]:
        principals, providers = ids.principals, ids.providers
        return [
            arrival._replace(
                principal_id=principals[arrival.principal_id],
                provider_id=providers[arrival.provider_id],
            )
            for arrival in iter_arrivals(model, end_ms)
        ]

    # Same manifest identity, arrivals and bounds; only the limits are the profile's.
    written = profile.to_dict()
    limited = dataclasses.replace(
        manifest, document={**manifest.document, **{key: written[key] for key in _PROFILE_KEYS}}
    )
    timed, used = measure(runner, limited, arrivals, progress)
    return build_record(
        manifest=manifest,
        mode=MODE_WHAT_IF,
        target=target,
        window=timed.window,
        observations=timed.observations,
        resources=used,
        what_if={
            "profileVersion": profile.profile_version,
            "profileDigest": profile.profile_digest,
            "mapping": ids.to_dict(),
        },
    )
