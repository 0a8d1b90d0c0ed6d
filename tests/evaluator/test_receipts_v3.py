"""CNC-RECEIPT-V3: durable parallel runs. Receipt-backed runs use the scheduler ceiling, every
call in flight holds a durable slot, a crash anywhere resumes without sending anything twice, and
a receipt left by the v2 release still resumes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.core import CancelSignal
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.receipts import (
    RECEIPT_SCHEMA,
    InMemoryReceiptStore,
    ReceiptKey,
    pending_slots,
)
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import (
    PRINCIPAL,
    decision_doc,
    profile,
    registry_with,
    request,
    ruleset_doc,
    run_virtual,
)
from tests.evaluator.stores import PassThroughStore

V2_RUNNING = Path(__file__).parent / "fixtures" / "receipt-v2-running.json"


class RecordingStore(PassThroughStore):
    """Passes everything through to ``inner`` and keeps every document written and every slot
    write, in order."""

    def __init__(self, inner):
        super().__init__(inner)
        self.written = []
        self.slot_writes = []

    async def create(self, key, document):
        await super().create(key, document)
        self.written.append(json.loads(json.dumps(document)))

    async def add_slots(self, key, slots, *, claim):
        await super().add_slots(key, slots, claim=claim)
        self.slot_writes.append(json.loads(json.dumps(list(slots))))

    async def update(self, key, document, *, expected_revision, settled=()):
        await super().update(key, document, expected_revision=expected_revision, settled=settled)
        self.written.append(json.loads(json.dumps(document)))


@pytest.fixture(
    params=["memory", pytest.param("database", marks=pytest.mark.django_db(transaction=True))]
)
def store_factory(request):
    if request.param == "memory":
        return InMemoryReceiptStore
    from evaluator.worker.receipts_db import DatabaseReceiptStore

    return DatabaseReceiptStore


async def close(store):
    if hasattr(store, "aclose"):
        await store.aclose()


def key_of(req):
    return ReceiptKey(req.workspace_id, req.principal_id, req.invocation_id)


def eight_everywhere():
    return profile(
        workspace={"concurrency": 8},
        providers={"fake": {"concurrency": 8}},
        principals={PRINCIPAL: {"concurrency": 8}},
    )


def test_CNC_RECEIPT_V3_001_a_receipt_backed_run_runs_at_the_ceiling(store_factory):
    def answer(call):
        # Every other decision answers "no", so the order of outputs is checkable.
        return FakeStep(latency_ms=200, answer="no" if int(call.decision_id[1:]) % 2 else "yes")

    async def main(loop):
        registry = registry_with(loop, eight_everywhere())
        fake = FakeAdapter(responder=answer)
        req = request(
            ruleset_doc(10),
            invocationId="inv-ceiling",
            callerConcurrency=8,
            graphConcurrency=8,
            scheduler={"enabled": True, "bindingConcurrency": 8},
        )
        store = RecordingStore(store_factory())
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        document = await store.load(key_of(req))
        await close(store.inner)
        return result, fake, loop.time(), document, store.written, store.slot_writes

    result, fake, elapsed, document, written, slot_writes = run_virtual(main)
    # Two waves of 200 ms: exactly 400 ms of virtual time, as without receipts.
    assert elapsed == pytest.approx(0.4, abs=1e-9)
    assert result.status == "completed" and result.concurrency == 8
    assert result.max_active == 8 and fake.max_active == 8
    assert [d.decision_id for d in result.decisions] == [f"d{i}" for i in range(10)]
    assert [d.output for d in result.decisions] == ["yes", "no"] * 5
    assert document["schema"] == RECEIPT_SCHEMA and document["state"] == "completed"
    assert document["maxPendingDispatches"] == 8
    assert document["pendingDispatches"] == []
    # The eight slots of the first wave went in one write, before any call.
    assert {slot["decisionId"] for slot in slot_writes[0]} == {f"d{i}" for i in range(8)}
    assert sorted(slot["decisionId"] for batch in slot_writes for slot in batch) == sorted(
        f"d{i}" for i in range(10)
    )
    assert max(len(doc["pendingDispatches"]) for doc in written) <= 8
    # At most two writes per decision on the success path, creation and close included.
    assert len(written) + len(slot_writes) <= 2 * 10


def test_CNC_RECEIPT_V3_002_no_call_starts_before_its_slot_is_durable():
    """At every adapter call the durable receipt already names that call's slot."""

    async def main(loop):
        store = InMemoryReceiptStore()
        registry = registry_with(loop, eight_everywhere())
        req = request(
            ruleset_doc(12),
            invocationId="inv-durable",
            scheduler={"enabled": True, "bindingConcurrency": 8},
        )
        seen = []

        def check(call):
            durable = store.document(key_of(req))
            seen.append(
                any(
                    slot["decisionId"] == call.decision_id and slot["number"] == call.attempt
                    for slot in durable["pendingDispatches"]
                )
            )
            return FakeStep(latency_ms=50)

        fake = FakeAdapter(responder=check)
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        return result, seen

    result, seen = run_virtual(main)
    assert result.status == "completed" and result.max_active == 8
    assert len(seen) == 12 and all(seen)


