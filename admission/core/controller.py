"""The admission controller of one workspace: preflight, fair queueing, dispatch and release.

Checks run in the order docs/admission-core.md gives. Lanes are keyed (provider, principal)
inside the workspace. A lane whose head must wait is *parked* on the thing it waits for (a scope's
permits, a share cap, a token-bucket reservation) or on a timer (buckets, Retry-After pauses, an
open breaker), so releasing a permit only looks at lanes that the release can help. Lanes that can
proceed are served least recently served first (`rotation.Rotation`), whatever woke them.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from admission.core.errors import AdmissionRejected
from admission.core.evidence import AdmissionEvidence, BreakerTransition, QueueSnapshot
from admission.core.lease import ReleaseOutcome, give_back_checked
from admission.core.rejection import HINTED_REASONS, rejected, retry_hint
from admission.core.rotation import Rotation
from admission.core.rules import (
    EPSILON,
    budget_reason,
    compile_gate,
    gate_fails,
    static_reason,
    valid_amount,
)
from admission.core.scopes import Budget, Pair, Scope, TokenBucket
from admission.core.ticket import Ticket

if TYPE_CHECKING:
    from admission.core.hosting import ControllerHost
    from admission.core.limits import Profile
    from admission.core.request import AdmissionRequest

# Millisecond slack when comparing a timer's due time with the clock (float round trips).
TIME_EPSILON_MS = 1e-6
# The smallest step a lane timer advances, so a virtual clock always moves forward.
MIN_TIMER_STEP_MS = 1e-3
# How far the running loop's clock may be from the registry clock before acquire refuses.
CLOCK_TOLERANCE_MS = 50.0
RETRY_PRESSURE_WINDOW_MS = 60_000.0
RETRY_PRESSURE_CAP = 4096
TRANSITION_HISTORY = 256
# Stale entries the heap of waiting lanes' turns may hold beyond twice the live lanes.
TURN_SLACK = 32

_turn_entries = itertools.count()


class _Ticket(Ticket):
    """A `Ticket` with its place while queued here: its scopes, lane, future and timers."""

    __slots__ = (
        "defer_reason",
        "expire_ms",
        "expire_reason",
        "future",
        "holds",
        "lane",
        "pair",
        "principal_scope",
        "provider_scope",
        "timer",
        "transitions",
        "unsubscribe",
    )

    def __init__(self, request: AdmissionRequest, now_ms: float) -> None:
        super().__init__(request, now_ms)
        self.principal_scope: Scope | None = None
        self.provider_scope: Scope | None = None
        self.pair: Pair | None = None
        self.lane: _Lane | None = None
        self.future: asyncio.Future[Lease] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.unsubscribe: Any = None
        self.holds: list[TokenBucket] | None = None
        self.transitions: list[BreakerTransition] | None = None
        self.defer_reason: str | None = None
        self.expire_ms = math.inf
        self.expire_reason = ""


class _Lane:
    """Waiters of one (provider, principal) lane, oldest first, and the lane's turn."""

    __slots__ = ("key", "parked_epoch", "parked_on", "timer", "turn", "waiters", "woken_from")

    def __init__(self, key: tuple[str, str], turn: int) -> None:
        self.key = key
        self.turn = turn
        self.waiters: OrderedDict[_Ticket, None] = OrderedDict()
        self.parked_on: Rotation[_Lane] | None = None
        self.parked_epoch = 0
        self.timer: asyncio.TimerHandle | None = None
        self.woken_from: Rotation[_Lane] | None = None

    def head(self) -> _Ticket | None:
        for ticket in self.waiters:
            return ticket
        return None


class Lease:
    """Permission to dispatch one attempt; `release` gives every permit back exactly once."""

    __slots__ = (
        "_controller",
        "_cost",
        "_generation",
        "_probe",
        "_released",
        "_scopes",
        "_tokens",
        "budget_id",
        "evidence",
        "principal_id",
        "provider_id",
    )

    def __init__(
        self,
        controller: AdmissionController,
        ticket: _Ticket,
        evidence: AdmissionEvidence,
        generation: int,
        probe: bool,
    ) -> None:
        self._controller = controller
        request = ticket.request
        self.budget_id = request.budget_id
        self.principal_id = request.principal_id
        self.provider_id = request.provider_id
        self.evidence = evidence
        self._scopes = (ticket.principal_scope, ticket.provider_scope, ticket.pair)
        self._tokens = ticket.tokens
        self._cost = ticket.cost
        self._generation = generation
        self._probe = probe
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(
        self,
        success: bool | None = None,
        retry_after_ms: float | None = None,
        actual_tokens: int | None = None,
        actual_cost_usd: float | None = None,
    ) -> None:
        """Give the permits back. `success=None` is "no outcome" and never a provider failure.

        Idempotent. Malformed optional figures are ignored after the permits are freed, and then
        reported with `ValueError` (a host bug must not leak capacity).
        """
        if self._released:
            return
        self._released = True
        give_back_checked(self._give_back, success, retry_after_ms, actual_tokens, actual_cost_usd)

    def _give_back(self, outcome: ReleaseOutcome) -> None:
        self._controller._release(self, outcome)


