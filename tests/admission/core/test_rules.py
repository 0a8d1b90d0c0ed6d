"""CNC-ADMIT-009: the static rules: one table, a fast gate and an ordered scan that agree.

The reference below spells the documented order out by hand, independently of the term table in
`admission.core.rules`; random limits and estimates must get the same answer from it, from the
ordered scan, from the compiled gate and from a controller's `acquire`.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.core import AdmissionRegistry, AdmissionRejected, Limits, Profile, VirtualTimeLoop
from admission.core.rules import (
    EPSILON,
    budget_reason,
    compile_gate,
    count_or_none,
    gate_fails,
    static_reason,
    valid_amount,
    valid_count,
)
from admission.core.ticket import Ticket

from .conftest import WORKSPACE, examples, request


def reference(figures: Any, scopes: tuple[Limits, ...]) -> str | None:
    for limits in scopes:
        checks = (
            (
                limits.max_batch_size is not None
                and figures.batch_size is not None
                and figures.batch_size > limits.max_batch_size,
                "batch-size",
            ),
            (
                limits.max_request_bytes is not None
                and figures.request_bytes is not None
                and figures.request_bytes > limits.max_request_bytes,
                "request-too-large",
            ),
            (
                limits.max_items is not None
                and figures.items is not None
                and figures.items > limits.max_items,
                "too-many-items",
            ),
            (
                limits.max_retained_work is not None and figures.retained_work is None,
                "unknown-retained-work",
            ),
            (
                limits.max_retained_work is not None
                and figures.retained_work is not None
                and figures.retained_work > limits.max_retained_work,
                "retained-work",
            ),
            (
                limits.max_cost_usd is not None
                and figures.cost is None
                and not limits.allow_unknown_cost,
                "unknown-cost",
            ),
            (limits.max_tokens is not None and figures.tokens is None, "unknown-tokens"),
        )
        for failed, reason in checks:
            if failed:
                return reason
    for limits in scopes:
        if limits.requests_per_minute is not None and limits.requests_per_minute == 0:
            return "requests-per-minute"
        tps = limits.tokens_per_second
        if tps is not None and figures.tokens is not None and figures.tokens > tps:
            return "tokens-per-second"
    return None


def bound(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


small = st.integers(0, 6)
limits_strategy = st.builds(
    Limits,
    concurrency=st.just(100),
    requests_per_minute=bound(st.sampled_from([0, 1, 60, 6000])),
    tokens_per_second=bound(st.sampled_from([0, 3, 5, 1000.5])),
    max_attempts=bound(small),
    max_batch_size=bound(small),
    max_cost_usd=bound(st.sampled_from([0, 0.5, 2.0])),
    allow_unknown_cost=st.booleans(),
    max_tokens=bound(small),
    max_request_bytes=bound(small),
    max_items=bound(small),
    max_retained_work=bound(small),
)
figures_strategy = st.builds(
    SimpleNamespace,
    tokens=bound(small),
    cost=bound(st.sampled_from([0.0, 0.25, 1.0, 3.0])),
    request_bytes=bound(small),
    items=bound(small),
    batch_size=bound(small),
    retained_work=bound(small),
    attempts=st.integers(0, 3),
    requests=st.just(1),
)


@settings(max_examples=examples(500), deadline=None)
@given(figures_strategy, st.tuples(limits_strategy, limits_strategy, limits_strategy))
def test_CNC_ADMIT_009_gate_and_ordered_scan_agree_with_the_documented_order(figures, scopes):
    expected = reference(figures, scopes)
    assert static_reason(figures, scopes) == expected
    assert gate_fails(figures, compile_gate(scopes)) == (expected is not None)


def _profile(workspace: Limits, provider: Limits, principal: Limits) -> Profile:
    return Profile(
        workspace_id=WORKSPACE,
        profile_version="v1",
        workspace=workspace,
        providers={"llm": provider},
        principals={"alice": principal},
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    figures_strategy,
    st.tuples(limits_strategy, limits_strategy, limits_strategy),
    st.integers(0, 2),
)
def test_CNC_ADMIT_009_a_controller_decides_as_the_rules_do(figures, scopes, repeats):
    principal, workspace, provider = scopes
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock)
    # The lane's gate is compiled by the first request and reused by the next ones.
    controller = registry.register(_profile(workspace, provider, principal))
    estimate = {
        "tokens": figures.tokens,
        "cost_usd": figures.cost,
        "request_bytes": figures.request_bytes,
        "items": figures.items,
        "batch_size": figures.batch_size,
        "retained_work": figures.retained_work,
        "attempts": figures.attempts,
    }

    async def decide() -> str:
        try:
            lease = await controller.acquire(request("alice", **estimate))
        except AdmissionRejected as rejection:
            return rejection.reason
        lease.release(success=True)
        return "admitted"

    decided = []
    try:
        for _ in range(repeats + 1):
            # Virtual time: a request bucket of one a minute refills in 60 s without waiting.
            decided.append(loop.run_until_complete(asyncio.wait_for(decide(), 600.0)))
            controller.release_budget("inv-1")
    finally:
        loop.close()
    fresh = [budget_reason(figures, limits, 0, 0.0, 0) for limits in scopes]
    expected = reference(figures, scopes) or next((r for r in fresh if r), None) or "admitted"
    assert decided == [expected] * (repeats + 1)


def test_CNC_ADMIT_009_budget_reasons_in_order_with_what_was_used():
    limits = Limits(concurrency=1, max_attempts=3, max_cost_usd=1.0, max_tokens=100)
    figures = SimpleNamespace(attempts=1, cost=0.5, tokens=40)
    assert budget_reason(figures, limits, 2, 0.5, 60) is None  # every budget exactly full after
    assert budget_reason(figures, limits, 3, 0.9, 70) == "attempts"
    assert budget_reason(figures, limits, 2, 0.6, 70) == "cost"
    assert budget_reason(figures, limits, 2, 0.5, 61) == "tokens"
    # Rounding in summed costs does not refuse an exactly fitting dispatch.
    assert (
        budget_reason(SimpleNamespace(attempts=0, cost=0.1, tokens=None), limits, 0, 0.9, 0) is None
    )
    # A cost over the ceiling by no more than the rounding slack still fits.
    free = Limits(concurrency=1, max_cost_usd=0.0)
    assert (
        budget_reason(SimpleNamespace(attempts=0, cost=EPSILON, tokens=None), free, 0, 0.0, 0)
        is None
    )
    unknown = SimpleNamespace(attempts=0, cost=None, tokens=None)
    assert budget_reason(unknown, limits, 3, 5.0, 500) is None  # unknown figures are not counted


def test_CNC_ADMIT_009_requests_per_minute_of_zero_refuses_every_request():
    scopes = (Limits(concurrency=1), Limits(concurrency=1, requests_per_minute=0), Limits(1))
    empty = SimpleNamespace(
        tokens=None,
        cost=None,
        request_bytes=None,
        items=None,
        batch_size=None,
        retained_work=None,
        attempts=1,
        requests=1,
    )
    assert static_reason(empty, scopes) == "requests-per-minute"
    assert gate_fails(empty, compile_gate(scopes))
    assert not gate_fails(empty, compile_gate((scopes[0], scopes[0], scopes[2])))


def test_the_ticket_reads_an_estimate_as_the_rules_count_it():
    ticket = Ticket(request(tokens=2.0, cost_usd=1, items=3, attempts=None), 0.0)
    assert (ticket.tokens, ticket.cost, ticket.items, ticket.attempts) == (2, 1.0, 3, 1)
    assert type(ticket.tokens) is int and type(ticket.cost) is float
    assert ticket.requests == 1 and not ticket.invalid
    assert Ticket(request(tokens=-1), 0.0).invalid


@pytest.mark.parametrize(
    ("value", "count", "amount"),
    [
        (0, True, True),
        (0.0, True, True),
        (3, True, True),
        (2.0, True, True),
        (2.5, False, True),
        (-1, False, False),
        (-0.5, False, False),
        (True, False, False),
        (math.nan, False, False),
        (math.inf, False, False),
        ("3", False, False),
        (None, False, False),
    ],
)
def test_count_and_amount_validators(value, count, amount):
    assert valid_count(value) is count
    assert valid_amount(value) is amount
    assert count_or_none(value) == (int(value) if count else None)
