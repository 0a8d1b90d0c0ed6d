"""The shadow's tallies, document by document: what each side counts for admissions, deferrals,
rejections, would-be retries and breaker transitions; how tallies merge; when a copy gives its
shadow permit back and with which outcome; budgets forgotten only once no copy needs them; and
stop, on the loop and from another thread. Every scenario also checks that no shadow error
reached the event loop (a shadow must never disturb the real path)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Any

import pytest

from admission.core import AdmissionRejected, Profile, Tally, merge_tallies

from .conftest import WORKSPACE, make_profile, profile_doc, rejection_of, request


def tally(**fields: Any) -> dict[str, Any]:
    """A tally document as `Tally.to_dict` writes it: zeros, overridden by `fields`."""
    doc: dict[str, Any] = {
        "requests": 0,
        "retries": 0,
        "admitted": 0,
        "deferred": 0,
        "rejected": {},
        "retryableRejected": 0,
        "wouldRetry": 0,
        "queueDelayMs": {"total": 0.0, "max": 0.0},
        "maxQueued": 0,
        "maxRetryPressure": 0,
        "breakerTransitions": {},
    }
    unknown = set(fields) - set(doc)
    assert not unknown, f"not a tally field: {unknown}"
    doc.update(fields)
    return doc


def run_clean(scenario: Any, body: Any) -> None:
    """Run `body`, then make sure no task or callback of the shadow failed on the loop."""
    errors: list[dict[str, Any]] = []
    scenario.loop.set_exception_handler(lambda _loop, context: errors.append(context))
    scenario.run(body)
    # A failed task reports itself when it is collected.
    gc.collect()
    assert errors == []


async def admit_both(s: Any, shadow: Any, req: Any, *, retry: bool | None = None) -> tuple:
    """Mirror `req`, admit it for real and report the admission, as a host does."""
    call = shadow.mirror(req) if retry is None else shadow.mirror(req, retry=retry)
    lease = await s.admit(req)
    call.admitted(lease)
    return call, lease


def release_both(call: Any, lease: Any, **outcome: Any) -> None:
    lease.release(**outcome)
    call.released(lease, **outcome)


def shadow_outcome(shadow: Any) -> tuple[int, dict[str, int]]:
    """The shadow side's admissions and rejections since the previous drain."""
    _active, would_be = shadow.drain()
    return would_be["admitted"], would_be["rejected"]


# ------------------------------------------------------------------------- the tally documents


def test_an_empty_tally_and_a_drain_that_starts_the_counting_again(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))
    assert Tally().to_dict() == tally()

    async def body(s):
        call, lease = await admit_both(s, shadow, request())
        await s.settle()
        release_both(call, lease, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert shadow.drain() == (tally(requests=1, admitted=1), tally(requests=1, admitted=1))
    assert shadow.drain() == (tally(), tally())


def test_admissions_deferrals_retries_and_retry_pressure_on_both_sides(scenario_factory):
    scenario = scenario_factory()
    # The shadow gives alice one permit; reality runs her four requests at once.
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1}})
    )

    async def body(s):
        await asyncio.sleep(0.05)
        pairs = [
            await admit_both(s, shadow, request(budget="a")),
            # The same invocation again: a retry, and retry pressure on the provider.
            await admit_both(s, shadow, request(budget="a"), retry=True),
            await admit_both(s, shadow, request(budget="b"), retry=True),
            await admit_both(s, shadow, request(budget="c")),
        ]
        await s.settle()
        await asyncio.sleep(0.1)
        for call, lease in pairs:
            release_both(call, lease, success=True)
        while shadow.calls:
            await asyncio.sleep(0.001)
        assert s.now() == 450.0

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    assert active == tally(requests=4, retries=2, admitted=4, maxRetryPressure=1)
    # The copies ran one after another, 100 ms each: they waited 100, 200 and 300 ms.
    assert would_be == tally(
        requests=4,
        retries=2,
        admitted=4,
        deferred=3,
        queueDelayMs={"total": 600.0, "max": 300.0},
        maxQueued=2,
        maxRetryPressure=1,
    )