class AdmissionController:
    """Admission for one workspace: every ceiling of its current profile, fairly between lanes."""

    def __init__(self, registry: ControllerHost, profile: Profile) -> None:
        self._registry = registry
        self._clock = registry.clock
        self.workspace_id = profile.workspace_id
        now = self._clock.monotonic_ms()
        self._profile = profile
        self._workspace = Scope("workspace", profile.workspace_id, profile.workspace, now)
        self._principals: dict[str, Scope] = {}
        self._providers: dict[str, Scope] = {}
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._ready: Rotation[_Lane] = Rotation()
        # Admissions so far: the stamp of the latest one; and (turn, n, lane) of waiting lanes.
        self._served = 0
        self._turns: list[tuple[int, int, _Lane]] = []
        self._pump_handle: asyncio.Handle | None = None
        self._budget_scopes: dict[str, list[Scope]] = {}
        self._idle_principals: OrderedDict[str, None] = OrderedDict()
        self._transitions: deque[BreakerTransition] = deque(maxlen=TRANSITION_HISTORY)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._leases = 0
        self._waiting = 0
        self._pumping = False
        self._epoch = 0
        self._profile_epoch = 0
        self.evicted = False
        self._recompute_reservations()

    # ----------------------------------------------------------------- public API

    @property
    def profile(self) -> Profile:
        """The profile whose limits this controller applies now."""
        return self._current().applied_profile

    async def acquire(self, request: AdmissionRequest) -> Lease:
        """Admit the request now, queue it fairly, or raise `AdmissionRejected` with a reason."""
        if request.workspace_id != self.workspace_id:
            raise ValueError("request.workspace_id does not match this controller's workspace")
        if self.evicted:
            owner = self._registry.adopt(self)
            if owner is not self:
                return await owner.acquire(request)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._bind_loop(loop)
        now = self._clock.monotonic_ms()
        ticket = _Ticket(request, now)
        reason = self._preflight(ticket, now)
        if reason is not None:
            raise self._rejection(ticket, reason, now)
        lane = self._lanes.get((request.provider_id, request.principal_id))
        if lane is None or not lane.waiters:
            defer = self._dispatch_check(ticket, now)
            if defer is None:
                return self._admit(ticket, now)
        else:
            defer = None
        if self._queue_full(ticket):
            raise self._rejection(ticket, "queue-full", now)
        future = self._enqueue(ticket, loop, now, defer)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                # Admitted just as the caller gave up: the permit goes back at once.
                future.result().release(success=None)
            elif ticket.lane is not None:
                self._remove(ticket)
                self._pump()
            raise

    def snapshot(self, principal_id: str) -> QueueSnapshot:
        """The principal's active permits and all of its waiting requests."""
        owner = self._current()
        if owner is not self:
            return owner.snapshot(principal_id)
        scope = self._principals.get(principal_id)
        if scope is None:
            return QueueSnapshot(active=0, queued=0)
        return QueueSnapshot(active=scope.active, queued=scope.queued)

    def release_budget(self, budget_id: str) -> None:
        """Forget exactly this invocation's budgets (attempts, cost, tokens, repeat count)."""
        owner = self._current()
        if owner is not self:
            owner.release_budget(budget_id)
            return
        scopes = self._budget_scopes.pop(budget_id, None)
        if not scopes:
            return
        crowded = len(self._principals) > self._registry.max_idle_scopes
        for scope in scopes:
            scope.budgets.pop(budget_id, None)
            scope.repeats.pop(budget_id, None)
            if crowded and scope.kind == "principal" and not scope.active and not scope.queued:
                self._note_idle_principal(scope.key)
        if self._registry.evicts_idle:
            self._registry.note_idle(self)

    def coordinate_retry_after(self, provider_id: str, ms: float) -> None:
        """Pause this provider lane for `ms` milliseconds (starts or extends, never shortens)."""
        if not valid_amount(ms):
            raise ValueError("retry-after milliseconds must be a finite non-negative number")
        owner = self._current()
        if owner is not self:
            owner.coordinate_retry_after(provider_id, ms)
            return
        scope = self._provider_scope(provider_id)
        if scope is None or not scope.configured:
            raise ValueError("provider is not configured in the current profile")
        now = self._clock.monotonic_ms()
        self._pause(scope, now, float(ms))

    def breaker_transitions(self) -> list[BreakerTransition]:
        """The bounded history of breaker transitions in this workspace, oldest first."""
        owner = self._current()
        if owner is not self:
            return owner.breaker_transitions()
        return list(self._transitions)

    def live_figures(self) -> dict[str, Any]:
        """This workspace now, for operators' views: active and queued calls of the workspace
        and of each provider of the current profile, breaker state, consecutive failures,
        pause and time until an open breaker lets probes through (ms), leases, waiters and the
        number of principals named. Carries no principal id."""
        owner = self._current()
        if owner is not self:
            return owner.live_figures()
        now = self._clock.monotonic_ms()
        providers: dict[str, dict[str, Any]] = {}
        for provider_id in self._profile.providers:
            entry: dict[str, Any] = {"a": 0, "q": 0, "breaker": "closed", "failures": 0}
            scope = self._providers.get(provider_id)
            if scope is not None:
                entry["a"] = scope.active
                entry["q"] = scope.queued
                entry["pause"] = max(0.0, scope.pause_until_ms - now)
                breaker = scope.breaker
                if breaker is not None:
                    entry["breaker"] = breaker.state
                    entry["failures"] = breaker.failures
                    config = scope.breaker_config
                    if breaker.state == "open" and config is not None:
                        entry["reopen"] = max(0.0, breaker.opened_ms + config.open_ms - now)
            providers[provider_id] = entry
        return {
            "workspace": {"a": self._workspace.active, "q": self._workspace.queued},
            "providers": providers,
            "principals": len(self._profile.principals),
            "leases": self._leases,
            "waiters": self._waiting,
        }

    # ------------------------------------------------------------ registry hooks
    # (`hosting.HostedController`: how the registry manages this controller)

    @property
    def applied_profile(self) -> Profile:
        return self._profile

    def _current(self) -> AdmissionController:
        return self._registry.adopt(self) if self.evicted else self

    def apply_profile(self, profile: Profile) -> None:
        """Switch to a newly current profile and revalidate every queued request against it."""
        now = self._clock.monotonic_ms()
        self._profile = profile
        self._profile_epoch += 1
        self._workspace.apply(profile.workspace, now)
        for principal_id, scope in self._principals.items():
            limits = profile.principals.get(principal_id)
            if limits is not None:
                scope.apply(limits, now)
            else:
                scope.configured = False
        for provider_id, scope in self._providers.items():
            limits = profile.providers.get(provider_id)
            if limits is not None:
                scope.apply(limits, now)
            else:
                scope.configured = False
        self._recompute_reservations()
        for lane in self._lanes.values():
            for ticket in lane.waiters:
                self._arm_expiry(ticket)
            self._make_ready(lane)
        self._pump()

    def is_busy(self) -> bool:
        return bool(self._leases or self._waiting)

    def is_idle(self, now: float) -> bool:
        if self._leases or self._waiting or self._budget_scopes:
            return False
        scopes = [self._workspace, *self._principals.values(), *self._providers.values()]
        return all(scope.is_idle(now) for scope in scopes)

    # ---------------------------------------------------------------- scopes

    def _principal_scope(self, principal_id: str) -> Scope | None:
        scope = self._principals.get(principal_id)
        if scope is not None:
            return scope
        limits = self._profile.principals.get(principal_id)
        if limits is None:
            return None
        scope = Scope("principal", principal_id, limits, self._clock.monotonic_ms())
        self._principals[principal_id] = scope
        return scope

    def _provider_scope(self, provider_id: str) -> Scope | None:
        scope = self._providers.get(provider_id)
        if scope is not None:
            return scope
        limits = self._profile.providers.get(provider_id)
        if limits is None:
            return None
        scope = Scope("provider", provider_id, limits, self._clock.monotonic_ms())
        scope.unused_reserved = self._reserved_total()
        self._providers[provider_id] = scope
        return scope

    def _reserved_total(self) -> int:
        return sum(limits.reserved_concurrency or 0 for limits in self._profile.principals.values())

    def _recompute_reservations(self) -> None:
        reservations = {
            pid: limits.reserved_concurrency
            for pid, limits in self._profile.principals.items()
            if limits.reserved_concurrency
        }
        unused = 0
        for pid, reserved in reservations.items():
            scope = self._principals.get(pid)
            unused += max(0, reserved - (scope.active if scope is not None else 0))
        self._workspace.unused_reserved = unused
        for provider in self._providers.values():
            unused = 0
            for pid, reserved in reservations.items():
                pair = provider.pairs.get(pid)
                unused += max(0, reserved - (pair.active if pair is not None else 0))
            provider.unused_reserved = unused

    # --------------------------------------------------------------- checks

    def _preflight(self, ticket: _Ticket, now: float) -> str | None:
        """The preflight checks, in their documented order. Returns a rejection reason or None."""
        request = ticket.request
        signal = request.signal
        if signal is not None and signal.cancelled:
            return "cancelled"
        principal = self._principals.get(request.principal_id)
        if principal is None:
            principal = self._principal_scope(request.principal_id)
        if principal is None or not principal.configured:
            return "unconfigured-principal"
        provider = self._providers.get(request.provider_id)
        if provider is None:
            provider = self._provider_scope(request.provider_id)
        if provider is None or not provider.configured:
            return "unconfigured-provider"
        ticket.principal_scope = principal
        ticket.provider_scope = provider
        if ticket.pair is None:
            ticket.pair = provider.pair(request.principal_id)
        deadline = request.deadline_ms
        if deadline is not None and deadline <= now + TIME_EPSILON_MS:
            return "deadline-exceeded"
        if ticket.invalid:
            return "invalid-estimate"
        pair = ticket.pair
        if pair.gate_epoch != self._profile_epoch:
            pair.gate = compile_gate((principal.limits, self._workspace.limits, provider.limits))
            pair.gate_epoch = self._profile_epoch
        if gate_fails(ticket, pair.gate):
            limits = (principal.limits, self._workspace.limits, provider.limits)
            reason = static_reason(ticket, limits)
            if reason is not None:
                return reason
        budget_id = request.budget_id
        for scope in (principal, self._workspace, provider):
            if scope.has_budgets:
                used = scope.budgets.get(budget_id)
                if used is None:
                    reason = budget_reason(ticket, scope.limits, 0, 0.0, 0)
                else:
                    reason = budget_reason(
                        ticket, scope.limits, used.attempts, used.cost, used.tokens
                    )
                if reason is not None:
                    return reason
        return None

    def _dispatch_check(self, ticket: _Ticket, now: float) -> tuple[Any, ...] | None:
        """The dispatch checks for a request that passed preflight: None to admit, else a deferral.

        A deferral is (reason, parked-set or None, wake-at ms or None, bucket to hold or None).
        Nothing is consumed here.
        """
        principal, provider, pair = ticket.principal_scope, ticket.provider_scope, ticket.pair
        workspace = self._workspace
        assert principal is not None and provider is not None and pair is not None
        if principal.active >= principal.limits.concurrency:
            return ("concurrency", principal.parked, None, None)
        if workspace.active >= workspace.limits.concurrency:
            return ("concurrency", workspace.parked, None, None)
        if provider.active >= provider.limits.concurrency:
            return ("concurrency", provider.parked, None, None)
        share = workspace.limits.max_principal_share
        if share is not None and principal.active >= max(
            1, math.floor(share * workspace.limits.concurrency)
        ):
            return ("concurrency", principal.parked, None, None)
        share = provider.limits.max_principal_share
        if share is not None and pair.active >= max(
            1, math.floor(share * provider.limits.concurrency)
        ):
            return ("concurrency", pair.parked, None, None)
        reserved = principal.reserved
        if (
            workspace.unused_reserved
            and principal.active >= reserved
            and workspace.limits.concurrency - workspace.active - workspace.unused_reserved < 1
        ):
            return ("concurrency", workspace.parked, None, None)
        if (
            provider.unused_reserved
            and pair.active >= reserved
            and provider.limits.concurrency - provider.active - provider.unused_reserved < 1
        ):
            return ("concurrency", provider.parked, None, None)
        if provider.pause_until_ms > now + TIME_EPSILON_MS:
            return ("retry-after", None, provider.pause_until_ms, None)
        breaker = provider.breaker
        config = provider.breaker_config
        if breaker is not None and config is not None and breaker.state != "closed":
            if breaker.state == "open":
                reopen_at = breaker.opened_ms + config.open_ms
                if now + TIME_EPSILON_MS < reopen_at:
                    return ("circuit-open", None, reopen_at, None)
                transition = self._transition(provider, "half-open", now)
                if ticket.transitions is None:
                    ticket.transitions = []
                ticket.transitions.append(transition)
            if breaker.probes >= config.half_open_max_calls:
                return ("circuit-open", provider.parked, None, None)
        scopes = (principal, workspace, provider)
        for scope in scopes:
            bucket = scope.req_bucket
            # A full-enough bucket (the usual case) is judged without the waiting arithmetic.
            if bucket is not None and bucket.refill(now) < 1.0 - EPSILON:
                return ("requests-per-minute", None, now + bucket.ms_until(1.0, now), None)
        tokens = ticket.tokens or 0
        for scope in scopes:
            bucket = scope.tok_bucket
            if bucket is None:
                continue
            holder = bucket.holder
            needed = tokens
            if holder is not None and holder is not ticket:
                needed += holder.tokens or 0  # type: ignore[attr-defined]
            if bucket.refill(now) < needed - EPSILON:
                wait = bucket.ms_until(needed, now)
                wake = now + wait if wait != math.inf else None
                return ("tokens-per-second", bucket.parked, wake, bucket)
        return None

    def _queue_full(self, ticket: _Ticket) -> bool:
        principal, provider, pair = ticket.principal_scope, ticket.provider_scope, ticket.pair
        workspace = self._workspace
        assert principal is not None and provider is not None and pair is not None
        for scope in (principal, workspace, provider):
            bound = scope.limits.max_queue_length
            if bound is not None and scope.queued >= bound:
                return True
        for pool, mine in ((workspace, principal.queued), (provider, pair.queued)):
            share = pool.limits.max_principal_share
            bound = pool.limits.max_queue_length
            if (
                share is not None
                and bound is not None
                and mine >= max(1, math.floor(share * bound))
            ):
                return True
        return False

    # ------------------------------------------------------------ decisions

    def _evidence(
        self, ticket: _Ticket, decision: str, reason: str, now: float
    ) -> AdmissionEvidence:
        principal, provider = ticket.principal_scope, ticket.provider_scope
        breaker = provider.breaker if provider is not None else None
        # Positional: this runs for every decision.
        return AdmissionEvidence(
            decision,
            reason,
            now - ticket.arrived_ms,
            principal.active if principal is not None else 0,
            principal.queued if principal is not None else 0,
            ticket.tokens,
            ticket.cost,
            self._retry_pressure(provider, now)
            if provider is not None and provider.pressure
            else 0,
            breaker.state if breaker is not None else "closed",
            None,
            ticket.transitions or [],
        )

    def _rejection(self, ticket: _Ticket, reason: str, now: float) -> AdmissionRejected:
        evidence = self._evidence(ticket, "reject", reason, now)
        hint = self._retry_hint(ticket, now) if reason in HINTED_REASONS else None
        self._release_holds(ticket)
        return rejected(self._registry, ticket, reason, evidence, hint)

    def _retry_hint(self, ticket: _Ticket, now: float) -> float:
        """The shared retry hint, based on the provider's Retry-After pause or open breaker."""
        in_the_way = 0.0
        provider = ticket.provider_scope
        if provider is not None:
            in_the_way = max(in_the_way, provider.pause_until_ms - now)
            breaker, config = provider.breaker, provider.breaker_config
            if breaker is not None and config is not None and breaker.state == "open":
                in_the_way = max(in_the_way, breaker.opened_ms + config.open_ms - now)
        return retry_hint(in_the_way, self._dwell_limit(ticket), self._registry.rng)

    def _admit(self, ticket: _Ticket, now: float) -> Lease:
        principal, provider, pair = ticket.principal_scope, ticket.provider_scope, ticket.pair
        workspace = self._workspace
        assert principal is not None and provider is not None and pair is not None
        request = ticket.request
        reserved = principal.reserved
        if reserved:
            if principal.active < reserved:
                workspace.unused_reserved -= 1
            if pair.active < reserved:
                provider.unused_reserved -= 1
        principal.active += 1
        workspace.active += 1
        provider.active += 1
        pair.active += 1
        self._leases += 1
        self._served += 1
        pair.served = self._served
        budget_id = request.budget_id
        tokens = ticket.tokens or 0
        owners = self._budget_scopes.get(budget_id)
        if owners is None:
            owners = self._budget_scopes[budget_id] = []
        for scope in (principal, workspace, provider):
            if scope.has_budgets:
                used = scope.budgets.get(budget_id)
                if used is None:
                    used = scope.budgets[budget_id] = Budget()
                    owners.append(scope)
                used.attempts += ticket.attempts
                if ticket.cost is not None:
                    used.cost += ticket.cost
                used.tokens += tokens
            bucket = scope.req_bucket
            if bucket is not None:
                bucket.level -= 1.0
            bucket = scope.tok_bucket
            if bucket is not None and tokens:
                bucket.level -= tokens
        repeats = provider.repeats.get(budget_id)
        if repeats is None:
            if provider not in owners:
                owners.append(provider)
            provider.repeats[budget_id] = 1
        else:
            provider.repeats[budget_id] = repeats + 1
            self._pressure_event(provider, now)
        if ticket.holds:
            self._release_holds(ticket)
        breaker = provider.breaker
        probe = False
        generation = 0
        if breaker is not None:
            generation = breaker.generation
            if breaker.state == "half-open" and provider.breaker_config is not None:
                breaker.probes += 1
                probe = True
        evidence = self._evidence(ticket, "admit", "admitted", now)
        if self._registry.reports_decisions:
            self._registry.report_decision("admit", "admitted", request, evidence)
        return Lease(self, ticket, evidence, generation, probe)

    def _release(self, lease: Lease, outcome: ReleaseOutcome) -> None:
        success, retry_after_ms = outcome.success, outcome.retry_after_ms
        actual_tokens, actual_cost_usd = outcome.actual_tokens, outcome.actual_cost_usd
        principal, provider, pair = lease._scopes
        workspace = self._workspace
        assert principal is not None and provider is not None and pair is not None
        principal.active -= 1
        workspace.active -= 1
        provider.active -= 1
        pair.active -= 1
        self._leases -= 1
        reserved = principal.reserved
        if reserved:
            if principal.active < reserved:
                workspace.unused_reserved += 1
            if pair.active < reserved:
                provider.unused_reserved += 1
        now = self._clock.monotonic_ms()
        if actual_tokens is not None or actual_cost_usd is not None:
            self._reconcile(lease, principal, provider, actual_tokens, actual_cost_usd)
        breaker = provider.breaker
        closed_now = False
        if breaker is not None and lease._probe and lease._generation == breaker.generation:
            breaker.probes -= 1
        if retry_after_ms is not None:
            self._pause(provider, now, retry_after_ms)
        elif (
            success is not None
            and breaker is not None
            and provider.breaker_config is not None
            and lease._generation == breaker.generation
        ):
            closed_now = self._breaker_outcome(provider, lease, success, now)
        if principal.parked:
            self._wake_one(principal.parked)
        if pair.parked:
            self._wake_one(pair.parked)
        if workspace.parked:
            self._wake_one(workspace.parked)
        if provider.parked:
            if closed_now:
                self._wake_all(provider.parked)
            else:
                self._wake_one(provider.parked)
        if self._ready:
            self._pump()
        # Idleness only matters once there are more scopes than may idle.
        limit = self._registry.max_idle_scopes
        if not principal.active and not principal.queued and len(self._principals) > limit:
            self._note_idle_principal(principal.key)
        if not self._leases and not self._waiting and self._registry.evicts_idle:
            self._registry.note_idle(self)

    def _reconcile(
        self,
        lease: Lease,
        principal: Scope,
        provider: Scope,
        actual_tokens: int | None,
        actual_cost_usd: float | None,
    ) -> None:
        for scope in (principal, self._workspace, provider):
            used = scope.budgets.get(lease.budget_id)
            if used is None:
                continue
            if actual_tokens is not None:
                used.tokens = max(0, used.tokens + int(actual_tokens) - (lease._tokens or 0))
            if actual_cost_usd is not None:
                used.cost = max(0.0, used.cost + float(actual_cost_usd) - (lease._cost or 0.0))
        # A second reconcile on the same lease must not subtract the estimate twice.
        if actual_tokens is not None:
            lease._tokens = int(actual_tokens)
        if actual_cost_usd is not None:
            lease._cost = float(actual_cost_usd)

    def _breaker_outcome(self, provider: Scope, lease: Lease, success: bool, now: float) -> bool:
        breaker, config = provider.breaker, provider.breaker_config
        assert breaker is not None and config is not None
        if success:
            breaker.failures = 0
            if breaker.state == "half-open":
                lease.evidence.breaker_transitions.append(self._transition(provider, "closed", now))
                return True
            return False
        if breaker.state == "half-open":
            breaker.failures += 1
            lease.evidence.breaker_transitions.append(self._transition(provider, "open", now))
        elif breaker.state == "closed":
            breaker.failures += 1
            if breaker.failures >= config.failure_threshold:
                lease.evidence.breaker_transitions.append(self._transition(provider, "open", now))
        return False

    def _transition(self, provider: Scope, to_state: str, now: float) -> BreakerTransition:
        breaker = provider.breaker
        assert breaker is not None
        from_state = breaker.state
        breaker.state = to_state
        if to_state == "open":
            breaker.generation += 1
            breaker.opened_ms = now
            breaker.probes = 0
        elif to_state == "closed":
            breaker.failures = 0
            breaker.probes = 0
        transition = BreakerTransition(
            provider_id=provider.key,
            from_state=from_state,
            to_state=to_state,
            at_epoch_ms=self._clock.epoch_ms(),
            failures=breaker.failures,
        )
        self._transitions.append(transition)
        self._registry.report_breaker_transition(transition)
        return transition

    def _pause(self, provider: Scope, now: float, ms: float) -> None:
        until = now + ms
        if until > provider.pause_until_ms:
            provider.pause_until_ms = until
        self._pressure_event(provider, now)

    @staticmethod
    def _pressure_event(provider: Scope, now: float) -> None:
        events = provider.pressure
        events.append(now)
        if len(events) > RETRY_PRESSURE_CAP:
            events.popleft()

    @staticmethod
    def _retry_pressure(provider: Scope, now: float) -> int:
        events = provider.pressure
        horizon = now - RETRY_PRESSURE_WINDOW_MS
        while events and events[0] <= horizon:
            events.popleft()
        return len(events)

    # ---------------------------------------------------------------- queue

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        drift = abs(loop.time() * 1000.0 - self._clock.monotonic_ms())
        if drift > CLOCK_TOLERANCE_MS:
            raise RuntimeError(
                "the running event loop's clock disagrees with this registry's clock "
                f"by {drift:.0f} ms; one registry has one clock, the clock of its loop"
            )
        previous = self._loop
        if previous is not None and self._waiting:
            if not previous.is_closed():
                raise RuntimeError("this controller has waiters on another running event loop")
            self._drop_waiters()
        if self._pump_handle is not None:
            # A pump scheduled on the previous loop may never run there.
            self._pump_handle.cancel()
            self._pump_handle = None
        self._loop = loop

    def _drop_waiters(self) -> None:
        # Waiters of a closed loop can never be resumed: forget them.
        for lane in list(self._lanes.values()):
            for ticket in list(lane.waiters):
                self._remove(ticket)

    def _dwell_limit(self, ticket: _Ticket) -> float:
        dwell = math.inf
        for scope in (ticket.principal_scope, self._workspace, ticket.provider_scope):
            if scope is not None and scope.limits.max_queue_wait_ms is not None:
                dwell = min(dwell, scope.limits.max_queue_wait_ms)
        return dwell

    def _arm_expiry(self, ticket: _Ticket) -> None:
        deadline = ticket.request.deadline_ms
        dwell_end = ticket.arrived_ms + self._dwell_limit(ticket)
        if deadline is not None and deadline <= dwell_end:
            expire, reason = float(deadline), "deadline-exceeded"
        else:
            expire, reason = dwell_end, "queue-timeout"
        if expire == ticket.expire_ms and ticket.timer is not None:
            return
        if ticket.timer is not None:
            ticket.timer.cancel()
            ticket.timer = None
        ticket.expire_ms, ticket.expire_reason = expire, reason
        if expire != math.inf and self._loop is not None:
            ticket.timer = self._loop.call_at(expire / 1000.0, self._on_expire, ticket)

    def _enqueue(
        self,
        ticket: _Ticket,
        loop: asyncio.AbstractEventLoop,
        now: float,
        defer: tuple[Any, ...] | None,
    ) -> asyncio.Future[Lease]:
        request = ticket.request
        key = (request.provider_id, request.principal_id)
        lane = self._lanes.get(key)
        if lane is None:
            assert ticket.pair is not None
            lane = self._lanes[key] = _Lane(key, self._entry_turn(ticket.pair))
            self._note_turn(lane)
        future: asyncio.Future[Lease] = loop.create_future()
        ticket.future = future
        ticket.lane = lane
        lane.waiters[ticket] = None
        assert ticket.principal_scope is not None and ticket.provider_scope is not None
        assert ticket.pair is not None
        ticket.principal_scope.queued += 1
        self._workspace.queued += 1
        ticket.provider_scope.queued += 1
        ticket.pair.queued += 1
        self._waiting += 1
        self._arm_expiry(ticket)
        if request.signal is not None:
            ticket.unsubscribe = request.signal.add_callback(
                functools.partial(self._on_signal_fired, ticket)
            )
        if defer is not None:
            self._defer(lane, ticket, defer, now)
        return future

    def _dequeue(self, ticket: _Ticket) -> None:
        """Take a waiter out of its lane and out of every count, whatever the outcome."""
        lane = ticket.lane
        assert lane is not None
        del lane.waiters[ticket]
        ticket.lane = None
        assert ticket.principal_scope is not None and ticket.provider_scope is not None
        assert ticket.pair is not None
        ticket.principal_scope.queued -= 1
        self._workspace.queued -= 1
        ticket.provider_scope.queued -= 1
        ticket.pair.queued -= 1
        self._waiting -= 1
        if ticket.timer is not None:
            ticket.timer.cancel()
            ticket.timer = None
        if ticket.unsubscribe is not None:
            ticket.unsubscribe()
            ticket.unsubscribe = None
        if not lane.waiters:
            self._unpark(lane)
            self._ready.discard(lane)
            del self._lanes[lane.key]

    def _remove(self, ticket: _Ticket) -> None:
        """Take a waiter out because it will not be admitted; its lane may have a new head."""
        lane = ticket.lane
        assert lane is not None
        was_head = lane.head() is ticket
        self._dequeue(ticket)
        self._release_holds(ticket)
        if was_head and lane.waiters:
            self._make_ready(lane)
        principal = ticket.principal_scope
        if principal is not None and not principal.active and not principal.queued:
            self._note_idle_principal(principal.key)
        if not self._leases and not self._waiting and self._registry.evicts_idle:
            self._registry.note_idle(self)

    def _reject_waiter(self, ticket: _Ticket, reason: str) -> None:
        future = ticket.future
        self._remove(ticket)
        now = self._clock.monotonic_ms()
        error = self._rejection(ticket, reason, now)
        if future is not None and not future.done():
            future.set_exception(error)

    def _on_expire(self, ticket: _Ticket) -> None:
        ticket.timer = None
        if ticket.lane is None:
            return
        self._reject_waiter(ticket, ticket.expire_reason)
        self._pump()

    def _on_signal_fired(self, ticket: _Ticket, _signal: object) -> None:
        ticket.unsubscribe = None
        if ticket.lane is None:
            return
        self._reject_waiter(ticket, "cancelled")
        self._pump()

    def _release_holds(self, ticket: _Ticket) -> None:
        holds = ticket.holds
        if not holds:
            return
        ticket.holds = None
        for bucket in holds:
            if bucket.holder is ticket:
                bucket.holder = None
                if bucket.parked:
                    self._wake_all(bucket.parked)

    # ------------------------------------------------------- parking and pump

    def _defer(self, lane: _Lane, ticket: _Ticket, defer: tuple[Any, ...], now: float) -> None:
        reason, parked, wake_at, bucket = defer
        if bucket is not None and bucket.holder is None:
            bucket.holder = ticket
            if ticket.holds is None:
                ticket.holds = []
            ticket.holds.append(bucket)
        self._park(lane, parked, wake_at, now)
        if ticket.defer_reason != reason:
            ticket.defer_reason = reason
            if self._registry.reports_decisions:
                self._registry.report_decision("defer", reason, ticket.request, None)

    def _park(
        self, lane: _Lane, parked: Rotation[_Lane] | None, wake_at: float | None, now: float
    ) -> None:
        self._unpark(lane)
        lane.parked_epoch = self._epoch
        if parked is not None:
            parked.add(lane)
            lane.parked_on = parked
        if wake_at is not None and self._loop is not None:
            when = max(wake_at, now + MIN_TIMER_STEP_MS)
            lane.timer = self._loop.call_at(when / 1000.0, self._on_lane_timer, lane)

    def _unpark(self, lane: _Lane) -> None:
        parked = lane.parked_on
        if parked is not None:
            parked.discard(lane)
            lane.parked_on = None
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None

    def _make_ready(self, lane: _Lane, woken_from: Rotation[_Lane] | None = None) -> None:
        self._unpark(lane)
        if lane not in self._ready:
            lane.woken_from = woken_from
            self._ready.add(lane)

    def _parked_this_pass(self, lane: _Lane) -> bool:
        # Nothing has changed yet for a lane that parked during the pump pass now running.
        return self._pumping and lane.parked_epoch >= self._epoch

    def _wake_one(self, parked: Rotation[_Lane]) -> None:
        lane = parked.first(self._parked_this_pass)
        if lane is not None:
            self._make_ready(lane, parked)

    def _wake_all(self, parked: Rotation[_Lane]) -> None:
        for lane in list(parked):
            self._make_ready(lane)

    def _on_lane_timer(self, lane: _Lane) -> None:
        lane.timer = None
        if lane.waiters:
            self._make_ready(lane)
            # Other timers may be due at this same instant: serve all of their lanes by turn.
            if self._pump_handle is None and self._loop is not None:
                self._pump_handle = self._loop.call_soon(self._pump_soon)

    def _pump_soon(self) -> None:
        self._pump_handle = None
        self._pump()

    def _pump(self) -> None:
        """Serve ready lanes by turn, head first, until each is admitted from or parked."""
        if self._pumping:
            return
        loop = self._loop
        if self._waiting and loop is not None and loop.is_closed():
            # A release after the waiters' loop closed: admitting one would leak its permit.
            self._drop_waiters()
        self._pumping = True
        self._epoch += 1
        ready = self._ready
        try:
            while ready:
                lane = ready.take()
                assert lane is not None
                woken_from = lane.woken_from
                lane.woken_from = None
                self._serve(lane, woken_from)
        finally:
            self._pumping = False

    def _serve(self, lane: _Lane, woken_from: Rotation[_Lane] | None) -> None:
        while lane.waiters:
            ticket = lane.head()
            assert ticket is not None
            now = self._clock.monotonic_ms()
            reason = self._preflight(ticket, now)
            if reason is not None:
                self._reject_waiter(ticket, reason)
                continue
            defer = self._dispatch_check(ticket, now)
            if defer is not None:
                self._defer(lane, ticket, defer, now)
                if woken_from:
                    self._wake_one(woken_from)
                return
            future = ticket.future
            self._dequeue(ticket)
            lease = self._admit(ticket, now)
            if future is not None and not future.done():
                future.set_result(lease)
            else:
                lease.release(success=None)
            if lane.waiters:
                # Just served: the lane's next turn comes after every lane served before it.
                lane.turn = 2 * self._served + 1
                self._note_turn(lane)
                self._make_ready(lane)
            return

    # ------------------------------------------------------------- rotation
    # A lane's turn is 2s+1 when its pair was last admitted at stamp s. A lane that starts waiting
    # never ranks below the floor F, the lowest stamp among waiting lanes (one more than the latest
    # stamp when none waits): pairs admitted before F all take turn 2F, first come first served,
    # just ahead of the longest-unserved waiting lane. So forgetting an evicted pair's stamp
    # (which is then below F) cannot change any order.

    def _entry_turn(self, pair: Pair) -> int:
        floor = self._turn_floor()
        served = pair.served
        return 2 * served + 1 if served >= floor else 2 * floor

    def _turn_floor(self) -> int:
        turns, lanes = self._turns, self._lanes
        while turns:
            turn, _, lane = turns[0]
            if lane.turn == turn and lanes.get(lane.key) is lane:
                return turn // 2
            heapq.heappop(turns)  # the lane was served since, or is gone
        return self._served + 1

    def _note_turn(self, lane: _Lane) -> None:
        turns = self._turns
        heapq.heappush(turns, (lane.turn, next(_turn_entries), lane))
        if len(turns) > 2 * len(self._lanes) + TURN_SLACK:
            lanes = self._lanes
            turns[:] = [
                entry
                for entry in turns
                if entry[2].turn == entry[0] and lanes.get(entry[2].key) is entry[2]
            ]
            heapq.heapify(turns)

    # ------------------------------------------------------------- eviction

    def _note_idle_principal(self, principal_id: str) -> None:
        if len(self._principals) <= self._registry.max_idle_scopes:
            return
        idle = self._idle_principals
        idle[principal_id] = None
        idle.move_to_end(principal_id)
        limit = self._registry.max_idle_scopes
        if len(idle) <= limit:
            return
        now = self._clock.monotonic_ms()
        for _ in range(2):
            if len(idle) <= limit:
                return
            candidate, _ = idle.popitem(last=False)
            scope = self._principals.get(candidate)
            if scope is None:
                continue
            if scope.active or scope.queued:
                continue  # busy again; it will be noted idle when it is
            if not scope.is_idle(now) or not self._pairs_idle(candidate):
                # Retry later, once its buckets have refilled and the lanes served before it moved.
                idle[candidate] = None
                continue
            del self._principals[candidate]
            for provider in self._providers.values():
                provider.pairs.pop(candidate, None)

    def _pairs_idle(self, principal_id: str) -> bool:
        floor = self._turn_floor()
        for provider in self._providers.values():
            pair = provider.pairs.get(principal_id)
            if pair is not None and (
                pair.active or pair.queued or pair.parked or pair.served >= floor
            ):
                return False
        return True
