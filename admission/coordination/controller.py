"""A workspace's admission controller whose shared checks are decided in Redis.

It has the public API of `admission.core.AdmissionController`. What needs no shared state stays
local and costs no round trip: the signal, configured principal and provider, the deadline, the
estimate's validity, static bounds and never-fit requests. Everything about capacity the
deployment shares (permits with reservations and share caps, buckets, invocation budgets, the
Retry-After pause, the breaker) is decided by one script call, on Redis time. A request that must
wait is queued in Redis in its lane; the caller's coroutine waits here for the grant that the
process's listener receives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from admission.coordination.protocol import (
    ADMIT,
    GRANT,
    NO_FIGURES,
    RECOVERING,
    REJECT,
    TAKEN,
    Acquire,
    CoordinationUnavailable,
    Decision,
    Figures,
    Install,
    InstallResult,
    LeaseRecord,
    Message,
    Pause,
    Pump,
    Release,
    ReleaseBatch,
    State,
    Take,
    Withdraw,
    Written,
)
from admission.coordination.protocol import QUEUED as QUEUED_STATUS
from admission.coordination.settings import DEGRADED
from admission.coordination.waiters import DONE, LEAVING, PENDING, QUEUED, TAKING, Waiter
from admission.core.errors import AdmissionRejected
from admission.core.evidence import AdmissionEvidence, BreakerTransition, QueueSnapshot
from admission.core.lease import ReleaseOutcome, give_back_checked
from admission.core.limits import Limits, Profile
from admission.core.rejection import HINTED_REASONS, rejected, retry_hint
from admission.core.rules import Gate, compile_gate, gate_fails, static_reason, valid_amount
from admission.core.ticket import Ticket

if TYPE_CHECKING:
    from admission.coordination.link import CoordinationLink
    from admission.core.registry import AdmissionRegistry
    from admission.core.request import AdmissionRequest

logger = logging.getLogger(__name__)

COORDINATION_UNAVAILABLE = "coordination-unavailable"
# The base of the retry hint of a refusal caused by Redis being unreachable.
UNAVAILABLE_RETRY_BASE_MS = 1000.0
TRANSITION_HISTORY = 256
# Revision mismatches resolved by a refresh before the request is refused.
STALE_RETRIES = 2
# Lanes (principal, provider) whose static rules a controller keeps compiled.
LANES_KEPT = 65536


async def _fired(signal: Any) -> None:
    await signal


def limits_record(limits: Limits) -> dict[str, Any]:
    """The compact form of one scope's limits that the scripts read."""
    record: dict[str, Any] = {"c": limits.concurrency}
    for key, value in (
        ("rpm", limits.requests_per_minute),
        ("tps", limits.tokens_per_second),
        ("ma", limits.max_attempts),
        ("mc", limits.max_cost_usd),
        ("mt", limits.max_tokens),
        ("ql", limits.max_queue_length),
        ("qw", limits.max_queue_wait_ms),
        ("sh", limits.max_principal_share),
        ("rc", limits.reserved_concurrency),
    ):
        if value is not None:
            record[key] = value
    breaker = limits.circuit_breaker
    if breaker is not None:
        record["bk"] = {
            "ft": breaker.failure_threshold,
            "om": breaker.open_ms,
            "hm": breaker.half_open_max_calls,
        }
    return record


# The order of a scope's limits in its profile field (lib.lua, LIMIT_FIELDS).
_LIMIT_ORDER = ("c", "rpm", "tps", "ma", "mc", "mt", "ql", "qw", "sh", "rc")


def _number(value: float) -> str:
    return str(value) if type(value) is int else repr(float(value))


def limits_field(limits: Limits) -> str:
    """One scope's limits as the flat field the functions read without decoding JSON: the
    values in `_LIMIT_ORDER`, then the breaker's, comma-separated, '' when absent."""
    record = limits_record(limits)
    values = ["" if record.get(key) is None else _number(record[key]) for key in _LIMIT_ORDER]
    breaker = record.get("bk")
    if breaker is not None:
        values.extend(_number(breaker[key]) for key in ("ft", "om", "hm"))
    while values and not values[-1]:
        values.pop()
    return ",".join(values)