def test_a_wait_shorter_than_a_millisecond_is_a_deferral(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1}})
    )

    async def body(s):
        pairs = [await admit_both(s, shadow, request(budget=b)) for b in "ab"]
        await s.settle()
        await asyncio.sleep(0.0005)
        for call, lease in pairs:
            release_both(call, lease, success=True)
        await s.settle()
        await asyncio.sleep(0.001)

    run_clean(scenario, body)
    _active, would_be = shadow.drain()
    assert would_be == tally(
        requests=2,
        admitted=2,
        deferred=1,
        queueDelayMs={"total": 0.5, "max": 0.5},
    )


def test_real_rejections_are_counted_by_reason_and_give_the_shadow_permit_back(
    scenario_factory,
):
    # Reality lets alice run one request and queue none; the shadow lets her run many.
    scenario = scenario_factory(
        make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 0}})
    )
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))
    rejections: list[str] = []

    async def attempt(s, req, *, retry=False):
        call = shadow.mirror(req, retry=retry)
        try:
            lease = await s.admit(req)
        except AdmissionRejected as rejection:
            call.rejected(rejection)
            rejections.append(rejection.reason)
            return None
        call.admitted(lease)
        return call, lease

    async def body(s):
        held = await attempt(s, request(budget="a"))
        await attempt(s, request(budget="b"), retry=True)
        await attempt(s, request(budget="c"), retry=True)
        await attempt(s, request(budget="d", provider="nowhere"))
        await s.settle()
        # The copies of the two refused requests were admitted and gave their permits back at
        # once; the copy of the running request holds its permit.
        assert shadow.controller.snapshot("alice") == (1, 0)
        assert len(shadow.calls) == 1
        release_both(*held, success=True)
        await s.settle()
        assert not shadow.calls

    run_clean(scenario, body)
    assert rejections == ["queue-full", "queue-full", "unconfigured-provider"]
    active, would_be = shadow.drain()
    assert active == tally(
        requests=4,
        retries=2,
        admitted=1,
        rejected={"queue-full": 2, "unconfigured-provider": 1},
        retryableRejected=2,
    )
    assert list(active["rejected"]) == ["queue-full", "unconfigured-provider"]
    # The shadow admits what reality refused for lack of room, so nothing would be retried.
    assert would_be == tally(
        requests=4, retries=2, admitted=3, rejected={"unconfigured-provider": 1}
    )


def test_retryable_shadow_rejections_of_admitted_requests_would_retry(scenario_factory):
    # Reality: alice runs three at once and queues one. Shadow: one at once, no queue.
    scenario = scenario_factory(
        make_profile(principals={"alice": {"concurrency": 3, "maxQueueLength": 1}})
    )
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1, "maxQueueLength": 0}})
    )

    async def body(s):
        first = await admit_both(s, shadow, request(budget="a"))
        # Reality admits at once; the shadow refuses when its copy is decided, afterwards.
        second = await admit_both(s, shadow, request(budget="b"))
        second_too = await admit_both(s, shadow, request(budget="b2"), retry=True)
        # Reality queues; the shadow refuses first, reality admits 100 ms later.
        queued_req = request(budget="c")
        queued_call = shadow.mirror(queued_req)
        queued = s.start(queued_req)
        await s.settle()
        # Reality refuses too: not a retry the shadow would add.
        refused_req = request(budget="d")
        refused_call = shadow.mirror(refused_req)
        rejection = await s.reject(refused_req)
        refused_call.rejected(rejection)
        await s.settle()
        assert rejection.reason == "queue-full"
        await asyncio.sleep(0.1)
        release_both(*first, success=True)
        third = await queued
        queued_call.admitted(third)
        release_both(*second, success=True)
        release_both(*second_too, success=True)
        release_both(queued_call, third, success=True)
        await s.settle()
        assert not shadow.calls

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    assert active == tally(
        requests=5,
        retries=1,
        admitted=4,
        deferred=1,
        rejected={"queue-full": 1},
        retryableRejected=1,
        queueDelayMs={"total": 100.0, "max": 100.0},
        maxQueued=1,
    )
    # Three refusals of requests reality admitted, whichever side decided first.
    assert would_be == tally(
        requests=5,
        retries=1,
        admitted=1,
        rejected={"queue-full": 4},
        retryableRejected=4,
        wouldRetry=3,
    )


