"""A Redis Cluster primary fails mid-load and its replica takes over: admission survives it.

Real driver processes admit calls through a Redis Cluster of three primaries with a replica each
(started by the test on loopback) and send them to loopback providers that count calls in flight.
The primary serving the first workspace's hash slot is killed (SIGKILL) while calls go out and
waiters are queued, and its replica is promoted a moment later: by an operator
(`CLUSTER FAILOVER TAKEOVER`), or by the cluster itself once `cluster-node-timeout` has passed.
The replica was frozen just before one call was admitted and is thawed only after its primary
died, so it never learnt of that permit: the call is still out at the provider, and only its
process's re-assertion keeps the promoted replica from handing the permit out twice. While the
slot has no primary the processes refuse that workspace's requests with the typed reason
`coordination-unavailable`; a workspace on another shard is not held up at all; once the replica
serves the slot the workspace's state starts a new epoch (the promoted replica may lack the last
writes), the processes re-assert the permits they hold, and admission resumes by itself. No
provider ever sees more calls at once than its ceiling, and no call goes out twice.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from admission.coordination.clients import route_key
from admission.coordination.protocol import Release, ReleaseBatch
from admission.core import AdmissionRequest, CancelSignal, Estimate, Profile
from tests.admission.coordination.conftest import (
    WORKSPACE,
    Deployment,
    Process,
    profile,
    request,
    run,
    settle,
    until,
)
from tests.admission.coordination.test_processes import Drivers, document, wait_for
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedisCluster

SETTINGS = {"lease_ttl_ms": 12000, "heartbeat_ms": 100, "recovery_grace_ms": 400, "timeout_ms": 300}
CEILING = 2
PROFILE = document({"concurrency": CEILING, "maxQueueWaitMs": 1500}, "failover-v1")


# How the replica takes over: an operator's `CLUSTER FAILOVER TAKEOVER` at a moment the test
# picks (the node timeout long enough that the cluster never does it first), or the cluster by
# itself once the primary has been silent for `cluster-node-timeout`.
NODE_TIMEOUT_MS = {"operator": 30_000, "automatic": 1_500}


@pytest.fixture(params=sorted(NODE_TIMEOUT_MS))
def promotion(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cluster(promotion: str) -> Iterator[PrivateRedisCluster]:
    # A cluster of the test's own: it loses a node.
    cluster = PrivateRedisCluster(node_timeout_ms=NODE_TIMEOUT_MS[promotion])
    try:
        yield cluster
    finally:
        cluster.destroy()


def test_a_failed_primary_is_survived_and_no_ceiling_is_ever_passed(
    tmp_path: Path, cluster: PrivateRedisCluster, promotion: str
) -> None:
    automatic = promotion == "automatic"
    hold = threading.Event()
    with LoopbackServer() as provider, LoopbackServer() as other_provider:
        provider.default = Reply(delay=0.05)
        other_provider.default = Reply(delay=0.05)
        drivers = Drivers(tmp_path, cluster.url, provider.base_url, PROFILE)
        primary = cluster.primary_of(route_key(drivers.prefix, "ws"))
        # A workspace whose slot another primary serves.
        other = next(
            name
            for name in (f"other-{i}" for i in range(1000))
            if cluster.primary_of(route_key(drivers.prefix, name)) != primary
        )
        replica = cluster.replica_of(primary)
        try:
            for principal in ("alice", "bob"):
                drivers.start(
                    settings=SETTINGS, principal=principal, concurrency=4, seconds=40, complete=150
                )
            drivers.start(
                settings=SETTINGS,
                workspace=other,
                base_url=other_provider.base_url,
                concurrency=2,
                seconds=40,
                complete=150,
            )
            wait_for(lambda: len(provider.requests) >= 20, 30, "calls did not start")
            wait_for(lambda: _queued(drivers) >= 1, 30, "no waiter queued")
            # The next call is held at the provider; its permit never reaches the replica.
            cluster.pause(replica)
            provider.replies.append(Reply(hold=hold))
            wait_for(lambda: not provider.replies, 30, "the held call did not go out")
            (held,) = [r["body"]["id"] for r in provider.requests if r["held"]]
            cluster.kill(primary)
            killed = time.time()
            cluster.resume(replica)
            wait_for(
                lambda: (
                    sum(
                        line.get("reason") == "coordination-unavailable" and line["at"] > killed
                        for line in drivers.lines(0) + drivers.lines(1)
                    )
                    >= 4
                ),
                30,
                "the processes did not refuse while the slot had no primary",
            )
            other_before = len(other_provider.requests)
            wait_for(
                lambda: len(other_provider.requests) >= other_before + 10,
                30,
                "the other shard's workspace was held up",
            )
            if automatic:
                # Nothing is promoted before the node timeout: the outage checked below.
                cluster.wait_promoted(replica)
                outage_ends = killed + NODE_TIMEOUT_MS["automatic"] / 1000
            else:
                # The outage lasts long enough to be seen (the checks below skip its first 0.5 s).
                wait_for(lambda: time.time() > killed + 1.5, 5, "the clock stood still")
                cluster.promote(replica)
                outage_ends = time.time()
            promoted = time.time()
            sent_before = len(provider.requests)
            wait_for(
                lambda: len(provider.requests) >= sent_before + 10,
                30,
                "admission did not resume after the promotion",
            )
            # The held call is still out: its process re-asserted its permit, nothing stopped it.
            assert not _ended(drivers, held)
            hold.set()
            drivers.wait(timeout=90)
        finally:
            hold.set()
            drivers.stop()
    lines = drivers.lines(0) + drivers.lines(1)
    figures = {
        "promotion": promotion,
        "calls": len(provider.requests),
        "max_in_flight": provider.max_in_flight,
        "other_max_in_flight": other_provider.max_in_flight,
        "refused_unavailable": sum(
            line.get("reason") == "coordination-unavailable" for line in lines
        ),
        "first_admit_after_promotion_seen_s": round(
            min(
                line["at"]
                for line in lines
                if line["decision"] == "admit" and line["at"] > promoted
            )
            - promoted,
            3,
        ),
    }
    print(figures)
    # While the slot had no primary: refused with the typed reason, or timed out in the queue.
    outage = [line for line in lines if killed + 0.5 < line["at"] < outage_ends]
    reasons = {line["reason"] for line in outage if line["decision"] == "reject"}
    assert "coordination-unavailable" in reasons, figures
    assert reasons <= {"coordination-unavailable", "queue-timeout"}, reasons
    assert not [line for line in outage if line["decision"] == "admit"]
    # Never more calls at a provider than its ceiling, before, during or after the failover.
    # (The provider counts a call until it answers it, as a provider does: a call its process
    # had stopped would still count. None was stopped here.)
    assert provider.max_in_flight <= CEILING, figures
    assert other_provider.max_in_flight <= CEILING, figures
    assert not [line for line in lines if line["decision"] == "aborted"], figures
    assert [line["decision"] for line in lines if line.get("id") == held] == ["admit", "done"]
    # No call sent twice, and every run ended with its calls completed.
    ids = Counter(r["body"]["id"] for r in provider.requests)
    assert max(ids.values()) == 1
    for index in range(3):
        done = [line for line in drivers.lines(index) if line["decision"] == "done"]
        assert len(done) >= 150


def _ended(drivers: Drivers, call_id: str) -> bool:
    return any(
        line.get("id") == call_id and line["decision"] in ("done", "aborted")
        for line in drivers.lines()
    )


def _queued(drivers: Drivers) -> int:
    from admission.coordination.clients import sync_client

    client = sync_client(drivers.url)
    try:
        return int(client.hlen(f"{drivers.prefix}:{{ws}}:W"))
    finally:
        client.close()


def promote_without(deployment: Deployment, holder: Process, lease_id: str) -> None:
    """Leave in Redis what a replica promoted without its primary's last grant holds: no epoch
    (epochs are never replicated), and not the permit `holder` still holds (given back behind
    its back, through the release function)."""
    deployment.lose_epoch()
    holder.coordinator.call_sync(WORKSPACE, ReleaseBatch((Release(lease_id),)))
    assert deployment.active("V:llm") == 0


def test_a_promoted_state_that_missed_a_release_gives_the_permit_back(
    deployment: Deployment,
) -> None:
    """A replica promoted without its primary's last writes may still hold a permit its process
    gave back meanwhile: the process re-asserts what it holds, and the rest goes back."""
    process = deployment.process(register=profile(providers={"llm": {"concurrency": 1}}))

    async def scenario() -> None:
        lease = await process.controller().acquire(request())
        client = deployment.client
        kept = {key: client.dump(key) for key in deployment.stored_keys()}
        lease.release(success=True)
        await settle(deployment)
        assert deployment.active("V:llm") == 0
        # What the promoted replica holds: the state from before the release, and no epoch
        # (the epoch is never replicated).
        for key, value in kept.items():
            client.restore(key, 0, value, replace=True)
        deployment.lose_epoch()
        assert deployment.active("V:llm") == 1
        # The next decision meets a new epoch: the process re-asserts (nothing), the stale
        # permit goes back, and the decision is admitted at once (the ceiling is one).
        again = await process.controller().acquire(request(budget="inv-2"))
        assert deployment.active("V:llm") == 1
        assert len(deployment.leases()) == 1
        again.release(success=True)
        await settle(deployment)
        assert deployment.active("V:llm") == 0

    run(deployment, scenario, timeout=10)


def test_a_promoted_state_that_missed_a_permit_serves_nobody_before_it_is_put_back(
    deployment: Deployment,
) -> None:
    """A replica promoted without its primary's last grant still holds the waiters queued behind
    it: while the new epoch's grace runs nothing is served (not even by a withdrawal's or a
    reaper's pump), so the permit is put back by its holder before anyone else gets it."""
    deployment.settings = {"recovery_grace_ms": 800}
    ceiling = profile(providers={"llm": {"concurrency": 1}})
    holder, first, second = (deployment.process(register=ceiling) for _ in range(3))

    async def scenario() -> None:
        held = await holder.controller().acquire(request())
        signal = CancelSignal()
        waiting = asyncio.ensure_future(first.controller().acquire(request("bob", budget="b1")))
        leaving = asyncio.ensure_future(
            second.controller().acquire(request("bob", budget="b2", signal=signal))
        )
        await until(lambda: deployment.queued("V:llm") == 2)
        # What the promoted replica holds: both waiters, not the permit. (The release's own
        # pump is the first to run in the new epoch.)
        promote_without(deployment, holder, held.id)
        # A waiter leaves at once: its pump must not hand the missing permit to the other.
        signal.cancel("gone")
        await asyncio.gather(leaving, return_exceptions=True)
        await until(lambda: deployment.active("V:llm") == 1, timeout=5)
        # The grace has passed, the holder re-asserted its permit: the waiter still waits.
        await asyncio.sleep(1.0)
        assert not waiting.done()
        assert deployment.active("V:llm") == 1
        held.release(success=True)
        granted = await asyncio.wait_for(waiting, 5)
        assert deployment.active("V:llm") == 1
        granted.release(success=True)
        await settle(deployment)

    run(deployment, scenario, timeout=20)


