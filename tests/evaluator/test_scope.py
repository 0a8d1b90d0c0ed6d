"""CNC-ADMIT-SCOPE: admission state is keyed by trusted scope, not by policy object identity."""

from __future__ import annotations

import asyncio
import json

import pytest

from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import (
    WORKSPACE,
    profile_doc,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)

ALICE = "principal-alice-91"
BOB = "principal-bob-37"


def shared_profile_doc(**provider):
    return profile_doc(
        workspace={"concurrency": 8},
        providers={"fake": {"concurrency": 1, **provider}},
        principals={ALICE: {"concurrency": 4}, BOB: {"concurrency": 4}},
    )


def test_CNC_ADMIT_SCOPE_001_equal_profiles_built_per_request_share_every_ceiling():
    async def main(loop):
        registry = registry_with(loop)
        fake = FakeAdapter(default=FakeStep(latency_ms=10))
        runs = []
        for principal in (ALICE, BOB):
            # A fresh profile document and object per request, as a host building policy per call.
            fields = {
                "scheduler": {
                    "enabled": True,
                    "bindingConcurrency": 4,
                    "profile": json.loads(json.dumps(shared_profile_doc())),
                }
            }
            req = request(ruleset_doc(3), principal_id=principal, **fields)
            runs.append(evaluate_decision_ruleset(req, registry=registry, adapters={"fake": fake}))
        results = await asyncio.gather(*runs)
        return results, fake, registry, loop.time()

    results, fake, registry, elapsed = run_virtual(main)
    # One provider permit for both requests: six calls, one at a time.
    assert fake.max_active == 1
    assert elapsed == pytest.approx(0.06)
    assert all(d.succeeded for r in results for d in r.decisions)
    assert [r.kind for r in registry.profile_history(WORKSPACE)] == ["initial"]


def test_CNC_ADMIT_SCOPE_001_a_revision_reused_with_other_limits_is_invalid_before_dispatch():
    async def main(loop):
        registry = registry_with(loop)
        fake = FakeAdapter()
        first = request(
            ruleset_doc(1), principal_id=ALICE, scheduler={"profile": shared_profile_doc()}
        )
        await evaluate_decision_ruleset(first, registry=registry, adapters={"fake": fake})
        changed = shared_profile_doc(requestsPerMinute=5)
        second = request(ruleset_doc(1), principal_id=ALICE, scheduler={"profile": changed})
        with pytest.raises(InvalidDefinitionError) as caught:
            await evaluate_decision_ruleset(second, registry=registry, adapters={"fake": fake})
        return caught.value, fake

    error, fake = run_virtual(main)
    assert error.reason == "invalid-definition"
    assert error.field == "scheduler.profile.profileVersion"
    assert WORKSPACE not in str(error)
    assert len(fake.calls) == 1


def test_CNC_ADMIT_SCOPE_002_principals_with_equal_limits_do_not_share_quota():
    async def main(loop):
        doc = profile_doc(
            workspace={"concurrency": 8},
            providers={"fake": {"concurrency": 8}},
            principals={
                ALICE: {"concurrency": 1, "requestsPerMinute": 2},
                BOB: {"concurrency": 1, "requestsPerMinute": 2},
            },
        )
        registry = registry_with(loop)
        fake = FakeAdapter(default=FakeStep(latency_ms=10))
        runs = [
            evaluate_decision_ruleset(
                request(
                    ruleset_doc(2),
                    principal_id=principal,
                    scheduler={"enabled": True, "bindingConcurrency": 4, "profile": doc},
                ),
                registry=registry,
                adapters={"fake": fake},
            )
            for principal in (ALICE, BOB)
        ]
        results = await asyncio.gather(*runs)
        return results, fake, loop.time()

    results, fake, elapsed = run_virtual(main)
    # Each principal has its own permit and its own two requests per minute.
    assert fake.max_active == 2
    assert elapsed == pytest.approx(0.02)
    assert all(d.succeeded for r in results for d in r.decisions)
    assert all(r.concurrency == 1 for r in results)


def test_CNC_ADMIT_SCOPE_003_identity_comes_from_the_host_not_from_input_or_model_output():
    async def main(loop):
        doc = profile_doc(
            providers={"fake": {"concurrency": 4}},
            principals={ALICE: {"concurrency": 1, "maxAttempts": 1}},
        )
        registry = registry_with(loop)
        # The model tries to claim another identity; nothing reads identity from answers.
        fake = FakeAdapter(default=FakeStep(answer="yes"))
        hostile_input = {"text": "x", "principal": BOB, "workspace": "ws-other", "principalId": BOB}
        as_alice = request(
            ruleset_doc(2),
            principal_id=ALICE,
            input=hostile_input,
            scheduler={"profile": doc},
        )
        alice = await evaluate_decision_ruleset(
            as_alice, registry=registry, adapters={"fake": fake}
        )
        as_bob = request(ruleset_doc(1), principal_id=BOB, input=hostile_input)
        bob = await evaluate_decision_ruleset(as_bob, registry=registry, adapters={"fake": fake})
        return alice, bob, fake

    alice, bob, fake = run_virtual(main)
    # Alice's own budget of one attempt applies to her invocation, whatever the input says.
    assert [d.status for d in alice.decisions] == ["succeeded", "budget-exhausted"]
    assert alice.decisions[1].attempts[0].reason == "attempts"
    # Bob is unknown to the host profile: the input cannot vouch for him.
    assert bob.decisions[0].attempts[0].reason == "unconfigured-principal"
    assert len(fake.calls) == 1
    text = json.dumps([alice.to_dict(), bob.to_dict()])
    assert ALICE not in text and BOB not in text


def test_request_document_cannot_name_the_principal():
    with pytest.raises(InvalidDefinitionError):
        request(ruleset_doc(1), principalId=BOB)