def test_breaker_transitions_are_counted_by_kind_when_the_copies_go_back(scenario_factory):
    scenario = scenario_factory()
    breaker = {"concurrency": 100, "circuitBreaker": {"failureThreshold": 1, "openMs": 1_000}}
    shadow = scenario.registry.start_shadow(make_profile(version="v2", providers={"llm": breaker}))

    async def body(s):
        # closed->open; open->half-open, half-open->open; open->half-open, half-open->closed;
        # closed->open again.
        steps = ((0.0, False), (2.0, False), (2.0, True), (0.1, False))
        for budget, (wait_s, success) in enumerate(steps):
            await asyncio.sleep(wait_s)
            call, lease = await admit_both(s, shadow, request(budget=f"inv-{budget}"))
            await s.settle()
            await asyncio.sleep(0.01)
            release_both(call, lease, success=success)
            await s.settle()
        assert not shadow.calls

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    # Reality has no breaker: no transition on its side.
    assert active == tally(requests=4, admitted=4)
    assert would_be == tally(
        requests=4,
        admitted=4,
        breakerTransitions={
            "closed->open": 2,
            "half-open->closed": 1,
            "half-open->open": 1,
            "open->half-open": 2,
        },
    )
    assert list(would_be["breakerTransitions"]) == sorted(would_be["breakerTransitions"])


# ---------------------------------------------------------------------------------- merging


def test_merging_no_tally_gives_the_empty_tally():
    assert merge_tallies([]) == tally()


def test_merging_adds_counts_takes_maxima_and_sorts_the_named_counts():
    first = tally(
        requests=5,
        retries=2,
        admitted=3,
        deferred=2,
        rejected={"queue-full": 1, "cost": 1},
        retryableRejected=1,
        wouldRetry=1,
        queueDelayMs={"total": 350.0, "max": 300.0},
        maxQueued=4,
        maxRetryPressure=1,
        breakerTransitions={"closed->open": 1},
    )
    second = tally(
        requests=3,
        retries=1,
        admitted=1,
        deferred=1,
        rejected={"queue-full": 2},
        retryableRejected=2,
        wouldRetry=2,
        queueDelayMs={"total": 120.5, "max": 120.5},
        maxQueued=2,
        maxRetryPressure=3,
        breakerTransitions={"open->half-open": 1, "closed->open": 1},
    )
    merged = merge_tallies(iter([first, second]))
    assert merged == tally(
        requests=8,
        retries=3,
        admitted=4,
        deferred=3,
        rejected={"cost": 1, "queue-full": 3},
        retryableRejected=3,
        wouldRetry=3,
        queueDelayMs={"total": 470.5, "max": 300.0},
        maxQueued=4,
        maxRetryPressure=3,
        breakerTransitions={"closed->open": 2, "open->half-open": 1},
    )
    assert list(merged["rejected"]) == ["cost", "queue-full"]
    assert list(merged["breakerTransitions"]) == ["closed->open", "open->half-open"]
    # The inputs are read, not changed.
    assert first["rejected"] == {"queue-full": 1, "cost": 1}


def test_merging_counts_fields_a_stored_tally_lacks_as_zero():
    # Observations stored before a field existed (or with an empty delay record).
    partial = {"requests": 2, "admitted": 1, "rejected": {"cost": 1}}
    merged = merge_tallies([{}, partial, {"queueDelayMs": {}}, tally(requests=1, admitted=1)])
    assert merged == tally(requests=3, admitted=2, rejected={"cost": 1})


# ------------------------------------------------------------- when a copy gives its permit back


