"""An attempt's record says why admission deferred it (`deferredBy`): the reasons of its own
deferrals, or its lane's when it only waited behind earlier requests of that lane; none when it
did not wait."""

from __future__ import annotations

import asyncio

from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.deferrals import DeferralLog
from evaluator.engine.estimates import default_estimate
from evaluator.engine.outcomes import AttemptRecord
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import profile, registry_with, request, ruleset_doc, run_virtual

OTHER = "principal-9a1b"


def attempts(results):
    return [a for result in results for d in result.decisions for a in d.attempts]


def test_attempts_record_the_reasons_they_were_deferred_for():
    async def main(loop):
        # Two principals share a workspace of two permits; each may run two at once.
        prof = profile(
            workspace={"concurrency": 2},
            principals={
                "principal-7d2e": {"concurrency": 2},
                OTHER: {"concurrency": 2},
            },
        )
        registry = registry_with(loop, prof)
        log = DeferralLog()
        fake = FakeAdapter(default=FakeStep(latency_ms=50))
        scheduler = {"enabled": True, "bindingConcurrency": 2}
        runs = [
            evaluate_decision_ruleset(
                request(ruleset_doc(4), scheduler=scheduler),
                registry=registry,
                adapters={"fake": fake},
                deferrals=log,
            ),
            evaluate_decision_ruleset(
                request(ruleset_doc(4), principal_id=OTHER, scheduler=scheduler),
                registry=registry,
                adapters={"fake": fake},
                deferrals=log,
            ),
        ]
        return await asyncio.gather(*runs)

    found = attempts(run_virtual(main))
    assert len(found) == 8 and all(a.evidence["decision"] == "admit" for a in found)
    waited = [a for a in found if a.evidence["queueDelayMs"] > 0]
    assert waited, "the shared workspace permits made some attempts wait"
    for record in waited:
        assert record.deferred_by == ("concurrency",), record
        assert record.to_dict()["deferredBy"] == ["concurrency"]
    # The first of each run were admitted at once: nothing deferred them. (On virtual time a
    # request woken at the instant it was queued is deferred with no delay.)
    assert {a.deferred_by for a in found} == {None, ("concurrency",)}
    for record in found:
        if record.deferred_by is None:
            assert "deferredBy" not in record.to_dict() and record.evidence["queueDelayMs"] == 0
    # The reasons travel with the record (receipts, the run's attempts).
    again = AttemptRecord.from_dict(waited[0].to_dict())
    assert again.deferred_by == ("concurrency",)


def test_a_token_bucket_deferral_is_named_and_an_undeferred_run_names_none():
    async def main(loop):
        prof = profile(providers={"fake": {"concurrency": 64, "tokensPerSecond": 2000}})
        registry = registry_with(loop, prof)
        log = DeferralLog()
        fake = FakeAdapter(default=FakeStep(latency_ms=5))
        scheduler = {"enabled": True, "bindingConcurrency": 8}

        def estimate(decision, target, prompt):
            # Three calls of 1500 tokens against a bucket of 2000 a second: two must wait.
            found = default_estimate(decision, target, prompt)
            found.tokens = 1500
            return found

        deferred = await evaluate_decision_ruleset(
            request(ruleset_doc(3), scheduler=scheduler),
            registry=registry,
            adapters={"fake": fake},
            estimate=estimate,
            deferrals=log,
        )
        calm = await evaluate_decision_ruleset(
            request(ruleset_doc(2)),
            registry=registry_with(loop, profile()),
            adapters={"fake": fake},
            deferrals=log,
        )
        return deferred, calm

    deferred, calm = run_virtual(main)
    records = attempts([deferred])
    assert sum(a.evidence["queueDelayMs"] > 0 for a in records) == 2
    assert {a.deferred_by for a in records} == {None, ("tokens-per-second",)}
    assert all(a.deferred_by is None for a in attempts([calm]))


def test_a_host_that_does_not_ask_records_no_reasons():
    async def main(loop):
        prof = profile(providers={"fake": {"concurrency": 64, "tokensPerSecond": 2000}})
        fake = FakeAdapter(default=FakeStep(latency_ms=5))

        def estimate(decision, target, prompt):
            found = default_estimate(decision, target, prompt)
            found.tokens = 1500
            return found

        return await evaluate_decision_ruleset(
            request(ruleset_doc(3), scheduler={"enabled": True, "bindingConcurrency": 8}),
            registry=registry_with(loop, prof),
            adapters={"fake": fake},
            estimate=estimate,
        )

    records = attempts([run_virtual(main)])
    assert sum(a.evidence["queueDelayMs"] > 0 for a in records) == 2
    assert all(a.deferred_by is None for a in records)
