"""What operators do to a Redis Cluster while admission runs on it: move a workspace's hash slot
to another primary (a new one), and run with `cluster-require-full-coverage` either way.

Real driver processes admit calls through a private cluster on loopback and send them to a
loopback provider that counts the calls in flight. While a slot moves, no function runs in it
(its fence, see clients.py): the processes refuse that workspace's requests as
`coordination-unavailable`, nothing passes a ceiling, and admission resumes by itself once the
slot has settled on its new primary, which gets the function library on the first call that
misses it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from admission.coordination import coordinator as coordinator_module
from admission.coordination.clients import call_keys, fence_key, registry_key, route_key, slot_of
from admission.coordination.protocol import parse_scope
from admission.core import AdmissionRejected, AdmissionRequest, Estimate, Profile
from tests.admission.coordination.conftest import Deployment, run, settle, until
from tests.admission.coordination.test_processes import Drivers, document, wait_for
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedisCluster

SETTINGS = {"lease_ttl_ms": 6000, "heartbeat_ms": 100, "recovery_grace_ms": 400, "timeout_ms": 300}
CEILING = 2
PROFILE = document({"concurrency": CEILING, "maxQueueWaitMs": 1500}, "reshard-v1")


@pytest.fixture
def small_cluster() -> Iterator[PrivateRedisCluster]:
    # Primaries only: the test adds one and moves a slot to it.
    cluster = PrivateRedisCluster(replicas=0, node_timeout_ms=2000)
    try:
        yield cluster
    finally:
        cluster.destroy()


def test_a_slot_moved_to_a_new_primary_under_load_keeps_every_ceiling(
    tmp_path: Path, small_cluster: PrivateRedisCluster
) -> None:
    cluster = small_cluster
    with LoopbackServer() as provider:
        provider.default = Reply(delay=0.05)
        drivers = Drivers(tmp_path, cluster.url, provider.base_url, PROFILE)
        key = route_key(drivers.prefix, "ws")
        slot = slot_of(key)
        source = cluster.primary_of(key)
        try:
            for principal in ("alice", "bob"):
                drivers.start(
                    settings=SETTINGS, principal=principal, concurrency=4, seconds=40, complete=120
                )
            wait_for(lambda: len(provider.requests) >= 20, 30, "calls did not start")
            # A primary the cluster did not have when the processes started (nor its library).
            target = cluster.add_node()
            assert "sluice_" not in cluster.cli(target, "function", "list")
            cluster.begin_migration(slot, source, target)
            begun = _now()
            # The keys go ten at a time (as `redis-cli --cluster reshard` moves them), and the
            # processes try to decide between the moves: the workspace's state is split between
            # two nodes for a while.
            moved = 0
            while True:
                seen = len(drivers.lines())
                count = cluster.migrate_keys(slot, source, target, 10)
                if not count:
                    break
                moved += count
                wait_for(lambda seen=seen: len(drivers.lines()) >= seen + 4, 30, "no decisions")
            # Split for long enough to be seen (the checks skip its first 0.5 s).
            wait_for(lambda: _now() > begun + 1.0, 5, "the clock stood still")
            cluster.end_migration(slot, target)
            ended = _now()
            assert cluster.primary_of(key) == target
            sent = len(provider.requests)
            wait_for(
                lambda: len(provider.requests) >= sent + 10,
                30,
                "admission did not resume on the new primary",
            )
            drivers.wait(timeout=90)
        finally:
            drivers.stop()
    lines = drivers.lines()
    during = [line for line in lines if begun + 0.5 < line["at"] < ended]
    reasons = Counter(line.get("reason") for line in during if line["decision"] == "reject")
    figures = {
        "keys_moved": moved,
        "calls": len(provider.requests),
        "max_in_flight": provider.max_in_flight,
        "refusals_while_moving": dict(reasons),
    }
    print(figures)
    assert moved >= 10, figures
    # While the slot moved nothing ran in it: typed refusals (or waits that timed out), no admit.
    assert reasons["coordination-unavailable"] >= 1, figures
    assert set(reasons) <= {"coordination-unavailable", "queue-timeout"}, figures
    assert not [line for line in during if line["decision"] == "admit"], figures
    assert provider.max_in_flight <= CEILING, figures
    ids = Counter(r["body"]["id"] for r in provider.requests)
    assert max(ids.values()) == 1
    for index in range(2):
        assert sum(line["decision"] == "done" for line in drivers.lines(index)) >= 120
    # The new primary got the library from the first call that missed it.
    assert "sluice_" in cluster.cli(target, "function", "list")


def _now() -> float:
    import time

    return time.time()


def test_every_call_names_the_fence_of_its_own_slot() -> None:
    key = route_key("sluice", "ws-1")
    assert call_keys(key) == (key, "sluice:{ws-1}:fence")
    assert slot_of(call_keys(key)[1]) == slot_of(key)
    # The registry has no hash tag: a heartbeat takes its fence from a workspace of its slot.
    registry = registry_key("sluice")
    assert fence_key(registry) is None
    assert call_keys(registry) == (registry,)
    assert call_keys(registry, key) == (registry, "sluice:{ws-1}:fence")


@pytest.mark.parametrize("full_coverage", [True, False], ids=["full-coverage", "partial"])
def test_a_shard_without_a_primary_stops_the_other_shards_only_under_full_coverage(
    full_coverage: bool,
) -> None:
    """A primary with no replica to take over dies. Its workspaces are refused as
    `coordination-unavailable` either way; with `cluster-require-full-coverage yes` (Redis's
    default) the whole cluster refuses every command once the failure is agreed, so every
    workspace is; with `no` the workspaces of the other shards go on deciding."""
    cluster = PrivateRedisCluster(replicas=0, node_timeout_ms=1000, full_coverage=full_coverage)
    try:
        deployment = Deployment(cluster.url)
        lost = "ws-1"
        victim = cluster.primary_of(route_key(deployment.prefix, lost))
        healthy = next(
            name
            for name in (f"other-{i}" for i in range(1000))
            if cluster.primary_of(route_key(deployment.prefix, name)) != victim
        )
        process = deployment.process(timeout_ms=500)
        for ws in (lost, healthy):
            document = {
                "profileVersion": "v1",
                "workspace": {"concurrency": 10},
                "providers": {"llm": {"concurrency": 10}},
                "principals": {"alice": {"concurrency": 10}},
            }
            process.registry.register(Profile.from_dict(document, workspace_id=ws), sequence=1)

        def decide(ws: str) -> Any:
            return process.controller(ws).acquire(
                AdmissionRequest(uuid.uuid4().hex, "alice", ws, "llm", Estimate())
            )

        async def refused(ws: str) -> str:
            with pytest.raises(AdmissionRejected) as refusal:
                await decide(ws)
            return refusal.value.reason

        async def scenario() -> None:
            for ws in (lost, healthy):
                (await decide(ws)).release(success=True)
            await settle(deployment)
            cluster.kill(victim)
            survivors = cluster.live_ports()
            # The failure is agreed (the node timeout has passed): the survivors flag the node,
            # and under full coverage say the whole cluster is down.
            await until(
                lambda: all(cluster.sees_failed(port, victim) for port in survivors), timeout=60
            )
            if full_coverage:
                await until(
                    lambda: all(cluster.state(port) == "fail" for port in survivors), timeout=60
                )
            else:
                assert all(cluster.state(port) == "ok" for port in survivors)
            assert await refused(lost) == "coordination-unavailable"
            if full_coverage:
                assert await refused(healthy) == "coordination-unavailable"
            else:
                # (Not settled: what the refused call left to withdraw in the lost shard waits
                # for a primary there, however long.)
                for _ in range(3):
                    (await decide(healthy)).release(success=True)

        run(deployment, scenario, timeout=120)
    finally:
        cluster.destroy()


def test_grant_connections_follow_the_slots_where_a_process_waits_within_a_bound(
    redis_cluster: PrivateRedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process listens for grants with one blocking connection per hash slot where one of its
    waiters waits, never more than `LISTEN_CONNECTIONS` per node, and none where nobody waits:
    deciding in many workspaces costs no connection, and every waiter still gets its grant."""
    monkeypatch.setattr(coordinator_module, "LISTEN_CONNECTIONS", 2)
    deployment = Deployment(redis_cluster.url)
    spaces = [f"ws-{i}" for i in range(24)]
    holder = deployment.process()
    waiting = deployment.process(timeout_ms=1000)
    for ws in spaces:
        document = {
            "profileVersion": "v1",
            "workspace": {"concurrency": 10},
            "providers": {"llm": {"concurrency": 1, "maxQueueWaitMs": 60_000}},
            "principals": {"alice": {"concurrency": 10}},
        }
        for process in (holder, waiting):
            process.registry.register(Profile.from_dict(document, workspace_id=ws), sequence=1)
    slots = {slot_of(route_key(deployment.prefix, ws)) for ws in spaces}
    nodes = {redis_cluster.primary_of(route_key(deployment.prefix, ws)) for ws in spaces}

    def decide(process: Any, ws: str) -> Any:
        return process.controller(ws).acquire(
            AdmissionRequest(uuid.uuid4().hex, "alice", ws, "llm", Estimate())
        )

    def connections() -> dict[int, int]:
        """The waiting process's grant connections on each primary (not counting the one its
        client learnt the cluster's map of slots on)."""
        name = f"name=sluice-grants:{waiting.coordinator.process_id} "
        return {
            port: sum(
                name in line and " cmd=cluster|" not in line
                for line in redis_cluster.cli(port, "client", "list").splitlines()
            )
            for port in redis_cluster.primaries()
        }

    async def scenario() -> None:
        # Decisions without a wait: nothing to listen for.
        for ws in spaces:
            (await decide(waiting, ws)).release(success=True)
        await settle(deployment)
        assert waiting.coordinator.listening == set()
        assert sum(connections().values()) == 0
        # A waiter in every workspace.
        held = [await decide(holder, ws) for ws in spaces]
        waiters = [asyncio.ensure_future(decide(waiting, ws)) for ws in spaces]
        await until(
            lambda: all(
                int(
                    parse_scope(deployment.client.hget(deployment.key("s", ws), "V:llm")).get(
                        "q", 0
                    )
                )
                == 1
                for ws in spaces
            ),
            timeout=30,
        )
        # A listener per slot where the process waits; more of them than the connections allowed.
        await until(lambda: waiting.coordinator.listening == slots, timeout=10)
        assert len(slots) > 2 * len(nodes)
        await until(lambda: sum(connections().values()) > 0, timeout=10)
        counted = connections()
        assert 0 < sum(counted.values()) <= 2 * len(nodes), counted
        assert max(counted.values()) <= 2, counted
        for lease in held:
            lease.release(success=True)
        granted = await asyncio.wait_for(asyncio.gather(*waiters), 60)
        assert max(connections().values()) <= 2
        for lease in granted:
            lease.release(success=True)
        await settle(deployment)
        # Nobody waits any more: every listener stops.
        await until(lambda: waiting.coordinator.listening == set(), timeout=10)

    try:
        run(deployment, scenario, timeout=120)
    finally:
        deployment.cleanup()