def test_a_copy_admitted_with_reality_goes_back_the_moment_reality_releases(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))

    async def body(s):
        call, lease = await admit_both(s, shadow, request(budget="a"))
        await s.settle()
        await asyncio.sleep(0.1)
        assert shadow.controller.snapshot("alice") == (1, 0)
        release_both(call, lease, success=True)
        # Held exactly as long: back within the same call, not on a later loop turn.
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls
        # A real attempt that ended the moment it was admitted: its copy holds for no time.
        call, lease = await admit_both(s, shadow, request(budget="b"))
        release_both(call, lease, success=False)
        await s.settle()
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls
        assert s.now() == 100.0

    run_clean(scenario, body)


def test_a_copy_holding_a_permit_goes_back_the_moment_reality_refuses(scenario_factory):
    scenario = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))

    async def body(s):
        running = await admit_both(s, shadow, request(budget="a"))
        req = request(budget="b", deadline_ms=s.now() + 50)
        call = shadow.mirror(req)
        waiting = s.start(req)
        await s.settle()
        # Reality queues the request; the shadow admitted its copy at once.
        assert shadow.controller.snapshot("alice") == (2, 0)
        await asyncio.sleep(0.05)
        await s.settle()
        rejection = rejection_of(waiting)
        call.rejected(rejection)
        # Back within the call: the copy holds nothing reality did not hold.
        assert shadow.controller.snapshot("alice") == (1, 0)
        assert shadow.calls == {running[0]}
        release_both(*running, success=True)
        await s.settle()

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    assert active == tally(
        requests=2,
        admitted=1,
        deferred=1,
        rejected={"deadline-exceeded": 1},
        queueDelayMs={"total": 50.0, "max": 50.0},
    )
    assert would_be == tally(requests=2, admitted=2)


def test_a_copy_admitted_late_holds_as_long_as_reality_from_its_own_admission(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1}})
    )
    done_at: dict[str, float] = {}

    async def body(s):
        pairs = [await admit_both(s, shadow, request(budget=b)) for b in "ab"]
        await s.settle()
        await asyncio.sleep(0.2)
        for call, lease in pairs:
            release_both(call, lease, success=True)
        # The second copy was admitted at 200 ms and holds its permit until 400 ms exactly.
        await asyncio.sleep(0.1999)
        assert shadow.controller.snapshot("alice") == (1, 0)
        while shadow.calls:
            await asyncio.sleep(0.00001)
        done_at["ms"] = s.now()

    run_clean(scenario, body)
    assert done_at["ms"] == pytest.approx(400.0, abs=0.011)


def test_the_copy_is_released_with_the_real_retry_after_tokens_and_cost(scenario_factory):
    scenario = scenario_factory()
    limited = {"concurrency": 100, "maxTokens": 100, "maxCostUsd": 1.0}
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": limited})
    )
    outcomes: list[tuple[int, dict[str, int]]] = []

    async def body(s):
        # Estimated 10 tokens, used 90: the shadow's budget for the invocation has 10 left.
        call, lease = await admit_both(s, shadow, request(budget="t", tokens=10, cost_usd=0.0))
        await s.settle()
        release_both(call, lease, success=True, actual_tokens=90)
        await s.settle()
        shadow.drain()
        call, lease = await admit_both(s, shadow, request(budget="t", tokens=20, cost_usd=0.0))
        await s.settle()
        release_both(call, lease, success=True)
        await s.settle()
        outcomes.append(shadow_outcome(shadow))
        # Estimated 10 cents, spent 95: the next 10 cents do not fit the dollar.
        call, lease = await admit_both(s, shadow, request(budget="c", tokens=1, cost_usd=0.1))
        await s.settle()
        release_both(call, lease, success=True, actual_cost_usd=0.95)
        await s.settle()
        shadow.drain()
        call, lease = await admit_both(s, shadow, request(budget="c", tokens=1, cost_usd=0.1))
        await s.settle()
        release_both(call, lease, success=True)
        await s.settle()
        outcomes.append(shadow_outcome(shadow))
        # The provider announced a 500 ms pause with the release: the next copy waits it out.
        call, lease = await admit_both(s, shadow, request(budget="r", tokens=1, cost_usd=0.0))
        await s.settle()
        await asyncio.sleep(0.01)
        release_both(call, lease, success=True, retry_after_ms=500.0)
        await s.settle()
        shadow.drain()
        await asyncio.sleep(0.01)
        req = request(budget="s", tokens=1, cost_usd=0.0)
        call = shadow.mirror(req)
        await asyncio.sleep(1.0)
        lease = await s.admit(req)
        call.admitted(lease)
        release_both(call, lease, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert outcomes == [(0, {"tokens": 1}), (0, {"cost": 1})]
    _active, would_be = shadow.drain()
    assert would_be == tally(
        requests=1,
        admitted=1,
        deferred=1,
        queueDelayMs={"total": 490.0, "max": 490.0},
        maxRetryPressure=1,
    )


def test_malformed_real_figures_still_free_the_shadow_permit(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))

    async def body(s):
        call, lease = await admit_both(s, shadow, request())
        await s.settle()
        with pytest.raises(ValueError, match="actual_tokens"):
            lease.release(success=True, actual_tokens=-1)
        # The host reports the release as it made it; the shadow must not raise.
        call.released(lease, success=True, actual_tokens=-1)
        await s.settle()
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls

    run_clean(scenario, body)
    assert shadow.drain()[1] == tally(requests=1, admitted=1)


