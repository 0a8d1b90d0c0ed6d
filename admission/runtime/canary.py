"""A canary run's admission: under the canary version's limits, and within the active version's.

A canary run's attempt takes two leases, in this order:

1. one from the canary's own controller, under the canary version's limits. With deployment-wide
   admission that controller is coordinated in Redis under a key space of the canary's own, so
   the canary's limits are counted for every process together, and nothing of it touches the
   active version's counters;
2. one from the workspace's real controller, under the active version's limits: the permits of
   the shared pools (provider and workspace concurrency, request and token buckets) that every
   other run takes too. So at no instant does a provider see more calls than the active
   version's ceiling, canary or not.

The canary lease is taken first and given back when the second is refused, so a canary attempt
never holds an active permit while it waits for a canary one (the active pools never wait on
the canary). Both leases go back together, with the same outcome. The run's evidence is the
canary side's (what the canary's limits did), with the time waited in both queues as its queue
delay: the sum of each side's own queue delay, so an attempt that both sides admit at once
records none (the round trips to Redis are not a wait, and counted as one every coordinated
canary request would read as deferred).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from admission.core import AdmissionRegistry
from admission.core.evidence import AdmissionEvidence, BreakerTransition

__all__ = ["CanaryController", "CanaryLease", "CanaryRegistry"]


class CanaryLease:
    """Both leases of one canary attempt, released together."""

    __slots__ = ("_canary", "_pool", "evidence")

    def __init__(self, canary: Any, pool: Any, evidence: AdmissionEvidence) -> None:
        self._canary = canary
        self._pool = pool
        self.evidence = evidence

    @property
    def released(self) -> bool:
        return bool(self._canary.released and self._pool.released)

    def release(
        self,
        success: bool | None = None,
        retry_after_ms: float | None = None,
        actual_tokens: int | None = None,
        actual_cost_usd: float | None = None,
    ) -> None:
        try:
            self._pool.release(success, retry_after_ms, actual_tokens, actual_cost_usd)
        finally:
            self._canary.release(success, retry_after_ms, actual_tokens, actual_cost_usd)
            # Breaker transitions the release caused, on either side, travel with the evidence.
            seen = set(map(id, self.evidence.breaker_transitions))
            for side in (self._canary.evidence, self._pool.evidence):
                for transition in side.breaker_transitions:
                    if id(transition) not in seen:
                        self.evidence.breaker_transitions.append(transition)
                        seen.add(id(transition))


class CanaryController:
    """A workspace's admission for canary runs: the canary's controller, then the active one's
    shared pools (see the module doc)."""

    def __init__(self, canary: Any, active: Any) -> None:
        self._canary = canary
        self._active = active

    async def acquire(self, request: Any) -> CanaryLease:
        canary = await self._canary.acquire(request)
        try:
            pool = await self._active.acquire(request)
        except BaseException:
            # Refused, cancelled or failed on the shared pools: the canary permit goes back
            # with no outcome (not a provider failure).
            canary.release(success=None)
            raise
        # Each side's queue delay is its own queue wait (none when decided at once); the active
        # side's request arrives when the canary's is granted, so the two never overlap.
        waited = canary.evidence.queue_delay_ms + pool.evidence.queue_delay_ms
        evidence = dataclasses.replace(
            canary.evidence,
            queue_delay_ms=waited,
            breaker_transitions=list(canary.evidence.breaker_transitions),
        )
        return CanaryLease(canary, pool, evidence)

    @property
    def profile(self) -> Any:
        """The canary version's profile: its ceilings shape the run (the scheduler's too)."""
        return self._canary.profile

    def snapshot(self, principal_id: str) -> Any:
        return self._canary.snapshot(principal_id)

    def release_budget(self, budget_id: str) -> None:
        self._canary.release_budget(budget_id)
        self._active.release_budget(budget_id)

    def coordinate_retry_after(self, provider_id: str, ms: float) -> None:
        # The provider asked everybody to pause: both sides hear it.
        self._canary.coordinate_retry_after(provider_id, ms)
        self._active.coordinate_retry_after(provider_id, ms)

    def breaker_transitions(self) -> list[BreakerTransition]:
        return [*self._canary.breaker_transitions(), *self._active.breaker_transitions()]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._canary, name)


class CanaryRegistry:
    """The registry a canary run admits through: the canary version's registry (its profile is
    the run's profile, it has no shadow), whose controllers also take the active version's
    shared pools from the process registry."""

    def __init__(self, canary: AdmissionRegistry, active: AdmissionRegistry) -> None:
        self._canary = canary
        self._active = active

    def controller(self, workspace_id: str) -> CanaryController | None:
        canary = self._canary.controller(workspace_id)
        active = self._active.controller(workspace_id)
        if canary is None or active is None:
            return None
        return CanaryController(canary, active)

    def shadow(self, workspace_id: str) -> None:
        return None

    def decision_registries(self) -> tuple[AdmissionRegistry, AdmissionRegistry]:
        """The registries a canary run's decisions are reported to: the canary's, then the
        process registry (the shared pools)."""
        return self._canary, self._active

    def __getattr__(self, name: str) -> Any:
        return getattr(self._canary, name)