def profile_fields(profile: Profile) -> dict[str, str]:
    """The profile as the fields of its shared hash: one flat field per scope, and `rsv`
    listing the principals with reserved permits as `<len>:<id><permits>;` pairs."""
    fields = {"W": limits_field(profile.workspace)}
    for provider_id, limits in profile.providers.items():
        fields[f"V:{provider_id}"] = limits_field(limits)
    reserved = []
    for principal_id, limits in profile.principals.items():
        fields[f"P:{principal_id}"] = limits_field(limits)
        if limits.reserved_concurrency:
            reserved.append(
                f"{len(principal_id.encode())}:{principal_id}{limits.reserved_concurrency};"
            )
    if reserved:
        fields["rsv"] = "".join(reserved)
    return fields


def divided_profile(profile: Profile, processes: int) -> Profile:
    """The profile with every shared limit split between `processes` processes (degraded mode)."""
    if processes <= 1:
        return profile

    def part(limits: Limits) -> Limits:
        changes: dict[str, Any] = {"concurrency": max(1, limits.concurrency // processes)}
        for name in ("requests_per_minute", "tokens_per_second"):
            value = getattr(limits, name)
            if value is not None:
                changes[name] = value / processes
        if limits.max_queue_length is not None:
            changes["max_queue_length"] = max(1, limits.max_queue_length // processes)
        if limits.reserved_concurrency is not None:
            changes["reserved_concurrency"] = (
                min(changes["concurrency"], limits.reserved_concurrency // processes) or None
            )
        return dataclasses.replace(limits, **changes)

    return Profile(
        profile.workspace_id,
        f"{profile.profile_version}~1/{processes}",
        part(profile.workspace),
        {key: part(value) for key, value in profile.providers.items()},
        {key: part(value) for key, value in profile.principals.items()},
    )


class _Lane:
    """What the profile says of one (principal, provider) pair, worked out once per profile: its
    scopes in the order the static rules judge them, their folded gate and the dwell bound."""

    __slots__ = ("dwell_ms", "gate", "scopes")

    def __init__(self, principal: Limits, workspace: Limits, provider: Limits) -> None:
        self.scopes = (principal, workspace, provider)
        self.gate: Gate = compile_gate(self.scopes)
        bounds = [
            limits.max_queue_wait_ms
            for limits in self.scopes
            if limits.max_queue_wait_ms is not None
        ]
        self.dwell_ms: float | None = min(bounds) if bounds else None


class CoordinatedLease:
    """Permission to dispatch one attempt, held in Redis; `release` gives it back exactly once
    (in the background: the caller never waits on Redis)."""

    __slots__ = (
        "_controller",
        "_released",
        "_signal",
        "budget_id",
        "cost",
        "evidence",
        "id",
        "principal_id",
        "provider_id",
        "tokens",
        "workspace_id",
    )

    def __init__(
        self,
        controller: CoordinatedController,
        lease_id: str,
        ticket: Ticket,
        evidence: AdmissionEvidence,
    ) -> None:
        request = ticket.request
        self._controller = controller
        self._released = False
        self._signal = request.signal
        self.id = lease_id
        self.workspace_id = request.workspace_id
        self.budget_id = request.budget_id
        self.principal_id = request.principal_id
        self.provider_id = request.provider_id
        self.tokens = ticket.tokens
        self.cost = ticket.cost
        self.evidence = evidence

    def record(self) -> LeaseRecord:
        return LeaseRecord(
            self.id, self.principal_id, self.provider_id, self.budget_id, self.tokens, self.cost
        )

    def doubt(self) -> None:
        """This process can no longer vouch for the permit: stop the call it covers."""
        if self._signal is not None and not self._signal.cancelled:
            self._signal.cancel("admission-lease-lost")

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
        """Give the permit back (in the background). Idempotent; `success=None` is "no
        outcome". Malformed optional figures are dropped and then reported with `ValueError`,
        after the permit is on its way back."""
        if self._released:
            return
        self._released = True
        give_back_checked(self._give_back, success, retry_after_ms, actual_tokens, actual_cost_usd)

    def _give_back(self, outcome: ReleaseOutcome) -> None:
        self._controller.give_back(self, outcome)


class CoordinatedController:
    """Admission for one workspace, deployment-wide: see the module docstring."""

    def __init__(
        self, registry: AdmissionRegistry, profile: Profile, coordinator: CoordinationLink
    ) -> None:
        self._registry = registry
        self._clock = registry.clock
        self._coordinator = coordinator
        self.workspace_id = profile.workspace_id
        self._profile = profile
        self._sequence: int | None = None
        self._installed: tuple[str, int] | None = None
        self._transitions: deque[BreakerTransition] = deque(maxlen=TRANSITION_HISTORY)
        self._snapshots: dict[str, QueueSnapshot] = {}
        self._fallback: Any = None
        self.evicted = False
        # Registry bookkeeping (idle eviction) reads these as "anything held here".
        self._leases: dict[str, CoordinatedLease] = {}
        self._waiting: dict[str, Waiter] = {}
        self._writes: set[asyncio.Task[Any]] = set()
        # Leases given back and not yet sent: the next acquire takes them along, or the flush
        # sends them together within two turns of the event loop (see `give_back`).
        self._pending: list[tuple[Release, CoordinatedLease]] = []
        # Invocations this process is done with (budget ids), not yet sent: they travel the same
        # way, after the leases.
        self._forgets: list[str] = []
        self._flush_armed = False
        # (principal, provider) -> its lane's static rules under the current profile.
        self._lanes: dict[tuple[str, str], _Lane] = {}

    # ----------------------------------------------------------------- public API

    @property
    def profile(self) -> Profile:
        return self._profile

    @property
    def sequence(self) -> int | None:
        """The ledger position of the current profile, when the host told it."""
        return self._sequence

    async def acquire(self, request: AdmissionRequest) -> CoordinatedLease | Any:
        """Admit now, queue fairly across the deployment, or raise `AdmissionRejected`."""
        if request.workspace_id != self.workspace_id:
            raise ValueError("request.workspace_id does not match this controller's workspace")
        now = self._clock.monotonic_ms()
        ticket = Ticket(request, now)
        reason = self._preflight(ticket, now)
        if reason is not None:
            self._coordinator.count_local(self.workspace_id, request.provider_id, "reject", reason)
            raise self._rejection(ticket, reason, None, now)
        waiter_id = os.urandom(16).hex()
        waiter = Waiter(self, waiter_id, ticket, asyncio.get_running_loop().create_future())
        book = self._coordinator.book
        book.add_waiter(waiter)
        try:
            decision = await self._decide(ticket, waiter_id)
        except CoordinationUnavailable as error:
            book.drop_waiter(waiter_id)
            return await self._unavailable(ticket, error)
        except BaseException:
            book.drop_waiter(waiter_id)
            raise
        status = decision.status
        if status != QUEUED_STATUS:
            book.drop_waiter(waiter_id)
        # Decided at once: no queue wait, so no queue delay (the round trip to Redis is not one;
        # counted as one, every coordinated request would read as deferred).
        if status == ADMIT:
            return self._lease(waiter_id, ticket, decision.figures, queued=False)
        if status == REJECT:
            raise self._rejection(ticket, str(decision.reason), decision.figures, ticket.arrived_ms)
        return await self._wait(waiter, decision)

    def snapshot(self, principal_id: str) -> QueueSnapshot:
        """The principal's deployment-wide active and queued figures as last seen by this
        process (every decision brings them back); `state()` reads them fresh."""
        return self._snapshots.get(principal_id, QueueSnapshot(active=0, queued=0))

    async def state(self, principal_id: str = "", minutes: int = 0) -> dict[str, Any]:
        """What Redis holds for this workspace now, as stored (tests); operators' views use
        `RedisCoordinator.state_sync`."""
        return await self._coordinator.call(self.workspace_id, State(principal_id, minutes))

    def release_budget(self, budget_id: str) -> None:
        """Forget exactly this invocation's budgets, deployment-wide, in the background: with
        this workspace's next acquire, or with the leases given back meanwhile (see
        `give_back`). This process's next acquire sees it forgotten; another process's, one
        round trip after that."""
        self._forgets.append(budget_id)
        self._arm_flush()
        if self._fallback is not None:
            self._fallback.release_budget(budget_id)

    def coordinate_retry_after(self, provider_id: str, ms: float) -> None:
        """Pause this provider lane for every process: starts or extends, never shortens."""
        if not valid_amount(ms):
            raise ValueError("retry-after milliseconds must be a finite non-negative number")
        if provider_id not in self._profile.providers:
            raise ValueError("provider is not configured in the current profile")
        self._coordinator.background(self._pause(provider_id, float(ms)))

    def breaker_transitions(self) -> list[BreakerTransition]:
        """Breaker transitions this process caused or saw, oldest first (bounded)."""
        return list(self._transitions)

    # ------------------------------------------------------------ registry hooks

    def _current(self) -> CoordinatedController:
        return self

    @property
    def applied_profile(self) -> Profile:
        return self._profile

    def apply_profile(self, profile: Profile) -> None:
        """A newer profile is current here: queued work of this process is judged again."""
        self._profile = profile
        self._sequence = None
        self._lanes = {}
        if self._fallback is not None:
            self._fallback = None
        for waiter in list(self._waiting.values()):
            now = self._clock.monotonic_ms()
            reason = self._preflight(waiter.ticket, now)
            if reason is not None:
                self._leave(waiter, reason)

    def _note_sequence(self, sequence: int) -> None:
        """The host says where the current profile stands in its ledger; install it once."""
        self._sequence = sequence
        key = (self._profile.profile_version, sequence)
        if self._installed == key:
            return
        try:
            self._install_sync()
        except CoordinationUnavailable as error:
            # Installed later, by the first decision that finds Redis behind.
            logger.warning("could not install profile %s in Redis: %s", key, error)

    def is_busy(self) -> bool:
        return bool(self._leases or self._waiting or self._pending or self._forgets)

    def is_idle(self, now: float) -> bool:
        return not self._leases and not self._waiting and not self._pending and not self._forgets

    # ---------------------------------------------------------------- preflight

    def _preflight(self, ticket: Ticket, now: float) -> str | None:
        request = ticket.request
        signal = request.signal
        if signal is not None and signal.cancelled:
            return "cancelled"
        lane = self._lanes.get((request.principal_id, request.provider_id))
        if lane is None:
            profile = self._profile
            principal = profile.principals.get(request.principal_id)
            if principal is None:
                return "unconfigured-principal"
            provider = profile.providers.get(request.provider_id)
            if provider is None:
                return "unconfigured-provider"
            if len(self._lanes) >= LANES_KEPT:
                self._lanes = {}
            lane = _Lane(principal, profile.workspace, provider)
            self._lanes[(request.principal_id, request.provider_id)] = lane
        deadline = request.deadline_ms
        if deadline is not None and deadline <= now:
            return "deadline-exceeded"
        if ticket.invalid:
            return "invalid-estimate"
        # The folded gate passes what every static rule passes; only a request it stops is
        # judged rule by rule, for the reason.
        if gate_fails(ticket, lane.gate):
            return static_reason(ticket, lane.scopes)
        return None

    def _dwell_ms(self, request: AdmissionRequest) -> float | None:
        lane = self._lanes.get((request.principal_id, request.provider_id))
        if lane is not None:
            return lane.dwell_ms
        profile = self._profile
        bounds = [
            limits.max_queue_wait_ms
            for limits in (
                profile.principals.get(request.principal_id),
                profile.workspace,
                profile.providers.get(request.provider_id),
            )
            if limits is not None and limits.max_queue_wait_ms is not None
        ]
        return min(bounds) if bounds else None

    # ------------------------------------------------------------------ decide

    def _install_call(self) -> Install:
        profile = self._profile
        assert self._sequence is not None
        return Install(
            profile.profile_version,
            self._sequence,
            profile.profile_digest,
            profile_fields(profile),
        )

    def _install_sync(self) -> None:
        result = self._coordinator.call_sync(self.workspace_id, self._install_call())
        self._after_install(result)

    async def _install(self) -> None:
        result = await self._coordinator.call(self.workspace_id, self._install_call())
        self._after_install(result)

    def _after_install(self, result: InstallResult) -> None:
        status = result.status
        if status in ("installed", "same"):
            assert self._sequence is not None
            self._installed = (self._profile.profile_version, self._sequence)
        elif status == "conflict":
            logger.error(
                "Redis holds revision %s at ledger position %s, not %s: refusing to overwrite",
                result.revision,
                result.sequence,
                self._profile.profile_version,
            )

    async def _decide(self, ticket: Ticket, waiter_id: str, *, guarded: bool = True) -> Decision:
        """One acquire call, after making sure Redis holds this process's revision. Guarded, a
        call whose answer is lost is withdrawn once Redis answers; a waiter queued again repeats
        its call with the same id instead (and withdraws it if it leaves). Leases this process
        gave back and has not sent yet go back first, in the same call."""
        request = ticket.request
        stale = 0
        releases = self._take_pending()
        forgets = self._take_forgets()
        while True:
            deadline = request.deadline_ms
            if deadline is not None:
                deadline = max(0.0, deadline - self._clock.monotonic_ms())
            dwell = self._dwell_ms(request)
            result = await self._call_guarded(
                waiter_id,
                guarded,
                Acquire(
                    self._profile.profile_version,
                    waiter_id,
                    request.principal_id,
                    request.provider_id,
                    request.budget_id,
                    ticket.tokens,
                    ticket.cost,
                    ticket.attempts,
                    None if dwell is None else float(dwell),
                    deadline,
                    self._coordinator.is_registered(self.workspace_id),
                    # Guarded calls send a new id; a requeue repeats one (Redis deduplicates).
                    guarded,
                    tuple(release for release, _ in releases),
                    forgets,
                ),
                releases,
                forgets,
            )
            if releases:
                self._released(releases, result.released)
                releases = []
            forgets = ()
            status = result.status
            if status in (ADMIT, QUEUED_STATUS):
                self._coordinator.note_registered(self.workspace_id)
            if status in (ADMIT, REJECT, QUEUED_STATUS):
                if result.counted:
                    self._count(request.provider_id, result)
                return result
            if status == RECOVERING:
                await self._pause_for(ticket, result.wait_ms)
                continue
            # "noprofile" or "stale": bring the revisions into line, then decide again.
            stale += 1
            if stale > STALE_RETRIES:
                raise CoordinationUnavailable(
                    f"the shared revision of {self.workspace_id!r} does not match this "
                    f"process's ({self._profile.profile_version!r}) after a refresh"
                )
            theirs = result.sequence
            if self._sequence is not None and (theirs is None or theirs < self._sequence):
                await self._install()
            else:
                await self._coordinator.refresh(self.workspace_id)
                if self._sequence is not None and self._installed != (
                    self._profile.profile_version,
                    self._sequence,
                ):
                    await self._install()

    def _count(self, provider_id: str, decision: Decision) -> None:
        """Decisions are counted here and reported with the heartbeat (they cost Redis
        nothing); an instant admission adds to the queue-delay histogram's first bucket."""
        count = self._coordinator.count_local
        status = decision.status
        if status == ADMIT:
            count(self.workspace_id, provider_id, "admit", "admitted")
            count(self.workspace_id, provider_id, "delay", "0")
        elif status == REJECT:
            count(self.workspace_id, provider_id, "reject", str(decision.reason))
        elif decision.reason:
            count(self.workspace_id, provider_id, "defer", decision.reason)

    async def _call_guarded(
        self,
        waiter_id: str,
        guarded: bool,
        acquire: Acquire,
        releases: list[tuple[Release, CoordinatedLease]],
        forgets: tuple[str, ...],
    ) -> Decision:
        """A call that may admit or queue: if the caller is cancelled (or the call times out)
        while it is in flight, whatever it took is handed back once Redis answers, and the
        leases and invocations it carried are sent again (a lease already back is "gone", an
        invocation forgotten twice is forgotten)."""
        try:
            return await self._coordinator.call(self.workspace_id, acquire)
        except asyncio.CancelledError:
            self._resend(releases, forgets)
            self._coordinator.background(self._withdraw_eventually(waiter_id, "cancelled"))
            raise
        except CoordinationUnavailable:
            self._resend(releases, forgets)
            if guarded:
                # It may have run, or may still run (a stalled Redis runs what it was sent
                # when it resumes): withdraw it once Redis answers; a late copy takes nothing.
                self._coordinator.background(self._withdraw_eventually(waiter_id, "cancelled"))
            raise

    async def _withdraw_eventually(self, waiter_id: str, reason: str) -> None:
        await self._coordinator.write(self.workspace_id, Withdraw(waiter_id, reason))

    async def _pause_for(self, ticket: Ticket, wait_ms: float) -> None:
        """Wait while the shared state recovers, but not past the request's deadline or signal."""
        request = ticket.request
        wait_s = max(wait_ms, 1.0) / 1000.0
        if request.deadline_ms is not None:
            left = (request.deadline_ms - self._clock.monotonic_ms()) / 1000.0
            if left <= 0:
                raise self._rejection(ticket, "deadline-exceeded", None, self._clock.monotonic_ms())
            wait_s = min(wait_s, left)
        if request.signal is not None:
            try:
                await asyncio.wait_for(_fired(request.signal), timeout=wait_s)
            except TimeoutError:
                return
            raise self._rejection(ticket, "cancelled", None, self._clock.monotonic_ms())
        await asyncio.sleep(wait_s)

    async def _unavailable(self, ticket: Ticket, error: CoordinationUnavailable) -> Any:
        request = ticket.request
        coordinator = self._coordinator
        if coordinator.settings.on_failure == DEGRADED:
            fallback = self._fallback_controller()
            logger.warning("admission Redis unavailable (%s): degraded local admission", error)
            return await fallback.acquire(request)
        logger.warning("admission Redis unavailable: %s", error)
        coordinator.count_local(
            self.workspace_id, request.provider_id, "reject", COORDINATION_UNAVAILABLE
        )
        raise self._rejection(
            ticket,
            COORDINATION_UNAVAILABLE,
            None,
            self._clock.monotonic_ms(),
            in_the_way_ms=UNAVAILABLE_RETRY_BASE_MS,
        )

    def _fallback_controller(self) -> Any:
        """A local controller under each limit divided by the live processes last seen."""
        from admission.core.registry import AdmissionRegistry

        processes = (
            self._coordinator.live_processes or self._coordinator.settings.expected_processes
        )
        wanted = divided_profile(self._profile, processes)
        fallback = self._fallback
        if fallback is None or fallback.profile.profile_version != wanted.profile_version:
            registry = AdmissionRegistry(clock=self._clock, rng=self._registry.rng)
            fallback = self._fallback = registry.register(wanted)
        return fallback

    # -------------------------------------------------------------- decisions

    def _evidence(
        self, ticket: Ticket, decision: str, reason: str, figures: Figures | None, now: float
    ) -> AdmissionEvidence:
        if figures is None:
            figures = NO_FIGURES
        transitions = self._note_transitions(figures.transitions)
        if figures.known:
            self._snapshots[ticket.request.principal_id] = QueueSnapshot(
                figures.active, figures.queued
            )
        return AdmissionEvidence(
            decision,
            reason,
            now - ticket.arrived_ms,
            figures.active,
            figures.queued,
            ticket.tokens,
            ticket.cost,
            figures.retry_pressure,
            figures.breaker_state,
            None,
            transitions,
        )

    def _note_transitions(self, transitions: list[BreakerTransition]) -> list[BreakerTransition]:
        if not transitions:
            return []
        for transition in transitions:
            self._transitions.append(transition)
            self._registry.report_breaker_transition(transition)
        return list(transitions)

    def _lease(
        self, lease_id: str, ticket: Ticket, figures: Figures, *, queued: bool = True
    ) -> CoordinatedLease:
        now = self._clock.monotonic_ms() if queued else ticket.arrived_ms
        evidence = self._evidence(ticket, "admit", "admitted", figures, now)
        lease = CoordinatedLease(self, lease_id, ticket, evidence)
        self._leases[lease_id] = lease
        self._coordinator.book.add_lease(lease)
        if self._registry.reports_decisions:
            self._registry.report_decision("admit", "admitted", ticket.request, evidence)
        return lease

    def _rejection(
        self,
        ticket: Ticket,
        reason: str,
        figures: Figures | None,
        now: float,
        *,
        in_the_way_ms: float | None = None,
    ) -> AdmissionRejected:
        evidence = self._evidence(ticket, "reject", reason, figures, now)
        hint = None
        if reason in HINTED_REASONS or reason == COORDINATION_UNAVAILABLE:
            if in_the_way_ms is None:
                in_the_way_ms = figures.in_the_way_ms if figures is not None else 0.0
            hint = retry_hint(in_the_way_ms, self._dwell_ms(ticket.request), self._registry.rng)
        return rejected(self._registry, ticket, reason, evidence, hint)

    # ------------------------------------------------------------------ waiting

    async def _wait(self, waiter: Waiter, decision: Decision) -> CoordinatedLease:
        loop = asyncio.get_running_loop()
        request = waiter.ticket.request
        future = waiter.future
        waiter.state = QUEUED
        waiter.queued_at = time.monotonic()
        self._waiting[waiter.id] = waiter
        self._snapshots[request.principal_id] = QueueSnapshot(
            decision.figures.active, decision.figures.queued + 1
        )
        reason = decision.reason
        if reason and self._registry.reports_decisions:
            self._registry.report_decision("defer", reason, request, None)
        self._coordinator.listen(self.workspace_id)
        self._arm_expiry(waiter, loop)
        if request.signal is not None:
            if request.signal.cancelled:
                self._leave(waiter, "cancelled")
            else:
                waiter.unsubscribe = request.signal.add_callback(
                    lambda _signal: self._leave(waiter, "cancelled")
                )
        wake = decision.wake_ms
        if wake is not None:
            loop.call_later(max(wake, 1.0) / 1000.0, self._on_wake)
        if waiter.early is not None:
            self.on_message(waiter, waiter.early)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().release(success=None)
            elif waiter.state in (QUEUED, TAKING):
                self._leave(waiter, "cancelled", notify=False)
            raise

    def _arm_expiry(self, waiter: Waiter, loop: asyncio.AbstractEventLoop) -> None:
        request = waiter.ticket.request
        dwell = self._dwell_ms(request)
        dwell_end = waiter.ticket.arrived_ms + dwell if dwell is not None else math.inf
        deadline = request.deadline_ms
        if deadline is not None and deadline <= dwell_end:
            expire, reason = float(deadline), "deadline-exceeded"
        else:
            expire, reason = dwell_end, "queue-timeout"
        if expire != math.inf:
            delay = max(0.0, expire - self._clock.monotonic_ms()) / 1000.0
            waiter.timer = loop.call_later(delay, self._leave, waiter, reason)

    def _on_wake(self) -> None:
        if self._waiting:
            self._coordinator.background(self._pump())

    async def _pump(self) -> None:
        try:
            result = await self._coordinator.call(self.workspace_id, Pump())
        except CoordinationUnavailable:
            return
        wake = result.wake_ms
        if wake is not None and self._waiting:
            asyncio.get_running_loop().call_later(max(wake, 1.0) / 1000.0, self._on_wake)

    def _finish(self, waiter: Waiter) -> None:
        waiter.state = DONE
        self._waiting.pop(waiter.id, None)
        self._coordinator.book.drop_waiter(waiter.id)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        if waiter.unsubscribe is not None:
            waiter.unsubscribe()
            waiter.unsubscribe = None

    def _leave(self, waiter: Waiter, reason: str, *, notify: bool = True) -> None:
        """The waiter gives up (cancelled, deadline, dwell, revalidation): out of its lane in
        Redis, and its caller is refused with `reason`."""
        if waiter.state == TAKING:
            # Decided once the grant is taken (then handed back) or found lapsed.
            if waiter.leaving is None:
                waiter.leaving = (reason, notify)
            return
        if waiter.state != QUEUED:
            return
        waiter.state = LEAVING
        self._coordinator.background(self._withdraw(waiter, reason, notify))

    async def _withdraw(self, waiter: Waiter, reason: str, notify: bool) -> None:
        figures = None
        try:
            written: Written = await self._coordinator.call(
                self.workspace_id, Withdraw(waiter.id, reason)
            )
            figures = written.figures
        except CoordinationUnavailable:
            self._coordinator.background(self._withdraw_eventually(waiter.id, reason))
        self._finish(waiter)
        if notify and not waiter.future.done():
            now = self._clock.monotonic_ms()
            waiter.future.set_exception(self._rejection(waiter.ticket, reason, figures, now))

    def on_message(self, waiter: Waiter, message: Message) -> None:
        """A grant or a refusal for a waiter of this process, from the listener."""
        if waiter.state == PENDING:
            waiter.early = message  # handled once the acquire call's answer is read
            return
        if waiter.state != QUEUED:
            return  # taking it already, or leaving (the withdraw hands a late grant back)
        if message.kind == GRANT:
            # Used only once taken: a grant whose taking is late lapses back to the pool, and
            # then the waiter waits again; it never runs on a permit the pool has back.
            waiter.state = TAKING
            self._coordinator.background(self._take(waiter, message.figures))
            return
        self._finish(waiter)
        now = self._clock.monotonic_ms()
        if not waiter.future.done():
            reason = message.reason or "queue-timeout"
            refusal = self._rejection(waiter.ticket, reason, message.figures, now)
            waiter.future.set_exception(refusal)

    def _granted(self, waiter: Waiter, figures: Figures) -> None:
        self._finish(waiter)
        lease = self._lease(waiter.id, waiter.ticket, figures)
        if waiter.future.done():
            lease.release(success=None)
        else:
            waiter.future.set_result(lease)

    async def _take(self, waiter: Waiter, figures: Figures) -> None:
        written = await self._coordinator.write(self.workspace_id, Take(waiter.id))
        if written is None:
            return  # the process is closing
        taken = written.status == TAKEN
        if waiter.leaving is not None:
            reason, notify = waiter.leaving
            self._finish(waiter)
            if taken:
                self._coordinator.background(self._withdraw_eventually(waiter.id, "cancelled"))
            if notify and not waiter.future.done():
                now = self._clock.monotonic_ms()
                waiter.future.set_exception(self._rejection(waiter.ticket, reason, None, now))
            return
        if taken:
            self._granted(waiter, figures)
            return
        logger.info("grant for waiter %s lapsed before it was taken; queueing again", waiter.id)
        waiter.state = QUEUED
        self.requeue(waiter)

    def requeue(self, waiter: Waiter) -> None:
        """Redis no longer queues this waiter (its state was lost): queue it again, with the
        same deadline and dwell clock."""
        if waiter.state != QUEUED or waiter.requeueing:
            return
        waiter.requeueing = True
        self._coordinator.background(self._requeue(waiter))

    async def _requeue(self, waiter: Waiter) -> None:
        delay = self._coordinator.settings.heartbeat_ms / 1000.0
        tried = False
        try:
            while True:
                if waiter.state != QUEUED:
                    if tried:
                        # An attempt may still land: withdraw it (a late copy takes nothing).
                        self._coordinator.background(
                            self._withdraw_eventually(waiter.id, "cancelled")
                        )
                    return
                tried = True
                try:
                    result = await self._decide(waiter.ticket, waiter.id, guarded=False)
                    break
                except CoordinationUnavailable:
                    await asyncio.sleep(delay)  # until Redis answers or the waiter leaves
                except AdmissionRejected as refusal:
                    if waiter.state == QUEUED:
                        self._finish(waiter)
                        if not waiter.future.done():
                            waiter.future.set_exception(refusal)
                    return
        finally:
            waiter.requeueing = False
        waiter.queued_at = time.monotonic()
        if waiter.state != QUEUED:
            if result.status in (ADMIT, QUEUED_STATUS):
                # It left while being queued again: hand back what the new queueing took.
                self._coordinator.background(self._withdraw_eventually(waiter.id, "cancelled"))
            return
        if result.status == ADMIT:
            # Admitted by this very call (or a grant made meanwhile, which the call took).
            self._granted(waiter, result.figures)
        elif result.status == REJECT:
            self.on_message(waiter, Message.from_decision(waiter.id, result))

    # ------------------------------------------------------------------ writes

    def give_back(self, lease: CoordinatedLease, outcome: ReleaseOutcome) -> None:
        """A lease's permit goes back to the pool, in the background: with the next acquire of
        this workspace if one starts within two turns of the event loop, else in one call with
        the other leases given back meanwhile. Either way it is back in the pool one round trip
        after that (see docs/admission-coordination.md, "What a decision costs")."""
        self._leases.pop(lease.id, None)
        self._coordinator.book.drop_lease(lease.id)
        release = Release(
            lease.id,
            outcome.success,
            outcome.retry_after_ms,
            outcome.actual_tokens,
            outcome.actual_cost_usd,
            lease.principal_id,
            lease.provider_id,
        )
        self._pending.append((release, lease))
        self._arm_flush()

    def _arm_flush(self) -> None:
        if self._flush_armed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush_releases()  # outside the loop: sent as soon as the loop runs
            return
        self._flush_armed = True
        # Two turns: a caller that releases and then yields once (`await asyncio.sleep(0)`)
        # or goes straight on to its next acquire takes its release along.
        loop.call_soon(loop.call_soon, self.flush_releases)

    def _take_pending(self) -> list[tuple[Release, CoordinatedLease]]:
        """The leases given back and not sent yet, taken whole: never the live list, to which a
        lease given back while the call that carries these is in flight would be added."""
        if not self._pending:
            return []
        pending = self._pending
        self._pending = []
        return pending

    def _take_forgets(self) -> tuple[str, ...]:
        if not self._forgets:
            return ()
        forgets = tuple(self._forgets)
        self._forgets = []
        return forgets

    def flush_releases(self) -> None:
        """Send the leases given back and the invocations forgotten and not sent yet, in one
        call (in the background)."""
        self._flush_armed = False
        self._resend(self._take_pending(), self._take_forgets())

    def _resend(
        self, items: list[tuple[Release, CoordinatedLease]], forgets: tuple[str, ...]
    ) -> None:
        if not items and not forgets:
            return
        task = self._coordinator.background(self._write_releases(items, forgets))
        if task is not None:
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write_releases(
        self, items: list[tuple[Release, CoordinatedLease]], forgets: tuple[str, ...]
    ) -> None:
        """Releases must land, however long Redis is away (see `RedisCoordinator.write`)."""
        batch = ReleaseBatch(tuple(release for release, _ in items), forgets)
        result = await self._coordinator.write(self.workspace_id, batch)
        if result is not None:
            self._released(items, result)

    def _released(
        self, items: list[tuple[Release, CoordinatedLease]], answers: tuple[Written, ...]
    ) -> None:
        for (_, lease), written in zip(items, answers, strict=False):
            transitions = self._note_transitions(written.figures.transitions)
            if transitions:
                lease.evidence.breaker_transitions.extend(transitions)

    async def _write(self, call: Pause) -> None:
        """A write that must land, however long Redis is away (see `RedisCoordinator.write`)."""
        result = await self._coordinator.write(self.workspace_id, call)
        if result is not None:
            self._note_transitions(result.figures.transitions)

    async def _pause(self, provider_id: str, ms: float) -> None:
        await self._write(Pause(provider_id, ms))
