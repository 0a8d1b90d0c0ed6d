"""A shadow profile: every admission request of a workspace decided again, in dry run, under a
proposed profile's limits.

The shadow has a controller of its own, in a private registry on the host registry's clock, so it
holds no real permit, takes nothing from a real bucket or budget and never changes a real
outcome. The host reports each real request: `ShadowAdmission.mirror(request)` when it asks for
admission, then on the returned `ShadowCall` `admitted(lease)`, `rejected(rejection)` or
`abandoned()`, and `released(...)` when the real lease goes back. The copy asks the shadow's
controller at once (in a task of its own). Once admitted it holds its shadow permit for as long
as the real lease was held, counted from its own admission, and is released with the real
outcome; when reality rejected or withdrew the request, the shadow permit goes back at once. So
the shadow's queues carry the load the real requests make, and its would-be outcomes are counted
exactly as the real ones (`Tally`).

Not simulated: requests the shadow would have added (retries of its own rejections are only
counted, as `wouldRetry`) and `Retry-After` pauses a provider announced outside a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from admission.core.errors import AdmissionRejected
from admission.core.request import AdmissionRequest

if TYPE_CHECKING:
    from admission.core.clock import Clock
    from admission.core.controller import AdmissionController, Lease
    from admission.core.evidence import AdmissionEvidence
    from admission.core.limits import Profile

__all__ = ["ControllerHost", "ShadowAdmission", "ShadowCall", "Tally", "merge_tallies"]

logger = logging.getLogger(__name__)


class ControllerHost(Protocol):
    """What hosts a shadow's own controller (an `AdmissionRegistry` of its own)."""

    def register(self, profile: Profile) -> AdmissionController: ...


@dataclass(slots=True)
class Tally:
    """Admission outcomes of a stream of requests, as counted on either side of a shadow.

    `deferred` counts requests that waited in a queue before their decision (admitted or not);
    `wouldRetry` (shadow side only) counts retryable shadow rejections of requests that reality
    admitted: each would have cost at least one more attempt.
    """

    requests: int = 0
    retries: int = 0
    admitted: int = 0
    deferred: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    retryable_rejected: int = 0
    would_retry: int = 0
    queue_delay_total_ms: float = 0.0
    queue_delay_max_ms: float = 0.0
    max_queued: int = 0
    max_retry_pressure: int = 0
    breaker_transitions: dict[str, int] = field(default_factory=dict)

    def count_admission(self, evidence: AdmissionEvidence, *, retry: bool) -> None:
        self.requests += 1
        self.retries += retry
        self.admitted += 1
        self._count_evidence(evidence)

    def count_rejection(self, rejection: AdmissionRejected, *, retry: bool) -> None:
        self.requests += 1
        self.retries += retry
        self.rejected[rejection.reason] = self.rejected.get(rejection.reason, 0) + 1
        self.retryable_rejected += bool(rejection.retryable)
        if rejection.evidence is not None:
            self._count_evidence(rejection.evidence)
            self.count_transitions(rejection.evidence)

    def count_transitions(self, evidence: AdmissionEvidence) -> None:
        for transition in evidence.breaker_transitions:
            key = f"{transition.from_state}->{transition.to_state}"
            self.breaker_transitions[key] = self.breaker_transitions.get(key, 0) + 1

    def _count_evidence(self, evidence: AdmissionEvidence) -> None:
        delay = evidence.queue_delay_ms
        if delay > 0:
            self.deferred += 1
            self.queue_delay_total_ms += delay
            self.queue_delay_max_ms = max(self.queue_delay_max_ms, delay)
        self.max_queued = max(self.max_queued, evidence.queued)
        self.max_retry_pressure = max(self.max_retry_pressure, evidence.retry_pressure)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "admitted": self.admitted,
            "deferred": self.deferred,
            "rejected": dict(sorted(self.rejected.items())),
            "retryableRejected": self.retryable_rejected,
            "wouldRetry": self.would_retry,
            "queueDelayMs": {"total": self.queue_delay_total_ms, "max": self.queue_delay_max_ms},
            "maxQueued": self.max_queued,
            "maxRetryPressure": self.max_retry_pressure,
            "breakerTransitions": dict(sorted(self.breaker_transitions.items())),
        }


# Runs remembered as drained, so their late counts go to the next drain.
_DRAINED_KEPT = 4096
_SUMMED = ("requests", "retries", "admitted", "deferred", "retryableRejected", "wouldRetry")
_MAXED = ("maxQueued", "maxRetryPressure")


