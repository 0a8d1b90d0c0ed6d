"""Liveness under Redis stalls and lost replies: every granted permit is held by a live waiter
or comes back to the pool within the documented bound (docs/admission-coordination.md,
"Liveness").

Two coordinators (two processes) acquire, release and cancel against a private Redis that the
machine freezes (SIGSTOP) for a fraction of, about, or more than the lease TTL, sometimes while
an acquire or a release is on the wire, so the call times out in the process and runs in Redis
when it thaws (a lost reply). After every step, with Redis answering, each lease Redis holds must
be one its owner holds within the bound, the provider's ceiling holds, and the counters equal
what is held. A host aborts a call whose permit its process doubts, as a real worker does.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from admission.coordination.protocol import parse_scope
from admission.core import AdmissionRejected, CancelSignal, Profile
from tests.admission.coordination.conftest import WORKSPACE, Deployment, leases_in, request
from tests.private_services import PrivateRedis

LEASE_TTL_MS = 600
SETTINGS = {"lease_ttl_ms": LEASE_TTL_MS, "heartbeat_ms": 100, "timeout_ms": 100}
# The documented bound (one lease TTL after Redis answers again) plus scheduling slack.
BOUND_S = LEASE_TTL_MS / 1000 + 0.6
PROFILE = {
    "profileVersion": "live-v1",
    "workspace": {"concurrency": 10},
    "providers": {"llm": {"concurrency": 2, "maxQueueWaitMs": 1500}},
    "principals": {"alice": {"concurrency": 3}, "bob": {"concurrency": 3}},
}
CEILING = 2


class StallingRedis(RuleBasedStateMachine):
    server: ClassVar[PrivateRedis]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.deployment = Deployment(self.server.url)
        self.processes = [self.deployment.process(**SETTINGS) for _ in range(2)]
        self.deployment.register(Profile.from_dict(PROFILE, workspace_id=WORKSPACE))
        self.redis = self.deployment.client
        self.leases: list[tuple[int, Any]] = []
        self.waiting: list[tuple[int, asyncio.Task[Any], CancelSignal]] = []

    # ------------------------------------------------------------------ helpers

    def spin(self, seconds: float = 0.005) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def settle(self) -> None:
        async def writes() -> None:
            for process in self.processes:
                await process.coordinator.settle()

        self.loop.run_until_complete(asyncio.wait_for(writes(), 20))
        self.collect()

    def collect(self) -> None:
        still = []
        for index, task, signal in self.waiting:
            if not task.done():
                still.append((index, task, signal))
            elif task.exception() is None:
                self.leases.append((index, task.result()))
            else:
                assert isinstance(task.exception(), AdmissionRejected), task.exception()
        self.waiting = still

    def stalled(self, seconds: float) -> None:
        self.server.pause()
        try:
            self.spin(seconds)
        finally:
            self.server.resume()
        self.collect()

    def start(self, process: int, principal: str, deadline_ms: float | None) -> None:
        signal = CancelSignal()
        controller = self.processes[process].controller()
        clock = self.processes[process].registry.clock
        deadline = None if deadline_ms is None else clock.monotonic_ms() + deadline_ms
        item = request(principal, "llm", f"b-{principal}", signal=signal, deadline_ms=deadline)
        task = self.loop.create_task(controller.acquire(item))
        signal.add_callback(lambda _signal: self.aborted(task))
        self.waiting.append((process, task, signal))

    def aborted(self, task: asyncio.Task[Any]) -> None:
        """A host stops the call of a doubted permit at once and gives the permit back (even
        while Redis is frozen: the release then waits for it)."""
        if not task.done() or task.cancelled() or task.exception() is not None:
            return
        lease = task.result()
        self.leases = [(index, held) for index, held in self.leases if held is not lease]
        lease.release(success=None)

    # -------------------------------------------------------------------- rules

    @rule(
        process=st.integers(0, 1),
        principal=st.sampled_from(["alice", "bob"]),
        deadline_ms=st.sampled_from([None, 150, 800]),
    )
    def acquire(self, process: int, principal: str, deadline_ms: float | None) -> None:
        self.start(process, principal, deadline_ms)
        self.spin(0.02)
        self.collect()

    # Which lease or waiter a rule acts on is drawn as a number before it is known how many
    # there are (how many depends on timing, and a draw must not).
    @rule(pick=st.integers(0, 7), success=st.sampled_from([True, None]))
    def release(self, pick: int, success: bool | None) -> None:
        self.collect()
        if not self.leases:
            return
        _, lease = self.leases.pop(pick % len(self.leases))
        lease.release(success=success)
        self.spin(0.01)

    @rule(pick=st.integers(0, 7))
    def cancel(self, pick: int) -> None:
        self.collect()
        if not self.waiting:
            return
        _, _, signal = self.waiting[pick % len(self.waiting)]
        signal.cancel()
        self.spin(0.02)

    @rule(ttls=st.sampled_from([0.1, 0.5, 0.9, 1.5, 3.0]))
    def redis_stalls(self, ttls: float) -> None:
        self.stalled(ttls * LEASE_TTL_MS / 1000)

    @rule(
        process=st.integers(0, 1),
        principal=st.sampled_from(["alice", "bob"]),
        ttls=st.sampled_from([0.5, 1.5, 3.0]),
    )
    def acquire_reply_lost(self, process: int, principal: str, ttls: float) -> None:
        """The acquire is sent into a frozen Redis: the process gives up on its answer (the
        request is refused, coordination-unavailable) and Redis runs it when it thaws."""
        self.server.pause()
        try:
            self.start(process, principal, None)
            self.spin(ttls * LEASE_TTL_MS / 1000)
        finally:
            self.server.resume()
        self.collect()

    @rule(pick=st.integers(0, 7))
    def release_reply_lost(self, pick: int) -> None:
        self.collect()
        if not self.leases:
            return
        _, lease = self.leases.pop(pick % len(self.leases))
        self.server.pause()
        try:
            lease.release(success=True)
            self.spin(0.3)
        finally:
            self.server.resume()
        self.collect()

    # --------------------------------------------------------------- invariants

    def stored(self, suffix: str) -> dict[str, dict[str, Any]]:
        raw = self.redis.hgetall(self.deployment.key(suffix))
        return {key: json.loads(value) for key, value in raw.items()}

    def orphans(self) -> dict[str, dict[str, Any]]:
        """Leases Redis holds that their owner does not (a grant nobody will use)."""
        held: dict[str, set[str]] = {
            p.coordinator.process_id: p.coordinator.leases for p in self.processes
        }
        return {
            key: lease
            for key, lease in self.deployment.leases().items()
            if key not in held.get(lease["proc"], set())
        }

    @invariant()
    def every_grant_is_held_or_comes_back_within_the_bound(self) -> None:
        started = time.monotonic()
        while True:
            self.collect()
            orphans = self.orphans()
            if not orphans:
                break
            if time.monotonic() - started > BOUND_S:
                waiters = {
                    w.id: w.state for p in self.processes for w in p.coordinator.waiters.values()
                }
                raise AssertionError(f"grants nobody holds after {BOUND_S} s: {orphans} {waiters}")
            self.spin(0.02)

    def snapshot(
        self,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
        """The leases, the waiters and the principals' scope records as of one moment.

        Calls sent into the frozen Redis (some on connections it accepts only once it thaws) still
        run while the invariants read, so the three are read in one transaction: read one by one,
        a withdraw running between them would show a lease next to counters that no longer
        count it."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.deployment.key("s"))
            pipe.hgetall(self.deployment.key("W"))
            pipe.hmget(self.deployment.key("s"), ["P:alice", "P:bob"])
            raw_leases, raw_waiters, raw_scopes = pipe.execute()
        leases = {key: json.loads(value) for key, value in leases_in(raw_leases).items()}
        waiters = {key: json.loads(value) for key, value in raw_waiters.items()}
        scopes = {
            principal: parse_scope(raw)
            for principal, raw in zip(("alice", "bob"), raw_scopes, strict=True)
        }
        return leases, waiters, scopes

    @invariant()
    def the_ceiling_holds_and_counters_are_what_is_held(self) -> None:
        leases, waiters, scopes = self.snapshot()
        assert len(leases) <= CEILING, leases
        active = Counter(lease["pid"] for lease in leases.values())
        for principal in ("alice", "bob"):
            scope = scopes[principal]
            queued = sum(1 for w in waiters.values() if w["pid"] == principal)
            assert int(scope.get("a", 0)) == active[principal], (principal, scope, leases)
            assert int(scope.get("q", 0)) == queued, (principal, scope, waiters)

    def teardown(self) -> None:
        try:
            for _, _, signal in self.waiting:
                signal.cancel()
            tasks = [task for _, task, _ in self.waiting]

            async def ended() -> None:
                await asyncio.gather(*tasks, return_exceptions=True)

            self.loop.run_until_complete(asyncio.wait_for(ended(), 10))
            self.collect()
            for _, lease in self.leases:
                lease.release(success=None)
            self.settle()
            # Everything given back: nothing held, nothing queued, nothing counted.
            started = time.monotonic()
            while self.deployment.leases() or self.stored("W"):
                assert time.monotonic() - started < BOUND_S, (
                    self.deployment.leases(),
                    self.stored("W"),
                )
                self.spin(0.02)
            for principal in ("alice", "bob"):
                scope = self.deployment.scope(f"P:{principal}")
                assert int(scope.get("a", 0)) == 0 and int(scope.get("q", 0)) == 0
        finally:
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.deployment.close(), 15))
            finally:
                self.loop.close()
                self.deployment.cleanup()


@pytest.fixture(scope="module")
def stalling_server() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.destroy()


def test_grants_survive_redis_stalls_and_lost_replies(stalling_server: PrivateRedis) -> None:
    StallingRedis.server = stalling_server
    machine = settings(
        max_examples=int(os.environ.get("SLUICE_LIVENESS_EXAMPLES", "8")),
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(StallingRedis)
    machine.TestCase().runTest()
