"""The seeded bursty Poisson arrival model of the load manifests, bit-for-bit as the JavaScript
reference implementation draws it (mulberry32, seven draws per arrival).

Every arrival takes exactly seven draws from mulberry32, so adding a field to an arrival never
shifts the draws of the arrivals after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from evaluator.harness.errors import ManifestFormatError
from evaluator.harness.manifests import LoadManifest

__all__ = [
    "Arrival",
    "ArrivalModel",
    "PrincipalWeight",
    "generate_arrivals",
    "iter_arrivals",
    "mulberry32",
]

_U32 = 0xFFFFFFFF
_TWO_32 = 4294967296.0


def mulberry32(seed: int) -> Callable[[], float]:
    """A mulberry32 generator returning floats in [0, 1), in unsigned 32-bit arithmetic.

    Products are reduced mod 2**32, which is what JavaScript's ``Math.imul`` keeps of them.
    """
    state = seed & _U32

    def draw() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & _U32
        t = state
        t = ((t ^ (t >> 15)) * (t | 1)) & _U32
        t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & _U32)) & _U32
        return (t ^ (t >> 14)) / _TWO_32

    return draw


@dataclass(frozen=True, slots=True)
class PrincipalWeight:
    """A principal of the arrival mix: its id, fairness class and share of arrivals."""

    principal_id: str
    principal_class: str
    weight: float


@dataclass(frozen=True, slots=True)
class ArrivalModel:
    """The parameters of ``arrivalModel`` plus the principals and providers they draw from."""

    seed: int
    average_requests_per_second: float
    spike_multiplier: float
    spike_start_ms: float
    spike_end_ms: float
    principals: tuple[PrincipalWeight, ...]
    provider_ids: tuple[str, ...]
    small_tokens: int
    huge_tokens: int
    huge_token_share: float
    service_minimum_ms: int
    service_maximum_ms: int
    retryable_failure_rate: float
    cancellation_rate: float
    cancel_after_ms: int

    @classmethod
    def from_manifest(cls, manifest: LoadManifest) -> ArrivalModel:
        """The full model of a manifest that declares principals, providers and service times."""
        model = manifest.section("arrivalModel")
        duration = manifest.section("duration")
        principals = manifest.document.get("principals")
        providers = manifest.document.get("providers")
        if not isinstance(principals, Sequence) or not isinstance(providers, Mapping):
            raise ManifestFormatError(
                f"manifest {manifest.schema} {manifest.version} declares no principals and "
                "providers to draw arrivals from; it is qualified by the bounded-scheduler gate "
                "(CNC-SCHED-005), not by a load run"
            )
        try:
            service = model["serviceTimeMs"]
            return cls(
                seed=int(model["seed"]),
                average_requests_per_second=float(model["averageRequestsPerSecond"]),
                spike_multiplier=float(model["spikeMultiplier"]),
                spike_start_ms=float(duration["loadSeconds"]) * 1000.0,
                spike_end_ms=(float(duration["loadSeconds"]) + float(model["spikeDurationSeconds"]))
                * 1000.0,
                principals=tuple(
                    PrincipalWeight(p["id"], p.get("class", p["id"]), float(p["weight"]))
                    for p in principals
                ),
                provider_ids=tuple(sorted(providers)),
                small_tokens=int(model["smallTokens"]),
                huge_tokens=int(model["hugeTokens"]),
                huge_token_share=float(model["hugeTokenShare"]),
                service_minimum_ms=int(service["minimum"]),
                service_maximum_ms=int(service["maximum"]),
                retryable_failure_rate=float(model["retryableFailureRate"]),
                cancellation_rate=float(model["cancellationRate"]),
                cancel_after_ms=int(model["cancelAfterMs"]),
            )
        except KeyError as missing:
            raise ManifestFormatError(
                f"manifest {manifest.schema} {manifest.version} arrivalModel lacks {missing}"
            ) from None


class Arrival(NamedTuple):
    """One synthetic request of the timeline (a tuple: twenty thousand are built per run)."""

    ordinal: int
    at_ms: int
    principal_id: str
    principal_class: str
    provider_id: str
    huge: bool
    tokens: int
    service_ms: int
    fails_first_attempt: bool
    cancel_at_ms: int | None


def iter_arrivals(model: ArrivalModel, end_ms: float) -> Iterator[Arrival]:
    """Yield the arrivals whose time lies before ``end_ms``, in time order."""
    draw = mulberry32(model.seed)
    base_rate = model.average_requests_per_second / 1000.0
    spike_rate = base_rate * model.spike_multiplier
    spike_start, spike_end = model.spike_start_ms, model.spike_end_ms
    principals = model.principals
    total_weight = sum(p.weight for p in principals)
    cumulative: list[float] = []
    running = 0.0
    for principal in principals:
        running += principal.weight
        cumulative.append(running)
    providers = model.provider_ids
    provider_count = len(providers)
    service_span = model.service_maximum_ms - model.service_minimum_ms + 1
    service_minimum = model.service_minimum_ms
    huge_share, huge_tokens, small_tokens = (
        model.huge_token_share,
        model.huge_tokens,
        model.small_tokens,
    )
    failure_rate, cancellation_rate = model.retryable_failure_rate, model.cancellation_rate
    cancel_after = model.cancel_after_ms
    weighted = list(zip(cumulative, principals, strict=True))
    last = principals[-1]
    log = math.log
    floor = math.floor
    make = Arrival
    at = 0.0
    index = 0
    while True:
        # The rate follows the previous arrival's time, as the reference model does.
        rate = spike_rate if spike_start <= at < spike_end else base_rate
        at += -log(1.0 - draw()) / rate
        if at >= end_ms:
            return
        target = draw() * total_weight
        principal = last
        for bound, candidate in weighted:
            if target < bound:
                principal = candidate
                break
        provider_id = providers[floor(draw() * provider_count)]
        huge = draw() < huge_share
        service_ms = service_minimum + floor(draw() * service_span)
        fails_first_attempt = draw() < failure_rate
        cancels = draw() < cancellation_rate
        at_ms = floor(at + 0.5)
        # Positional: this runs for every arrival of the timeline.
        yield make(
            index,
            at_ms,
            principal.principal_id,
            principal.principal_class,
            provider_id,
            huge,
            huge_tokens if huge else small_tokens,
            service_ms,
            fails_first_attempt,
            at_ms + cancel_after if cancels else None,
        )
        index += 1


def generate_arrivals(model: ArrivalModel, end_ms: float) -> list[Arrival]:
    """All arrivals before ``end_ms`` as a list."""
    return list(iter_arrivals(model, end_ms))