def test_a_process_slow_to_reassert_after_a_promotion_keeps_its_permit(
    deployment: Deployment,
) -> None:
    """A process live in the workspace when its state was lost may take longer than the grace
    to put its permits back (its map of the slots not yet renewed, its loop starved of CPU):
    nothing is admitted there before it has, however long the grace has been over."""
    deployment.settings = {"recovery_grace_ms": 200}
    ceiling = profile(providers={"llm": {"concurrency": 1}})
    holder, other = (deployment.process(register=ceiling) for _ in range(2))

    async def scenario() -> None:
        held = await holder.controller().acquire(request())
        # The holder learns of the new epoch only once the gate opens.
        gate = asyncio.Event()
        resync = holder.coordinator.resync

        async def slow_resync(workspace_id: str, epoch: str) -> None:
            await gate.wait()
            await resync(workspace_id, epoch)

        holder.coordinator.resync = slow_resync
        promote_without(deployment, holder, held.id)
        late = asyncio.ensure_future(other.controller().acquire(request("bob", budget="b1")))
        await asyncio.sleep(1.0)
        assert not late.done()
        assert deployment.active("V:llm") == 0
        gate.set()
        await until(lambda: deployment.active("V:llm") == 1, timeout=5)
        await asyncio.sleep(0.5)
        assert not late.done()
        held.release(success=True)
        granted = await asyncio.wait_for(late, 5)
        assert deployment.active("V:llm") == 1
        granted.release(success=True)
        await settle(deployment)

    run(deployment, scenario, timeout=20)


