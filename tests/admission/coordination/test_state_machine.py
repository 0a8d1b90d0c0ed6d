"""Random interleavings of several processes against one real Redis never break a promise.

Three coordinators with registries of their own (as three processes would have) acquire,
release, cancel, forget budgets and crash in any order. After every step the shared state is
read back from Redis and checked: no scope above its concurrency or share, no reservation taken
by others, no budget overspent, counters equal to the leases and waiters really held, every
lease of a live process known to that process, and a request refused at once consumed nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from admission.core import AdmissionRejected, CancelSignal, Profile
from tests.admission.coordination.conftest import (
    WORKSPACE,
    Deployment,
    request,
)

PROFILE = {
    "profileVersion": "machine-v1",
    "workspace": {
        "concurrency": 4,
        "maxQueueLength": 8,
        "maxQueueWaitMs": 400,
        "maxTokens": 3000,
    },
    "providers": {
        "p1": {"concurrency": 3, "requestsPerMinute": 1200, "maxPrincipalShare": 0.7},
        "p2": {
            "concurrency": 2,
            "tokensPerSecond": 600,
            "circuitBreaker": {"failureThreshold": 2, "openMs": 150, "halfOpenMaxCalls": 1},
        },
    },
    "principals": {
        "alice": {"concurrency": 2, "maxAttempts": 4},
        "bob": {"concurrency": 2, "reservedConcurrency": 1},
        "carol": {"concurrency": 3, "maxQueueLength": 3},
    },
}
PRINCIPALS = ("alice", "bob", "carol")
PROVIDERS = ("p1", "p2")


async def _gather(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


class CoordinatedAdmission(RuleBasedStateMachine):
    url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.deployment = Deployment(self.url)
        self.profile = Profile.from_dict(PROFILE, workspace_id=WORKSPACE)
        self.processes = [
            self.deployment.process(lease_ttl_ms=900, heartbeat_ms=100) for _ in range(3)
        ]
        self.deployment.register(self.profile)
        self.alive = [True, True, True]
        # Heartbeats in flight, per process. A heartbeat also serves the lanes when a wake is
        # due (a bucket refilled, a pause or a grant lapsed): one sent before a quiet point
        # may still write a grant in Redis after it, so settling waits for them too.
        self.beating = [0, 0, 0]
        for index, process in enumerate(self.processes):
            process.coordinator._heartbeat = self.counted(index, process.coordinator._heartbeat)
        self.leases: list[tuple[int, Any]] = []
        self.waiting: list[tuple[int, asyncio.Task[Any], CancelSignal]] = []
        self.redis = self.deployment.client

    # ------------------------------------------------------------------ helpers

    def counted(self, index: int, beat: Callable[[], Awaitable[None]]) -> Any:
        async def heartbeat() -> None:
            self.beating[index] += 1
            try:
                await beat()
            finally:
                self.beating[index] -= 1

        return heartbeat

    def spin(self, seconds: float = 0.005) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def settle(self) -> None:
        async def all_writes() -> None:
            # Until no call (an acquire's included), no write and no heartbeat is under way and
            # no grant written to Redis is still on its way to its process (the take it starts
            # is a write too): only then does Redis hold what the processes know. A grant is
            # taken, or lapses back to the pool, within half a lease (0.45 s) and the next
            # heartbeats; on a loaded machine that takes longer, so the wait is bounded by
            # time, not by a number of turns.
            while True:
                for index, process in enumerate(self.processes):
                    if self.alive[index]:
                        await process.coordinator.settle()
                if not self.calls_under_way() and not self.grants_on_their_way():
                    return
                await asyncio.sleep(0.002)

        # The loop's last turn may start a call (a heartbeat whose sleep ended, say) after the
        # check above passed; the loop then stops with that call on its way to Redis, which
        # would change the shared state under the invariant's reads. So settle again until the
        # loop stops with nothing under way.
        started = time.monotonic()
        while True:
            left = 20 - (time.monotonic() - started)
            try:
                self.loop.run_until_complete(asyncio.wait_for(all_writes(), max(left, 0.1)))
            except TimeoutError:
                stuck = [t for p in self.processes for t in p.coordinator._background]
                raise AssertionError(
                    f"in 20 s, writes did not settle ({stuck}), a call did not end or a grant "
                    "was neither taken nor lapsed"
                ) from None
            if not self.calls_under_way():
                break
        self.collect()

    def calls_under_way(self) -> bool:
        # A crashed process's objects live on in this loop: a call it sent before it crashed
        # still reaches Redis (as a real one's would), so its calls count too.
        for index, process in enumerate(self.processes):
            if self.beating[index] or sum(process.coordinator._inflight.values()):
                return True
        return False

    def grants_on_their_way(self) -> bool:
        live = {self.processes[i].coordinator.process_id for i in range(3) if self.alive[i]}
        for lease in self.deployment.leases().values():
            if "off" in lease and lease["proc"] in live:
                return True
        return False

    def collect(self) -> None:
        """Move finished waiters to leases (granted) or drop them (refused)."""
        still = []
        for index, task, signal in self.waiting:
            if not task.done():
                still.append((index, task, signal))
            elif task.exception() is None:
                self.leases.append((index, task.result()))
            else:
                assert isinstance(task.exception(), AdmissionRejected), task.exception()
        self.waiting = still

    def consumable_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for name, fields in self.deployment.scopes().items():
            state[f"s:{name}"] = {f: fields[f] for f in ("a", "rl", "tl", "h", "bs") if f in fields}
        for key in self.deployment.stored_keys():
            if ":b:" in key:
                state[key] = self.redis.hgetall(key)
        return state

    # -------------------------------------------------------------------- rules

    @rule(
        process=st.integers(0, 2),
        principal=st.sampled_from(PRINCIPALS),
        provider=st.sampled_from(PROVIDERS),
        tokens=st.sampled_from([None, 0, 50, 400, 700]),
        budget=st.sampled_from(["b1", "b2", "b3"]),
    )
    def acquire(
        self, process: int, principal: str, provider: str, tokens: int | None, budget: str
    ) -> None:
        if not self.alive[process]:
            return
        self.settle()
        quiet = not self.waiting and all(self.alive)
        before = self.consumable_state() if quiet else None
        signal = CancelSignal()
        controller = self.processes[process].controller()
        item = request(principal, provider, budget, signal=signal, tokens=tokens)
        task = self.loop.create_task(controller.acquire(item))
        # Until its answer is read: admitted or refused, or queued. (A loaded machine may take
        # a while; the bound only keeps a hang from lasting forever.)
        for _ in range(6000):
            if task.done() or any(
                w.ticket.request is item and w.state == "queued"
                for w in self.processes[process].coordinator.waiters.values()
            ):
                break
            self.spin()
        if task.done() and task.exception() is not None:
            refusal = task.exception()
            assert isinstance(refusal, AdmissionRejected)
            if before is not None and refusal.reason != "queue-timeout":
                # Refused at once: nothing that admission consumes has moved.
                assert self.consumable_state() == before, refusal.reason
            return
        self.waiting.append((process, task, signal))
        self.collect()

    # Which lease or waiter a rule acts on is drawn as a plain number, then taken modulo the
    # ones there are: how many there are depends on Redis's timing (a loaded machine admits
    # or queues differently), and a draw whose range followed it would make Hypothesis see
    # two runs of the same choices draw differently (FlakyStrategyDefinition).
    @rule(pick=st.integers(0, 15), outcome=st.sampled_from([True, False, None, "retry"]))
    def release(self, pick: int, outcome: Any) -> None:
        self.collect()
        live = [i for i, (p, _) in enumerate(self.leases) if self.alive[p]]
        if not live:
            return
        _, lease = self.leases.pop(live[pick % len(live)])
        if outcome == "retry":
            lease.release(success=False, retry_after_ms=30)
        else:
            lease.release(success=outcome, actual_tokens=10)
        self.settle()

    @rule(pick=st.integers(0, 15))
    def cancel(self, pick: int) -> None:
        self.collect()
        live = [i for i, (p, _, _) in enumerate(self.waiting) if self.alive[p]]
        if not live:
            return
        _, task, signal = self.waiting[live[pick % len(live)]]
        signal.cancel()
        for _ in range(200):
            if task.done():
                break
            self.spin()
        self.collect()

    @rule(budget=st.sampled_from(["b1", "b2", "b3"]))
    def forget_budget(self, budget: str) -> None:
        if self.alive[0]:
            self.processes[0].controller().release_budget(budget)
            self.settle()

    @rule(process=st.integers(0, 2))
    def crash(self, process: int) -> None:
        """The process dies: it stops renewing and answering; its Python objects are gone."""
        if not self.alive[process] or sum(self.alive) == 1:
            return
        coordinator = self.processes[process].coordinator
        for task in coordinator._tasks:
            task.cancel()
        self.alive[process] = False
        gone = [task for index, task, _ in self.waiting if index == process]
        for task in gone:
            task.cancel()
        self.loop.run_until_complete(_gather(gone))
        self.waiting = [entry for entry in self.waiting if entry[0] != process]
        self.leases = [entry for entry in self.leases if entry[0] != process]
        # Its lease lapses now rather than after the TTL, so the test needs no long wait.
        self.redis.zadd(self.deployment.key("procs"), {coordinator.process_id: 0})

    @rule(ms=st.sampled_from([5, 40, 160]))
    def time_passes(self, ms: int) -> None:
        self.spin(ms / 1000)
        self.collect()

    # --------------------------------------------------------------- invariants

    @invariant()
    def shared_state_keeps_every_promise(self) -> None:
        self.settle()
        leases = self.deployment.leases()
        waiters = {
            k: json.loads(v) for k, v in self.redis.hgetall(self.deployment.key("W")).items()
        }
        live_procs = {self.processes[i].coordinator.process_id for i in range(3) if self.alive[i]}
        active: Counter[str] = Counter()
        for lease in leases.values():
            for scope in self.scopes_of(lease):
                active[scope] += 1
        queued: Counter[str] = Counter()
        for waiter in waiters.values():
            for scope in self.scopes_of(waiter):
                queued[scope] += 1
        dead_holdings = any(item["proc"] not in live_procs for item in leases.values()) or any(
            item["proc"] not in live_procs for item in waiters.values()
        )
        for scope in set(active) | set(queued) | self.stored_scopes():
            stored = self.deployment.scope(scope)
            # Counters are exactly what is held: nothing leaked, nothing lost.
            assert int(stored.get("a", 0)) == active[scope], (scope, stored, active[scope])
            assert int(stored.get("q", 0)) == queued[scope], (scope, stored, queued[scope])
        profile = self.profile
        for principal, limits in profile.principals.items():
            assert active[f"P:{principal}"] <= limits.concurrency
        assert active["W"] <= profile.workspace.concurrency
        for provider, limits in profile.providers.items():
            assert active[f"V:{provider}"] <= limits.concurrency
            share = limits.max_principal_share
            for principal in profile.principals:
                pair = active[f"X:{len(provider)}:{provider}{principal}"]
                if share is not None:
                    assert pair <= max(1, math.floor(share * limits.concurrency))
        # Bob's reserved permit is never taken by the others.
        others = active["W"] - min(active["P:bob"], 1)
        assert others <= profile.workspace.concurrency - 1
        for key in self.deployment.stored_keys():
            if ":b:" in key:
                used = self.redis.hgetall(key)
                assert float(used.get("W" + "t", 0)) <= 3000
                assert float(used.get(f"P{len('alice')}:alice" + "a", 0)) <= 4
        # Every lease of a live process is one that process holds (none lost, none invented).
        for index in range(3):
            if not self.alive[index]:
                continue
            mine = {
                k
                for k, v in leases.items()
                if v["proc"] == self.processes[index].coordinator.process_id
            }
            held = set(self.processes[index].coordinator.leases)
            assert mine == held, (mine, held)
        if not dead_holdings:
            assert len(leases) == sum(1 for p, _ in self.leases if self.alive[p])

    def scopes_of(self, item: dict[str, Any]) -> list[str]:
        pid, prov = item["pid"], item["prov"]
        return [f"P:{pid}", "W", f"V:{prov}", f"X:{len(prov)}:{prov}{pid}"]

    def stored_scopes(self) -> set[str]:
        return set(self.deployment.scopes())

    def teardown(self) -> None:
        for _index, _task, signal in self.waiting:
            signal.cancel()
        tasks = [task for _index, task, _signal in self.waiting]
        try:
            self.loop.run_until_complete(asyncio.wait_for(_gather(tasks), 10))
        except TimeoutError:
            stuck = [
                (w.id, w.state, w.requeueing)
                for p in self.processes
                for w in p.coordinator.waiters.values()
            ]
            raise AssertionError(f"cancelled waiters did not leave: {stuck}") from None
        try:
            self.loop.run_until_complete(self.deployment.close())
        finally:
            self.loop.close()
            self.deployment.cleanup()


def test_coordinated_admission_state_machine(shared_url: str) -> None:
    # A machine class per Redis (one server, a cluster), each with its own settings.
    kind = "Cluster" if shared_url.startswith("redis+cluster://") else "Server"
    on_this_redis = type(
        f"CoordinatedAdmissionOn{kind}", (CoordinatedAdmission,), {"url": shared_url}
    )
    machine = settings(
        max_examples=int(os.environ.get("SLUICE_MACHINE_EXAMPLES", "20")),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(on_this_redis)
    machine.TestCase().runTest()
