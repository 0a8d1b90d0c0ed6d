"""CNC-ADMIT-RECEIPT: rejections, uncertain dispatches and resume, with in-memory and DB stores."""

from __future__ import annotations

import asyncio

import pytest

from admission.core import AdmissionRequest, CancelSignal, Estimate
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.estimates import default_estimate
from evaluator.engine.receipts import InMemoryReceiptStore, ReceiptKey
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import (
    PRINCIPAL,
    WORKSPACE,
    decision_doc,
    profile,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)

OTHER = "principal-blocker"


class SimulatedCrash(Exception):
    """The process dies: nothing after this point is written."""


class CrashAfterDispatch:
    """Passes writes through until the pending-dispatch slot is durable, then crashes."""

    def __init__(self, inner):
        self.inner = inner
        self.armed = False

    async def load(self, key):
        return await self.inner.load(key)

    async def create(self, key, document):
        await self.inner.create(key, document)

    async def claim(self, key):
        return await self.inner.claim(key)

    async def add_slots(self, key, slots, *, claim):
        if self.armed:
            raise SimulatedCrash
        await self.inner.add_slots(key, slots, claim=claim)
        self.armed = True

    async def update(self, key, document, *, expected_revision, settled=()):
        if self.armed:
            raise SimulatedCrash
        await self.inner.update(key, document, expected_revision=expected_revision, settled=settled)


@pytest.fixture(
    params=["memory", pytest.param("database", marks=pytest.mark.django_db(transaction=True))]
)
def store_factory(request):
    """Builds a receipt store inside the running loop; closes DB connections afterwards."""
    if request.param == "memory":
        return lambda: InMemoryReceiptStore()
    from evaluator.worker.receipts_db import DatabaseReceiptStore

    return DatabaseReceiptStore


async def stored(store, req):
    key = ReceiptKey(req.workspace_id, req.principal_id, req.invocation_id)
    document = await store.load(key)
    if hasattr(store, "aclose"):
        await store.aclose()
    return document


def single(**target):
    return {"id": "one", "decisions": [decision_doc("d0", **target)]}


def blocked_profile(**provider):
    return profile(
        providers={"fake": {"concurrency": 1, **provider}},
        principals={PRINCIPAL: {"concurrency": 4}, OTHER: {"concurrency": 4}},
    )


async def hold_provider(registry):
    """Another principal takes the only provider permit, so our attempt must queue."""
    controller = registry.controller(WORKSPACE)
    return await controller.acquire(
        AdmissionRequest("blocker", OTHER, WORKSPACE, "fake", Estimate())
    )


def no_tokens(decision, target, prompt):
    estimate = default_estimate(decision, target, prompt)
    estimate.tokens = None
    return estimate


def no_retained_work(decision, target, prompt):
    estimate = default_estimate(decision, target, prompt)
    estimate.retained_work = None
    return estimate


def negative_tokens(decision, target, prompt):
    estimate = default_estimate(decision, target, prompt)
    estimate.tokens = -1
    return estimate


REJECTIONS = [
    # (admission reason, mapped outcome, profile kwargs, target overrides, scenario)
    (
        "requests-per-minute",
        "rate-limited",
        {"providers": {"fake": {"concurrency": 1, "requestsPerMinute": 0}}},
        {},
        None,
    ),
    (
        "tokens-per-second",
        "rate-limited",
        {"providers": {"fake": {"concurrency": 1, "tokensPerSecond": 10}}},
        {},
        None,
    ),
    (
        "attempts",
        "budget-exhausted",
        {"principals": {PRINCIPAL: {"concurrency": 1, "maxAttempts": 0}}},
        {},
        None,
    ),
    (
        "cost",
        "budget-exhausted",
        {"workspace": {"concurrency": 1, "maxCostUsd": 0.5}},
        {"costPerTokenUsd": 0.01},
        None,
    ),
    (
        "unknown-cost",
        "budget-exhausted",
        {"workspace": {"concurrency": 1, "maxCostUsd": 0.5}},
        {},
        None,
    ),
    (
        "tokens",
        "budget-exhausted",
        {"principals": {PRINCIPAL: {"concurrency": 1, "maxTokens": 5}}},
        {},
        None,
    ),
    (
        "unknown-tokens",
        "budget-exhausted",
        {"principals": {PRINCIPAL: {"concurrency": 1, "maxTokens": 500}}},
        {},
        "no-tokens",
    ),
    # The total deadline fires the request's signal at 50 ms; that timer was set before the
    # waiter's own deadline timer of the same instant, so the waiter leaves as cancelled, and a
    # cancellation a deadline (not the caller) fired is a timeout.
    ("cancelled", "timeout", None, {}, "deadline"),
    ("queue-timeout", "timeout", None, {}, "queue-timeout"),
    ("cancelled", "cancelled", None, {}, "cancel"),
    ("queue-full", "overloaded", None, {}, "queue-full"),
    ("unconfigured-provider", "overloaded", {"providers": {"other": {"concurrency": 1}}}, {}, None),
    ("unconfigured-principal", "overloaded", {"principals": {OTHER: {"concurrency": 1}}}, {}, None),
    (
        "request-too-large",
        "overloaded",
        {"workspace": {"concurrency": 1, "maxRequestBytes": 3}},
        {},
        None,
    ),
    (
        "retained-work",
        "overloaded",
        {"providers": {"fake": {"concurrency": 1, "maxRetainedWork": 0}}},
        {},
        None,
    ),
    ("invalid-estimate", "overloaded", {}, {}, "bad-estimate"),
    (
        "batch-size",
        "overloaded",
        {"providers": {"fake": {"concurrency": 1, "maxBatchSize": 0}}},
        {},
        None,
    ),
    ("too-many-items", "overloaded", {"workspace": {"concurrency": 1, "maxItems": 0}}, {}, None),
    (
        "unknown-retained-work",
        "overloaded",
        {"workspace": {"concurrency": 1, "maxRetainedWork": 4}},
        {},
        "no-retained-work",
    ),
]