def test_a_shard_out_of_reach_stops_only_the_calls_of_its_workspaces(
    redis_cluster: PrivateRedisCluster,
) -> None:
    """A process that cannot renew its lease in one shard for most of the lease TTL stops the
    calls of its permits there (another process may soon be given them); permits in workspaces
    of the shards that still answer are left alone."""
    deployment = Deployment(redis_cluster.url)
    frozen_ws = "ws-1"
    primary = redis_cluster.primary_of(route_key(deployment.prefix, frozen_ws))
    other_ws = next(
        name
        for name in (f"other-{i}" for i in range(1000))
        if redis_cluster.primary_of(route_key(deployment.prefix, name)) != primary
    )
    process = deployment.process(lease_ttl_ms=1500, heartbeat_ms=100, timeout_ms=200)
    for ws in (frozen_ws, other_ws):
        document = {
            "profileVersion": "v1",
            "workspace": {"concurrency": 10},
            "providers": {"llm": {"concurrency": 10}},
            "principals": {"alice": {"concurrency": 10}},
        }
        process.registry.register(Profile.from_dict(document, workspace_id=ws), sequence=1)

    async def scenario() -> None:
        signals = {ws: CancelSignal() for ws in (frozen_ws, other_ws)}
        leases = {
            ws: await process.controller(ws).acquire(
                AdmissionRequest("inv", "alice", ws, "llm", Estimate(), signal=signals[ws])
            )
            for ws in signals
        }
        redis_cluster.pause(primary)
        try:
            await until(lambda: signals[frozen_ws].cancelled, timeout=5)
        finally:
            redis_cluster.resume(primary)
        assert signals[frozen_ws].reason == "admission-lease-lost"
        assert not signals[other_ws].cancelled
        for lease in leases.values():
            lease.release(success=None)
        await settle(deployment)

    try:
        run(deployment, scenario, timeout=20)
    finally:
        deployment.cleanup()


def test_primaries_that_lost_the_function_library_get_it_back(
    redis_cluster: PrivateRedisCluster,
) -> None:
    """A primary without the library (new, restarted, or flushed) answers that the function is
    missing; the call that meets it loads the library on every primary and goes on."""
    deployment = Deployment(redis_cluster.url)
    process = deployment.process(register=profile(), timeout_ms=3000)
    for port in redis_cluster.primaries():
        redis_cluster.cli(port, "function", "flush")
    assert all(
        "sluice_" not in redis_cluster.cli(port, "function", "list")
        for port in redis_cluster.primaries()
    )

    async def scenario() -> None:
        lease = await process.controller().acquire(request())
        lease.release(success=True)
        await settle(deployment)

    try:
        run(deployment, scenario, timeout=20)
    finally:
        deployment.cleanup()
    for port in redis_cluster.primaries():
        assert "sluice_" in redis_cluster.cli(port, "function", "list"), port