def test_CNC_RECEIPT_V3_003_a_disabled_scheduler_keeps_a_receipt_backed_run_serial():
    async def main(loop):
        store = InMemoryReceiptStore()
        registry = registry_with(loop, eight_everywhere())
        fake = FakeAdapter(default=FakeStep(latency_ms=100))
        req = request(
            ruleset_doc(4),
            invocationId="inv-serial",
            scheduler={"enabled": False, "bindingConcurrency": 8},
        )
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        return result, fake, loop.time(), store.document(key_of(req))

    result, fake, elapsed, document = run_virtual(main)
    assert elapsed == pytest.approx(0.4)
    assert result.concurrency == 1 and fake.max_active == 1
    assert document["maxPendingDispatches"] == 1


def test_CNC_RECEIPT_V3_004_cancel_ends_every_call_in_flight(store_factory):
    async def main(loop):
        registry = registry_with(loop, eight_everywhere())
        fake = FakeAdapter(default=FakeStep(hang=True))
        caller = CancelSignal()
        loop.call_later(0.05, caller.cancel, "caller-gave-up")
        req = request(
            ruleset_doc(12),
            invocationId="inv-cancel",
            signal=caller,
            scheduler={"enabled": True, "bindingConcurrency": 8},
        )
        store = store_factory()
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        document = await store.load(key_of(req))
        await close(store)
        return result, fake, loop.time(), document

    result, fake, elapsed, document = run_virtual(main)
    assert elapsed == pytest.approx(0.05)
    assert result.status == "cancelled"
    assert len(fake.calls) == 8 and all(call.result == "cancelled" for call in fake.calls)
    statuses = [d.status for d in result.decisions]
    # The eight calls in flight were sent: their outcome is unknown. The rest never started.
    assert statuses == ["execution-uncertain"] * 8 + ["cancelled"] * 4
    assert all(d.attempts[-1].reason == "cancelled" for d in result.decisions[:8])
    assert document["state"] == "cancelled"
    assert document["pendingDispatches"] == [] and document["maxPendingDispatches"] == 8
    assert [entry["status"] for entry in document["decisions"]] == statuses


