"""CNC-ADMIT-018, CNC-ADMIT-AUDIT-001 and CNC-ADMIT-DRILL-001: profiles, audit, rollback drill."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    Profile,
    ProfileConflictError,
    VirtualTimeLoop,
)

from .conftest import WORKSPACE, make_profile, rejection_of, request

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def test_CNC_ADMIT_018_queued_work_is_revalidated_against_a_tightened_profile(scenario_factory):
    loose = make_profile(
        version="loose", principals={"alice": {"concurrency": 1}, "bob": {"concurrency": 1}}
    )
    s = scenario_factory(loose)

    async def body(s):
        holder = await s.admit(request(budget="h"))
        big = s.start(request(budget="big", batch_size=50))
        small = s.start(request(budget="small", batch_size=2))
        await s.settle()
        tight = make_profile(
            version="tight",
            principals={"alice": {"concurrency": 1, "maxBatchSize": 10}, "bob": {"concurrency": 1}},
        )
        s.registry.register(tight)
        await s.settle()
        # The head queued under the old profile is rejected by the new one at once.
        assert rejection_of(big).reason == "batch-size"
        assert not small.done()
        holder.release()
        await s.settle()
        small.result().release()
        # Restoring the old revision is a rollback that gives the capacity back.
        s.registry.register(loose)
        (await s.admit(request(budget="again", batch_size=50))).release()
        kinds = [r.kind for r in s.registry.profile_history(WORKSPACE)]
        assert kinds == ["initial", "change", "rollback"]

    s.run(body)


def test_CNC_ADMIT_018_removing_a_principal_rejects_its_queued_work(scenario_factory):
    s = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))

    async def body(s):
        holder = await s.admit(request(budget="h"))
        waiting = s.start(request(budget="w"))
        await s.settle()
        s.registry.register(make_profile(version="v2", principals={"bob": {"concurrency": 1}}))
        await s.settle()
        assert rejection_of(waiting).reason == "unconfigured-principal"
        holder.release()  # a lease from the old profile still releases cleanly
        assert s.controller.snapshot("alice") == (0, 0)

    s.run(body)


def test_CNC_ADMIT_AUDIT_001_change_records_digests_and_conflicts():
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock)
    records = []
    registry.on_profile_change(records.append)
    registry.on_profile_change(lambda record: 1 / 0)  # a failing listener breaks nothing
    v1 = make_profile(version="v1")
    v2 = make_profile(version="v2", workspace={"concurrency": 5})
    registry.register(v1)
    registry.register(v1)  # the current revision again changes nothing
    registry.register(v2)
    conflicting = make_profile(version="v1", workspace={"concurrency": 7})
    with pytest.raises(ProfileConflictError) as raised:
        registry.register(conflicting)
    assert raised.value.existing_digest == v1.profile_digest
    assert registry.current_profile(WORKSPACE) is v2  # nothing changed
    registry.register(Profile.from_dict(v1.to_dict(), workspace_id=WORKSPACE))
    history = [r.to_dict() for r in registry.profile_history(WORKSPACE)]
    assert [r["kind"] for r in history] == ["initial", "change", "rollback"]
    assert [r["previousProfileVersion"] for r in history] == [None, "v1", "v2"]
    assert history[2]["digest"] == history[0]["digest"] == v1.digest
    assert history[2]["profileDigest"] == v1.profile_digest
    assert history[1]["digest"] != history[0]["digest"]
    assert history[0]["schema"] == "decision-admission-profile-change/v1"
    assert history[0]["workspaceId"] == WORKSPACE
    assert [r.to_dict() for r in records] == history
    loop.close()


def test_CNC_ADMIT_AUDIT_001_manifest_profile_digest():
    manifest = json.loads((MANIFESTS / "load-manifest.v2.json").read_text())
    registry = AdmissionRegistry()
    registry.register(Profile.from_manifest(manifest, workspace_id="ws"))
    [record] = registry.profile_history("ws")
    assert record.profile_digest == (
        "sha256:e88407c56f96adc79c87a5ff7ae8d45d90291eeecb242db2a9417e121ad3464b"
    )


def test_CNC_ADMIT_AUDIT_001_eviction_never_forgets_revisions():
    registry = AdmissionRegistry(max_idle_scopes=1)
    for i in range(5):
        profile = make_profile(version="v1")
        registry.register(Profile.from_dict(profile.to_dict(), workspace_id=f"ws-{i}"))
        held = registry.controller(f"ws-{i}")
        assert held is not None

    async def use(workspace_id: str) -> None:
        controller = registry.controller(workspace_id)
        lease = await controller.acquire(request(workspace=workspace_id))
        lease.release()
        controller.release_budget("inv-1")

    for i in range(5):
        asyncio.run(use(f"ws-{i}"))
    assert len(registry._controllers) < 5  # idle controllers were evicted
    # A conflicting revision is still refused, and a rollback is still a rollback.
    conflicting = make_profile(version="v1", workspace={"concurrency": 1}).to_dict()
    with pytest.raises(ProfileConflictError):
        registry.register(Profile.from_dict(conflicting, workspace_id="ws-0"))
    v2 = Profile.from_dict(make_profile(version="v2").to_dict(), workspace_id="ws-0")
    registry.register(v2)
    registry.register(Profile.from_dict(make_profile(version="v1").to_dict(), workspace_id="ws-0"))
    assert [r.kind for r in registry.profile_history("ws-0")] == ["initial", "change", "rollback"]


def test_evicted_controller_reference_keeps_working():
    registry = AdmissionRegistry(max_idle_scopes=0)
    profile = make_profile(principals={"alice": {"concurrency": 1}})
    old = registry.register(profile)

    async def scenario():
        lease = await old.acquire(request(budget="a"))
        lease.release()
        old.release_budget("a")
        assert old.evicted
        fresh = registry.controller(WORKSPACE)
        held = await fresh.acquire(request(budget="b"))
        # The stale reference reaches the live state: alice's one permit is taken.
        waiting = asyncio.ensure_future(old.acquire(request(budget="c")))
        await asyncio.sleep(0)
        assert old.snapshot("alice") == (1, 1)
        held.release()
        (await waiting).release()

    asyncio.run(scenario())


def test_CNC_ADMIT_DRILL_001_breaker_shed_tighten_restore():
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock, rng=random.Random(11))
    normal_doc = {
        "profileVersion": "prod-7",
        "workspace": {"concurrency": 4, "maxQueueLength": 2, "maxQueueWaitMs": 2000},
        "providers": {
            "jev": {
                "concurrency": 4,
                "circuitBreaker": {"failureThreshold": 3, "openMs": 5000, "halfOpenMaxCalls": 1},
            }
        },
        "principals": [{"id": "tenant", "class": "quiet", "limits": {"concurrency": 4}}],
    }
    normal = Profile.from_dict(normal_doc, workspace_id="drill")
    controller = registry.register(normal)
    original = registry.profile_history("drill")[0]

    async def drill() -> None:
        def req(budget):
            return request("tenant", "jev", budget, workspace="drill")

        # 1. Provider failures open the breaker.
        for i in range(3):
            (await controller.acquire(req(f"f{i}"))).release(success=False)
        assert controller.breaker_transitions()[-1].to_state == "open"
        # 2. Load is shed with a retryable hint: the queue fills and overflow is refused.
        waiting = [asyncio.ensure_future(controller.acquire(req(f"w{i}"))) for i in range(2)]
        await asyncio.sleep(0)
        try:
            await controller.acquire(req("overflow"))
        except AdmissionRejected as error:
            shed = error
        assert shed.reason == "queue-full" and shed.retryable
        assert 2500 <= shed.retry_after_ms <= 7500  # jittered around the open breaker's 5 s
        assert shed.evidence.breaker_state == "open"
        await asyncio.sleep(2)
        for task in waiting:
            assert rejection_of(task).reason == "queue-timeout"
        # 3. An approved tighter profile is registered.
        tight_doc = json.loads(json.dumps(normal_doc))
        tight_doc["profileVersion"] = "prod-7-degraded"
        tight_doc["providers"]["jev"]["concurrency"] = 1
        registry.register(Profile.from_dict(tight_doc, workspace_id="drill"))
        await asyncio.sleep(3)
        probe = await controller.acquire(req("probe"))
        # 4. Evidence holds the transitions.
        assert [t.to_state for t in probe.evidence.breaker_transitions] == ["half-open"]
        second = asyncio.ensure_future(controller.acquire(req("second")))
        await asyncio.sleep(0)
        assert not second.done()  # one permit under the degraded profile
        probe.release(success=True)
        assert probe.evidence.breaker_transitions[-1].to_state == "closed"
        (await second).release(success=True)
        # 5. The previous profile is restored with its original digest.
        registry.register(Profile.from_dict(normal_doc, workspace_id="drill"))
        restored = registry.profile_history("drill")[-1]
        assert restored.kind == "rollback"
        assert (restored.digest, restored.profile_digest) == (
            original.digest,
            original.profile_digest,
        )
        # 6. Capacity comes back: four at once again.
        leases = [await controller.acquire(req(f"r{i}")) for i in range(4)]
        assert all(lease.evidence.queue_delay_ms == 0 for lease in leases)
        for lease in leases:
            lease.release(success=True)
        states = [(t.from_state, t.to_state) for t in controller.breaker_transitions()]
        assert states == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]

    loop.run_until_complete(drill())
    loop.close()


def test_static_rules_hold_for_a_principal_first_seen_after_a_profile_change(scenario_factory):
    s = scenario_factory(make_profile(version="v1"))

    async def body(s):
        (await s.admit(request("alice", budget="before"))).release()
        s.registry.register(
            make_profile(
                version="v2",
                principals={"alice": {"concurrency": 5}, "dave": {"concurrency": 5, "maxItems": 3}},
            )
        )
        # dave's lane is new under v2: its static rules are v2's, checked from the first call.
        return (await s.reject(request("dave", budget="big", items=4))).reason

    assert s.run(body) == "too-many-items"