def test_an_abandoned_request_takes_back_its_admitted_copy_without_an_outcome(scenario_factory):
    scenario = scenario_factory(make_profile(principals={"alice": {"concurrency": 1}}))
    breaker = {"concurrency": 100, "circuitBreaker": {"failureThreshold": 1, "openMs": 1_000}}
    shadow = scenario.registry.start_shadow(make_profile(version="v2", providers={"llm": breaker}))

    async def body(s):
        running = await admit_both(s, shadow, request(budget="a"))
        req = request(budget="b")
        call = shadow.mirror(req)
        waiting = s.start(req)
        await s.settle()
        # The copy got a shadow permit while reality still queues the request.
        assert shadow.controller.snapshot("alice") == (2, 0)
        waiting.cancel()
        await s.settle()
        call.abandoned()
        assert shadow.controller.snapshot("alice") == (1, 0)
        assert shadow.calls == {running[0]}
        release_both(*running, success=True)
        await s.settle()

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    assert active == tally(requests=1, admitted=1)
    # The abandoned copy counts as admitted and goes back with no outcome: no breaker change.
    assert would_be == tally(requests=2, admitted=2)


def test_a_failing_shadow_decision_is_logged_and_dropped(scenario_factory, caplog):
    scenario = scenario_factory()
    # A shadow of another workspace cannot decide this workspace's requests.
    other = Profile.from_dict(profile_doc(version="v2"), workspace_id="ws-other")
    shadow = scenario.registry.start_shadow(other)

    async def body(s):
        call, lease = await admit_both(s, shadow, request())
        await s.settle()
        assert not shadow.calls
        release_both(call, lease, success=True)
        await s.settle()

    with caplog.at_level(logging.ERROR, logger="admission.core.shadow"):
        run_clean(scenario, body)
    [record] = [r for r in caplog.records if r.name == "admission.core.shadow"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "shadow admission failed"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    active, would_be = shadow.drain()
    assert active == tally(requests=1, admitted=1)
    assert would_be == tally()


# ----------------------------------------------------------------------------------- budgets


def test_a_budget_is_forgotten_at_once_when_no_copy_of_it_is_pending(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(
            version="v2",
            principals={"alice": {"concurrency": 100, "maxAttempts": 1}, "bob": {"concurrency": 9}},
        )
    )
    outcomes: list[tuple[int, dict[str, int]]] = []

    async def once(s, budget, principal="alice"):
        pair = await admit_both(s, shadow, request(principal, budget=budget))
        await s.settle()
        release_both(*pair, success=True)
        await s.settle()
        outcomes.append(shadow_outcome(shadow))

    async def body(s):
        await once(s, "a")
        # One attempt per invocation: the second attempt of "a" is refused...
        await once(s, "a")
        # ...while a copy of another invocation is still running...
        other = await admit_both(s, shadow, request("bob", budget="w"))
        await s.settle()
        shadow.drain()
        # ...until the invocation has ended and its budget is forgotten.
        shadow.release_budget("a")
        await once(s, "a")
        release_both(*other, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert outcomes == [(1, {}), (0, {"attempts": 1}), (1, {})]


def test_a_budget_is_forgotten_only_after_its_last_pending_copy(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(
            version="v2",
            principals={"alice": {"concurrency": 1, "maxAttempts": 1}, "bob": {"concurrency": 9}},
        )
    )
    outcomes: list[tuple[int, dict[str, int]]] = []

    async def once(s, budget):
        pair = await admit_both(s, shadow, request(budget=budget))
        await s.settle()
        release_both(*pair, success=True)
        await s.settle()
        outcomes.append(shadow_outcome(shadow))

    async def body(s):
        # A copy of another invocation runs throughout.
        other = await admit_both(s, shadow, request("bob", budget="w"))
        # "x" holds alice's one shadow permit; the copy of "y" waits for it.
        x = await admit_both(s, shadow, request(budget="x"))
        y = await admit_both(s, shadow, request(budget="y"))
        await s.settle()
        await asyncio.sleep(0.01)
        release_both(*y, success=True)
        # Invocation "y" has ended in reality; its copy has not even been admitted yet.
        shadow.release_budget("y")
        await asyncio.sleep(0.01)
        release_both(*x, success=True)
        await s.settle()
        assert len(shadow.calls) == 2
        await asyncio.sleep(0.01)
        assert shadow.calls == {other[0]}
        shadow.drain()
        # Its copy used the budget, then the budget was forgotten: "y" may run once more...
        await once(s, "y")
        # ...and no more: a budget is forgotten once per release.
        await once(s, "y")
        release_both(*other, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert outcomes == [(1, {}), (0, {"attempts": 1})]


# ------------------------------------------------------------------------------- stop, start


def test_the_shadow_keeps_its_profile_workspace_and_session(scenario_factory):
    scenario = scenario_factory()
    profile = make_profile(version="v2")
    shadow = scenario.registry.start_shadow(profile, session="rollout-7")
    assert shadow.profile is profile
    assert shadow.workspace_id == WORKSPACE
    assert shadow.session == "rollout-7"
    assert shadow.controller.profile is profile
    assert scenario.registry.shadow(WORKSPACE) is shadow


def test_starting_a_shadow_stops_the_previous_one(scenario_factory):
    scenario = scenario_factory()
    first = scenario.registry.start_shadow(make_profile(version="v2"), session=1)
    second = scenario.registry.start_shadow(make_profile(version="v3"), session=2)
    assert scenario.registry.shadow(WORKSPACE) is second

    async def body(s):
        assert first.mirror(request()) is None
        call, lease = await admit_both(s, second, request())
        await s.settle()
        release_both(call, lease, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert first.drain() == (tally(), tally())
    assert second.drain()[1] == tally(requests=1, admitted=1)


def test_stop_on_the_loop_gives_a_held_permit_back_at_once(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))
    real: dict[str, Any] = {}

    async def body(s):
        call, lease = await admit_both(s, shadow, request())
        await s.settle()
        assert shadow.controller.snapshot("alice") == (1, 0)
        assert scenario.registry.stop_shadow(WORKSPACE) is shadow
        # Withdrawn within the call, not on a later turn of the loop.
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls
        assert shadow.mirror(request(budget="later")) is None
        # Reality goes on untouched, and its release still counts on the active side.
        assert not lease.released
        real["active"] = scenario.controller.snapshot("alice")
        release_both(call, lease, success=True)
        await s.settle()

    run_clean(scenario, body)
    assert real["active"] == (1, 0)
    assert scenario.registry.shadow(WORKSPACE) is None
    active, would_be = shadow.drain()
    assert active == tally(requests=1, admitted=1)
    assert would_be == tally(requests=1, admitted=1)


def test_a_copy_decided_after_a_stop_from_another_thread_goes_back_at_once(scenario_factory):
    scenario = scenario_factory()
    breaker = {"concurrency": 100, "circuitBreaker": {"failureThreshold": 1, "openMs": 1_000}}
    shadow = scenario.registry.start_shadow(make_profile(version="v2", providers={"llm": breaker}))

    async def body(s):
        # Reality admits both before their copies are decided; the second one already failed.
        running = await admit_both(s, shadow, request(budget="a"))
        failed = await admit_both(s, shadow, request(budget="b"))
        release_both(*failed, success=False)
        # A host thread stops the shadow while the loop stands still.
        stopper = threading.Thread(target=scenario.registry.stop_shadow, args=(WORKSPACE,))
        stopper.start()
        stopper.join()
        await s.settle()
        # Both copies were decided after the stop and gave their permits back at once.
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls
        release_both(*running, success=True)
        await s.settle()

    run_clean(scenario, body)
    active, would_be = shadow.drain()
    assert active == tally(requests=2, admitted=2)
    # The failure reality reported before the stop still reached the shadow's breaker.
    assert would_be == tally(requests=2, admitted=2, breakerTransitions={"closed->open": 1})


def test_a_copy_withdrawn_before_it_started_ends_and_frees_its_budget(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(make_profile(version="v2"))
    forgotten: list[str] = []
    forget = shadow.controller.release_budget
    shadow.controller.release_budget = lambda budget: (forgotten.append(budget), forget(budget))

    async def body(s):
        # The host's acquire failed before it ever waited: the copy is withdrawn in the same turn.
        call = shadow.mirror(request(budget="inv"))
        call.abandoned()
        await s.settle()
        assert not shadow.calls
        shadow.release_budget("inv")

    run_clean(scenario, body)
    assert forgotten == ["inv"]


def test_stop_gives_back_a_permit_held_as_long_as_reality_held_its_own(scenario_factory):
    scenario = scenario_factory()
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1}})
    )

    async def body(s):
        pairs = [await admit_both(s, shadow, request(budget=b)) for b in "ab"]
        await s.settle()
        await asyncio.sleep(0.2)
        for call, lease in pairs:
            release_both(call, lease, success=True)
        await s.settle()
        # The second copy, admitted at 200 ms, would hold its permit until 400 ms.
        assert shadow.controller.snapshot("alice") == (1, 0)
        assert scenario.registry.stop_shadow(WORKSPACE) is shadow
        assert shadow.controller.snapshot("alice") == (0, 0)
        assert not shadow.calls

    run_clean(scenario, body)


def test_a_copy_decided_after_its_run_was_drained_counts_with_the_next_drain(scenario_factory):
    scenario = scenario_factory()
    # The shadow runs alice's requests one at a time: the second copy waits behind the first.
    shadow = scenario.registry.start_shadow(
        make_profile(version="v2", principals={"alice": {"concurrency": 1}})
    )
    drained: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def body(s):
        pairs = [await admit_both(s, shadow, request(budget=f"r1/{b}")) for b in "ab"]
        await s.settle()
        await asyncio.sleep(0.01)
        # The run ends while its second copy still waits in the shadow's queue.
        drained.append(shadow.drain("r1"))
        for call, lease in pairs:
            release_both(call, lease, success=True)
        while shadow.calls:
            await asyncio.sleep(0.001)
        drained.append(shadow.drain("r2"))

    run_clean(scenario, body)
    (active, first), (late_active, late) = drained
    assert active == tally(requests=2, admitted=2)
    assert first == tally(requests=1, admitted=1)
    # The late decision is not lost: the next drain carries it, and the totals are exact.
    assert late_active == tally()
    assert late["requests"] == 1 and late["admitted"] == 1 and late["deferred"] == 1
    assert merge_tallies([first, late])["requests"] == active["requests"]