def test_CNC_RECEIPT_V3_005_a_v2_receipt_resumes_upgraded_to_v3_in_one_write(store_factory):
    v2 = json.loads(V2_RUNNING.read_text())

    async def main(loop):
        registry = registry_with(loop, eight_everywhere())
        fake = FakeAdapter(default=FakeStep(latency_ms=200))
        req = request(
            ruleset_doc(6),
            invocationId="inv-v2-upgrade",
            scheduler={"enabled": True, "bindingConcurrency": 4},
        )
        store = RecordingStore(store_factory())
        await store.inner.create(key_of(req), v2)
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=store
        )
        document = await store.load(key_of(req))
        await close(store.inner)
        return result, fake, loop.time(), document, store.written

    result, fake, elapsed, document, written = run_virtual(main)
    assert v2["schema"].endswith("/v2") and v2["pendingDispatch"]["decisionIndex"] == 1
    # The first write of the resumed run is the upgrade, with d1's slot resolved in it.
    upgrade = written[0]
    assert upgrade["schema"] == RECEIPT_SCHEMA and upgrade["revision"] == v2["revision"] + 1
    assert "pendingDispatch" not in upgrade and upgrade["pendingDispatches"] == []
    assert upgrade["decisions"][1]["status"] == "execution-uncertain"
    assert upgrade["decisions"][1]["attempts"][-1]["reason"] == "dispatch-unconfirmed"
    assert upgrade["decisions"][0] == v2["decisions"][0]
    # d0 (done) and d1 (maybe sent) are never called again; d2..d5 run four at once.
    assert sorted(call.decision_id for call in fake.calls) == ["d2", "d3", "d4", "d5"]
    assert fake.max_active == 4 and elapsed == pytest.approx(0.2)
    assert result.resumed is True
    assert [d.status for d in result.decisions] == [
        "succeeded",
        "execution-uncertain",
        "succeeded",
        "succeeded",
        "succeeded",
        "succeeded",
    ]
    assert document["schema"] == RECEIPT_SCHEMA and document["state"] == "completed"
    assert document["maxPendingDispatches"] == 4


def test_pending_slots_reads_both_schemas():
    v2 = json.loads(V2_RUNNING.read_text())
    (slot,) = pending_slots(v2)
    assert (slot["decisionId"], slot["decisionIndex"], slot["number"]) == ("d1", 1, 1)
    assert pending_slots({**v2, "pendingDispatch": None}) == []
    v3 = {"schema": RECEIPT_SCHEMA, "pendingDispatches": [slot, {**slot, "decisionIndex": 2}]}
    assert len(pending_slots(v3)) == 2


# ----------------------------------------------------------------- crash anywhere


class SimulatedCrash(Exception):
    """The process stops: this write and everything after it are lost."""


class CrashingStore(PassThroughStore):
    """Fails the ``crash_at``-th write (slot write or document update) of one run; with
    ``applied`` the write lands first (the commit reached the database but its answer never came
    back)."""

    def __init__(self, inner, crash_at, applied):
        super().__init__(inner)
        self.crash_at = crash_at
        self.applied = applied
        self.writes = 0

    async def add_slots(self, key, slots, *, claim):
        await self._write(key, super().add_slots(key, slots, claim=claim))

    async def update(self, key, document, *, expected_revision, settled=()):
        await self._write(
            key,
            super().update(key, document, expected_revision=expected_revision, settled=settled),
        )

    async def _write(self, key, write):
        self.writes += 1
        if self.writes == self.crash_at:
            if self.applied:
                await write
            else:
                write.close()
            raise SimulatedCrash
        await write


STEP = st.builds(
    FakeStep,
    latency_ms=st.integers(min_value=0, max_value=60),
    answer=st.sampled_from(["yes", "no"]),
    error=st.sampled_from([None, None, "server-error", "rate-limited", "uncertain"]),
    retry_after_ms=st.sampled_from([None, 5]),
)
DECISION = st.fixed_dictionaries(
    {
        "steps": st.lists(STEP, min_size=1, max_size=3),
        "max_attempts": st.integers(min_value=1, max_value=3),
        "fallback": st.booleans(),
    }
)


def crash_ruleset(decisions):
    docs = []
    for index, spec in enumerate(decisions):
        fallbacks = [{"adapter": "fake", "model": "model-b", "timeoutMs": 10_000}]
        docs.append(
            decision_doc(
                f"d{index}",
                fallbacks=fallbacks if spec["fallback"] else None,
                retry={"maxAttempts": spec["max_attempts"], "initialBackoffMs": 10},
            )
        )
    return {"id": "crashes", "decisions": docs}