@pytest.mark.parametrize(
    ("reason", "outcome", "limits", "target", "scenario"),
    REJECTIONS,
    ids=[f"{row[0]}-{row[4]}" if row[4] else row[0] for row in REJECTIONS],
)
def test_CNC_ADMIT_RECEIPT_001_every_rejection_is_recorded_not_sent_and_terminal(
    store_factory, reason, outcome, limits, target, scenario
):
    async def main(loop):
        if scenario in ("deadline", "queue-timeout", "cancel", "queue-full"):
            provider = {
                "queue-timeout": {"maxQueueWaitMs": 20},
                "queue-full": {"maxQueueLength": 0},
            }.get(scenario, {})
            prof = blocked_profile(**provider)
        else:
            prof = profile(**(limits or {}))
        registry = registry_with(loop, prof)
        fake = FakeAdapter()
        fields = {}
        signal = None
        lease = None
        if scenario in ("deadline", "queue-timeout", "cancel", "queue-full"):
            lease = await hold_provider(registry)
        if scenario == "deadline":
            fields["deadlineMs"] = 50
        if scenario == "cancel":
            signal = CancelSignal()
            loop.call_later(0.02, signal.cancel, "caller-gave-up")
        estimate = {
            "no-tokens": no_tokens,
            "bad-estimate": negative_tokens,
            "no-retained-work": no_retained_work,
        }.get(scenario)
        req = request(single(**target), signal=signal, **fields)
        store = store_factory()
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store, estimate=estimate
        )
        if lease is not None:
            lease.release(success=True)
        return result, fake, await stored(store, req)

    result, fake, document = run_virtual(main)
    assert fake.calls == []
    (decision,) = result.decisions
    (attempt,) = decision.attempts
    assert attempt.sent is False
    assert attempt.reason == reason
    assert attempt.outcome == outcome
    assert decision.status == outcome
    assert attempt.evidence is not None and attempt.evidence["decision"] == "reject"
    assert attempt.evidence["reason"] == reason
    # The receipt reached its normal terminal state, with the typed attempt in it.
    assert document["state"] == result.status
    assert document["state"] in ("completed", "cancelled", "timeout")
    assert document["pendingDispatches"] == []
    (entry,) = document["decisions"]
    assert entry["status"] == outcome
    assert entry["attempts"][0]["sent"] is False
    assert entry["attempts"][0]["reason"] == reason
    assert entry["attempts"][0]["evidence"]["reason"] == reason


def test_CNC_ADMIT_RECEIPT_002_dispatched_attempt_with_unknown_outcome_is_execution_uncertain(
    store_factory,
):
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(
            {
                "d0": [FakeStep(latency_ms=5, error="uncertain")],
                "d1": [FakeStep(hang=True)],
            },
            default=FakeStep(latency_ms=5),
        )
        ruleset = {
            "id": "uncertain",
            "decisions": [
                decision_doc("d0", retry={"maxAttempts": 3}),
                decision_doc("d1", timeoutMs=40, retry={"maxAttempts": 3}),
                decision_doc("d2"),
            ],
        }
        req = request(ruleset)
        store = store_factory()
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        return result, fake, await stored(store, req)

    result, fake, document = run_virtual(main)
    d0, d1, d2 = result.decisions
    # A non-idempotent adapter is never asked again after an unknown outcome.
    assert [c.decision_id for c in fake.calls] == ["d0", "d1", "d2"]
    assert d0.status == "execution-uncertain" and d0.attempts[0].sent is True
    assert d1.status == "execution-uncertain" and d1.attempts[0].reason == "timeout"
    assert d2.status == "succeeded"
    assert document["state"] == "completed"
    assert document["pendingDispatches"] == []
    assert [e["status"] for e in document["decisions"]] == [
        "execution-uncertain",
        "execution-uncertain",
        "succeeded",
    ]