def merge_tallies(tallies: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One tally (as `Tally.to_dict` writes it) for several: counts add up, maxima take the max."""
    merged = Tally().to_dict()
    for tally in tallies:
        for key in _SUMMED:
            merged[key] += int(tally.get(key, 0))
        for key in _MAXED:
            merged[key] = max(merged[key], int(tally.get(key, 0)))
        for key in ("rejected", "breakerTransitions"):
            for name, count in tally.get(key, {}).items():
                merged[key][name] = merged[key].get(name, 0) + int(count)
        delay = tally.get("queueDelayMs", {})
        merged["queueDelayMs"]["total"] += float(delay.get("total", 0.0))
        merged["queueDelayMs"]["max"] = max(
            merged["queueDelayMs"]["max"], float(delay.get("max", 0.0))
        )
    for key in ("rejected", "breakerTransitions"):
        merged[key] = dict(sorted(merged[key].items()))
    return merged


class ShadowAdmission:
    """A workspace's shadow: its profile, its own controller and both sides' tallies."""

    def __init__(
        self, profile: Profile, *, clock: Clock, host: ControllerHost, session: Any = None
    ) -> None:
        self.profile = profile
        self.workspace_id = profile.workspace_id
        # The host's name for this shadow (its audit row), carried for the host's records.
        self.session = session
        self.clock = clock
        # The registry that starts the shadow hands it a registry of its own to host it (its
        # owner finds it here to close what it holds when the shadow is replaced).
        self.host = host
        controller = host.register(profile)
        self.controller: AdmissionController = controller
        # Both sides' tallies per run (the budget id's part before its last "/", the
        # invocation), and what was counted for runs already drained (kept for the next drain).
        self._runs: dict[str, tuple[Tally, Tally]] = {}
        self._drained: dict[str, None] = {}
        self._late = (Tally(), Tally())
        self.calls: set[ShadowCall] = set()
        self.stopped = False
        # Invocations that ended while some of their shadow requests were still pending.
        self._ended_budgets: set[str] = set()

    def mirror(self, request: AdmissionRequest, *, retry: bool = False) -> ShadowCall | None:
        """Start deciding `request` under the shadow's limits; call on the event loop."""
        if self.stopped:
            return None
        call = ShadowCall(self, request, retry)
        self.calls.add(call)
        return call

    def tallies(self, budget_id: str) -> tuple[Tally, Tally]:
        """The (active, shadow) tallies a request of invocation budget `budget_id` counts in."""
        run = budget_id.rsplit("/", 1)[0]
        if run in self._drained:
            # Its run was drained already: counted with the next drain, never lost.
            return self._late
        found = self._runs.get(run)
        if found is None:
            found = self._runs[run] = (Tally(), Tally())
        return found

    def drain(self, run: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Both sides' tallies as dicts: of one run (its invocation id), or with `run` None of
        every run since the previous drain; what ended up counted for runs drained before
        comes along. The counting of those runs starts again."""
        keys = list(self._runs) if run is None else [run] if run in self._runs else []
        picked = [self._runs.pop(key) for key in keys]
        if run is not None:
            self._drained[run] = None
            while len(self._drained) > _DRAINED_KEPT:
                del self._drained[next(iter(self._drained))]
        picked.append(self._late)
        self._late = (Tally(), Tally())
        active = merge_tallies(side[0].to_dict() for side in picked)
        shadow = merge_tallies(side[1].to_dict() for side in picked)
        return active, shadow

    def stop(self) -> None:
        """Mirror nothing more; shadow requests still waiting are withdrawn and shadow permits
        still held are given back.

        The withdrawal happens on the loop the shadow's requests run on: at once when called
        there, else as soon as that loop runs again (a host that stops a shadow from another
        thread holds the loop still meanwhile).
        """
        self.stopped = True
        calls = list(self.calls)
        if not calls:
            return
        loop = calls[0].loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._withdraw_all()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._withdraw_all)

    def _withdraw_all(self) -> None:
        for call in list(self.calls):
            call.withdraw()

    def release_budget(self, budget_id: str) -> None:
        """Forget an invocation's shadow budgets once none of its shadow requests is pending."""
        if any(call.budget_id == budget_id for call in self.calls):
            self._ended_budgets.add(budget_id)
        else:
            self.controller.release_budget(budget_id)

    def call_ended(self, call: ShadowCall) -> None:
        """`call` ended on both sides: forget it, and forget its invocation's shadow budgets when
        the invocation ended first and this was its last pending call."""
        self.calls.discard(call)
        budget_id = call.budget_id
        if budget_id in self._ended_budgets and not any(
            other.budget_id == budget_id for other in self.calls
        ):
            self._ended_budgets.discard(budget_id)
            self.controller.release_budget(budget_id)


class ShadowCall:
    """One real request and its shadow copy, from the real request's arrival until both ended."""

    __slots__ = (
        "_held_ms",
        "_lease",
        "_outcome",
        "_owner",
        "_real",
        "_real_admit_ms",
        "_retry",
        "_shadow",
        "_shadow_admit_ms",
        "_task",
        "_timer",
        "budget_id",
    )

    def __init__(self, owner: ShadowAdmission, request: AdmissionRequest, retry: bool) -> None:
        self._owner = owner
        self._retry = retry
        self.budget_id = request.budget_id
        # The copy carries the real request's deadline but not its signal: the real attempt's
        # signal is disposed when it ends, while the copy may still wait.
        copy = AdmissionRequest(
            request.budget_id,
            request.principal_id,
            request.workspace_id,
            request.provider_id,
            request.estimate,
            deadline_ms=request.deadline_ms,
        )
        self._real: str | None = None
        self._real_admit_ms: float | None = None
        self._held_ms: float | None = None
        self._outcome: tuple[Any, ...] = (None, None, None, None)
        self._shadow: str | None = None
        self._shadow_admit_ms: float | None = None
        self._lease: Lease | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task = asyncio.get_running_loop().create_task(self._decide(copy))
        self._task.add_done_callback(self._task_ended)

    # Both sides count where their run counts when they count: a decision that comes after its
    # run was drained goes with the next drain (into a tally already drained, it would be lost).
    @property
    def _active(self) -> Tally:
        return self._owner.tallies(self.budget_id)[0]

    @property
    def _shadow_tally(self) -> Tally:
        return self._owner.tallies(self.budget_id)[1]

    # ------------------------------------------------------------- the real side

    def admitted(self, lease: Lease) -> None:
        self._real = "admitted"
        self._real_admit_ms = self._owner.clock.monotonic_ms()
        self._active.count_admission(lease.evidence, retry=self._retry)
        self._settle_counts()

    def rejected(self, rejection: AdmissionRejected) -> None:
        self._real = "rejected"
        self._active.count_rejection(rejection, retry=self._retry)
        self._held_ms = 0.0
        self._settle_counts()
        self._release_shadow()

    def abandoned(self) -> None:
        """The real request was withdrawn before its decision: so is the copy."""
        self._real = "abandoned"
        self._held_ms = 0.0
        self.withdraw()

    def released(
        self,
        lease: Lease,
        success: bool | None = None,
        actual_tokens: int | None = None,
        actual_cost_usd: float | None = None,
        retry_after_ms: float | None = None,
    ) -> None:
        self._active.count_transitions(lease.evidence)
        start = self._real_admit_ms
        now = self._owner.clock.monotonic_ms()
        self._held_ms = max(0.0, now - start) if start is not None else 0.0
        self._outcome = (success, actual_tokens, actual_cost_usd, retry_after_ms)
        self._release_shadow()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the copy runs on."""
        return self._task.get_loop()

    def withdraw(self) -> None:
        if not self._task.done():
            self._task.cancel()
        elif self._lease is not None:
            self._outcome = (None, None, None, None)
            self._held_ms = 0.0
            if self._timer is not None:
                # Holding on as long as reality did: withdrawn, it goes back now.
                self._timer.cancel()
                self._timer = None
            self._release_shadow()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # A copy withdrawn before its first step never ran `_decide`, which ends every other copy.
        if task.cancelled():
            self._done()

    # ----------------------------------------------------------- the shadow side

    async def _decide(self, copy: AdmissionRequest) -> None:
        owner = self._owner
        try:
            lease = await owner.controller.acquire(copy)
        except AdmissionRejected as rejection:
            self._shadow = "rejected"
            self._shadow_tally.count_rejection(rejection, retry=self._retry)
            if rejection.retryable:
                self._shadow = "rejected-retryable"
            self._settle_counts()
            self._done()
            return
        except asyncio.CancelledError:
            self._done()
            return
        except Exception:
            # A shadow never disturbs the real path: its failures are logged and dropped.
            logger.exception("shadow admission failed")
            self._done()
            return
        self._shadow = "admitted"
        self._lease = lease
        self._shadow_admit_ms = owner.clock.monotonic_ms()
        self._shadow_tally.count_admission(lease.evidence, retry=self._retry)
        self._settle_counts()
        if owner.stopped:
            self._held_ms = 0.0
        self._release_shadow()

    def _settle_counts(self) -> None:
        if self._real == "admitted" and self._shadow == "rejected-retryable":
            self._shadow_tally.would_retry += 1
            self._shadow = "rejected"

    def _release_shadow(self) -> None:
        lease, held = self._lease, self._held_ms
        if lease is None or held is None or self._timer is not None:
            return
        admitted_ms = self._shadow_admit_ms or 0.0
        due_ms = admitted_ms + held
        if due_ms <= self._owner.clock.monotonic_ms():
            self._give_back()
        else:
            self._timer = self.loop.call_at(due_ms / 1000.0, self._give_back)

    def _give_back(self) -> None:
        lease = self._lease
        if lease is None:
            return
        self._lease = None
        success, tokens, cost, retry_after = self._outcome
        with contextlib.suppress(ValueError):
            lease.release(
                success=success,
                retry_after_ms=retry_after,
                actual_tokens=tokens,
                actual_cost_usd=cost,
            )
        self._shadow_tally.count_transitions(lease.evidence)
        self._done()

    def _done(self) -> None:
        if self._lease is None:
            self._owner.call_ended(self)