def run_with_crashes(decisions, ceiling, crashes, *, store=None, invocation_id="inv-crashes"):
    """Run to the end, stopping at each ``(write number, applied)`` of ``crashes`` in turn and
    resuming from the durable receipt (in ``store``, a fresh ``InMemoryReceiptStore`` when None);
    returns the result, the fake adapter, the slots that were pending in the durable receipt at
    each stop and the final document."""
    script = {f"d{i}": list(spec["steps"]) for i, spec in enumerate(decisions)}

    async def main(loop):
        registry = registry_with(loop, eight_everywhere())
        fake = FakeAdapter(script, default=FakeStep(latency_ms=5))
        inner = InMemoryReceiptStore() if store is None else store
        req = request(
            crash_ruleset(decisions),
            invocationId=invocation_id,
            scheduler={"enabled": True, "bindingConcurrency": ceiling},
        )
        stops = []
        for crash_at, applied in crashes:
            crashing = CrashingStore(inner, crash_at, applied)
            try:
                result = await evaluate_decision_ruleset(
                    req, registry=registry, adapters={"fake": fake}, receipt_store=crashing
                )
            except SimulatedCrash:
                # What is durable once the stopped run is gone (a write under way when it
                # stopped may still have landed).
                stops.append(pending_slots(await inner.load(key_of(req)) or {}))
                continue
            return result, fake, stops, await inner.load(key_of(req))
        result = await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, receipt_store=inner
        )
        return result, fake, stops, await inner.load(key_of(req))

    return run_virtual(main)


CRASH_CASES = {
    "decisions": st.lists(DECISION, min_size=1, max_size=8),
    "ceiling": st.integers(min_value=1, max_value=8),
    "crashes": st.lists(
        st.tuples(st.integers(min_value=1, max_value=12), st.booleans()), max_size=6
    ),
}


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(**CRASH_CASES)
def test_CNC_RECEIPT_V3_006_property_a_crash_at_any_write_never_sends_an_attempt_twice(
    decisions, ceiling, crashes
):
    uninterrupted, _, _, _ = run_with_crashes(decisions, ceiling, [])
    check_crash_run(len(decisions), uninterrupted, *run_with_crashes(decisions, ceiling, crashes))


DATABASE_EXAMPLES = itertools.count()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=60,
    deadline=None,
    # One database for every example: each example's runs use invocation ids of their own.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(**CRASH_CASES)
def test_CNC_RECEIPT_V3_006_property_a_crash_on_postgresql_never_sends_an_attempt_twice(
    decisions, ceiling, crashes
):
    from evaluator.worker.receipts_db import DatabaseReceiptStore

    example = next(DATABASE_EXAMPLES)
    store = DatabaseReceiptStore()
    try:
        uninterrupted, _, _, _ = run_with_crashes(
            decisions, ceiling, [], store=store, invocation_id=f"inv-pg-{example}-whole"
        )
        crashed = run_with_crashes(
            decisions, ceiling, crashes, store=store, invocation_id=f"inv-pg-{example}-crashes"
        )
    finally:
        run_virtual(lambda loop: close(store))
    check_crash_run(len(decisions), uninterrupted, *crashed)


def check_crash_run(decisions, uninterrupted, result, fake, stops, document):
    """What a run stopped and resumed at any writes must show against the same run whole."""
    sent = [(call.decision_id, call.model, call.attempt) for call in fake.calls]
    assert len(sent) == len(set(sent)), "an attempt reached the adapter twice"
    assert result.status == "completed" and document["state"] == "completed"
    assert document["pendingDispatches"] == []
    assert [d.decision_id for d in result.decisions] == [f"d{i}" for i in range(decisions)]

    uncertain = {}
    for slots in stops:
        for slot in slots:
            uncertain[slot["decisionId"]] = slot
    for index, decision in enumerate(result.decisions):
        slot = uncertain.get(decision.decision_id)
        if slot is not None:
            # A call that may have gone out is that attempt's uncertain record, never re-sent.
            assert decision.status == "execution-uncertain"
            last = decision.attempts[-1]
            assert (last.reason, last.sent) == ("dispatch-unconfirmed", True)
            assert (last.target_index, last.number) == (slot["targetIndex"], slot["number"])
        else:
            expected = uninterrupted.decisions[index]
            assert (decision.status, decision.output) == (expected.status, expected.output)
            assert [(a.target_index, a.number, a.outcome) for a in decision.attempts] == [
                (a.target_index, a.number, a.outcome) for a in expected.attempts
            ]