def test_CNC_ADMIT_RECEIPT_002_a_crash_after_dispatch_resumes_as_uncertain_never_twice(
    store_factory,
):
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(default=FakeStep(latency_ms=5))
        inner = store_factory()
        req = request(ruleset_doc(3), invocationId="inv-crash-1")
        with pytest.raises(SimulatedCrash):
            await evaluate_decision_ruleset(
                req,
                registry=registry,
                adapters={"fake": fake},
                receipt_store=CrashAfterDispatch(inner),
            )
        after_crash = await stored(inner, req)
        resumed = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=inner
        )
        again = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=inner
        )
        return after_crash, resumed, again, fake, await stored(inner, req)

    after_crash, resumed, again, fake, document = run_virtual(main)
    assert after_crash["state"] == "running"
    (slot,) = after_crash["pendingDispatches"]
    assert (slot["decisionId"], slot["decisionIndex"], slot["number"]) == ("d0", 0, 1)
    assert resumed.resumed is True
    d0 = resumed.decisions[0]
    assert d0.status == "execution-uncertain"
    assert d0.attempts[-1].reason == "dispatch-unconfirmed" and d0.attempts[-1].sent is True
    assert [d.status for d in resumed.decisions[1:]] == ["succeeded", "succeeded"]
    # d0 was dispatched once, before the crash; the resumed run never sent it again.
    assert [c.decision_id for c in fake.calls] == ["d0", "d1", "d2"]
    assert document["state"] == "completed" and document["pendingDispatches"] == []
    # A finished receipt answers from itself.
    assert again.resumed is True and again.to_dict()["decisions"] == resumed.to_dict()["decisions"]


def test_CNC_ADMIT_RECEIPT_002_a_failing_estimate_callback_is_not_sent(store_factory):
    def broken(decision, target, prompt):
        raise RuntimeError("estimator is down")

    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter()
        req = request(single())
        store = store_factory()
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store, estimate=broken
        )
        return result, fake, await stored(store, req)

    result, fake, document = run_virtual(main)
    (attempt,) = result.decisions[0].attempts
    assert fake.calls == []
    assert attempt.sent is False and attempt.outcome == "estimate-failed"
    assert result.decisions[0].status != "execution-uncertain"
    assert document["state"] == "completed" and document["pendingDispatches"] == []


def test_CNC_ADMIT_RECEIPT_003_target_timeout_while_queued_is_a_timeout(store_factory):
    async def main(loop):
        registry = registry_with(loop, blocked_profile())
        fake = FakeAdapter()
        lease = await hold_provider(registry)
        req = request(single(timeoutMs=50))
        store = store_factory()
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        lease.release(success=True)
        return result, fake, loop.time(), await stored(store, req)

    result, fake, elapsed, document = run_virtual(main)
    assert fake.calls == []
    assert elapsed == pytest.approx(0.05)
    (decision,) = result.decisions
    (attempt,) = decision.attempts
    assert attempt.sent is False
    # The target's timeout fires the attempt's signal (set before the waiter's own deadline
    # timer of the same instant): cancelled by a deadline, so the outcome is timeout.
    assert attempt.reason == "cancelled"
    assert attempt.outcome == "timeout" and decision.status == "timeout"
    assert result.status == "completed"
    assert document["state"] == "completed"
    assert document["decisions"][0]["status"] == "timeout"


def test_receipt_of_another_ruleset_is_refused_before_any_call(store_factory):
    from evaluator.engine.errors import InvalidDefinitionError

    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter()
        store = store_factory()
        first = request(ruleset_doc(1), invocationId="inv-shared")
        await evaluate_decision_ruleset(
            first, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        second = request(ruleset_doc(2), invocationId="inv-shared")
        with pytest.raises(InvalidDefinitionError) as caught:
            await evaluate_decision_ruleset(
                second, registry=registry, adapters={"fake": fake}, receipt_store=store
            )
        if hasattr(store, "aclose"):
            await store.aclose()
        return caught.value, fake

    error, fake = run_virtual(main)
    assert error.field == "invocationId"
    assert len(fake.calls) == 1


def test_receipts_are_private_to_the_principal_that_made_them():
    async def main():
        store = InMemoryReceiptStore()
        mine = ReceiptKey(WORKSPACE, PRINCIPAL, "inv-1")
        theirs = ReceiptKey(WORKSPACE, OTHER, "inv-1")
        await store.create(mine, {"revision": 1, "state": "running"})
        return await store.load(theirs), await store.load(mine)

    theirs, mine = asyncio.run(main())
    assert theirs is None and mine is not None
