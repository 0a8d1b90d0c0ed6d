"""CNC-ORDER: results come back in canonical ruleset order whatever the completion timing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.core import CancelSignal
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.receipts import InMemoryReceiptStore
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import PRINCIPAL, profile, registry_with, request, run_virtual

ANSWERS = ("yes", "no")


def build_ruleset(specs):
    decisions = []
    for index, spec in enumerate(specs):
        primary = {
            "adapter": spec["adapter"],
            "model": "m",
            "timeoutMs": spec.get("timeout_ms", 10_000),
            "retry": {
                "maxAttempts": spec.get("max_attempts", 1),
                "initialBackoffMs": spec.get("backoff_ms", 0),
                "maxBackoffMs": max(spec.get("backoff_ms", 0), 1),
            },
        }
        fallbacks = [{"adapter": "beta", "model": "m2"}] if spec.get("fallback") else []
        decisions.append(
            {
                "id": f"d{index}",
                "prompt": "Is ${text} fine?",
                "allowedOutputs": list(ANSWERS),
                "binding": {"primary": primary, "fallbacks": fallbacks},
            }
        )
    return {"id": "order", "decisions": decisions}


def evaluate(specs, *, enabled, binding, cancel_at_ms=None, deadline_ms=None, receipts=False):
    """Run the specs on virtual time with one fake adapter behind 'alpha' and 'beta'."""
    script = {f"d{i}": list(spec["steps"]) for i, spec in enumerate(specs)}

    async def main(loop):
        prof = profile(
            workspace={"concurrency": 16},
            providers={"alpha": {"concurrency": 16}, "beta": {"concurrency": 16}},
            principals={PRINCIPAL: {"concurrency": 16}},
        )
        registry = registry_with(loop, prof)
        fake = FakeAdapter(script, default=FakeStep(latency_ms=1))
        signal = None
        if cancel_at_ms is not None:
            signal = CancelSignal()
            loop.call_later(cancel_at_ms / 1000, signal.cancel, "caller-gave-up")
        fields = {"scheduler": {"enabled": enabled, "bindingConcurrency": binding}}
        if deadline_ms is not None:
            fields["deadlineMs"] = deadline_ms
        req = request(build_ruleset(specs), signal=signal, invocationId="inv-order", **fields)
        result = await evaluate_decision_ruleset(
            req,
            registry=registry,
            adapters={"alpha": fake, "beta": fake, "ghost": fake},
            receipt_store=InMemoryReceiptStore() if receipts else None,
        )
        return result, fake

    return run_virtual(main)


def check_conformance(specs, result, fake):
    ids = [f"d{i}" for i in range(len(specs))]
    assert [d.decision_id for d in result.decisions] == ids
    assert result.max_active <= result.concurrency
    assert fake.max_active <= result.concurrency
    for decision in result.decisions:
        calls = [c for c in fake.calls if c.decision_id == decision.decision_id]
        # Every sent attempt is exactly one adapter call; refusals never reach the adapter.
        assert sum(1 for a in decision.attempts if a.sent) == len(calls)
        if decision.succeeded:
            assert decision.output in ANSWERS


def reversed_latency_specs(count=6, **extra):
    return [
        {
            "adapter": "alpha",
            "steps": [FakeStep(latency_ms=10 * (count - i), answer=ANSWERS[i % 2])],
        }
        | extra
        for i in range(count)
    ]


SCENARIOS = {
    "serial": (reversed_latency_specs(), {"enabled": False, "binding": 4}),
    "scheduled": (reversed_latency_specs(), {"enabled": True, "binding": 4}),
    "retries": (
        [
            {
                "adapter": "alpha",
                "max_attempts": 3,
                "backoff_ms": 15,
                "steps": [
                    FakeStep(latency_ms=5 * (6 - i), error="server-error"),
                    FakeStep(latency_ms=5 * i, error="rate-limited", retry_after_ms=20),
                    FakeStep(latency_ms=3, answer=ANSWERS[i % 2]),
                ],
            }
            for i in range(6)
        ],
        {"enabled": True, "binding": 3},
    ),
    "fallbacks": (
        [
            {
                "adapter": "alpha",
                "fallback": True,
                "steps": [
                    FakeStep(latency_ms=40 - 5 * i, error="client-error"),
                    FakeStep(latency_ms=5 * i, answer=ANSWERS[i % 2]),
                ],
            }
            for i in range(6)
        ],
        {"enabled": True, "binding": 4},
    ),
    "admission-rejections": (
        [
            {
                "adapter": "ghost" if i % 3 == 0 else "alpha",
                "fallback": i % 2 == 0,
                "steps": [FakeStep(latency_ms=30 - 4 * i, answer=ANSWERS[i % 2])],
            }
            for i in range(7)
        ],
        {"enabled": True, "binding": 4},
    ),
    "cancellations": (
        reversed_latency_specs(8),
        {"enabled": True, "binding": 3, "cancel_at_ms": 55},
    ),
    "deadline": (reversed_latency_specs(8), {"enabled": True, "binding": 2, "deadline_ms": 75}),
    "receipts": (reversed_latency_specs(5), {"enabled": True, "binding": 4, "receipts": True}),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_CNC_ORDER_001_canonical_order_in_every_scenario(name):
    specs, options = SCENARIOS[name]
    result, fake = evaluate(specs, **options)
    check_conformance(specs, result, fake)
    if name in ("serial", "scheduled", "retries", "fallbacks", "receipts"):
        assert all(d.succeeded for d in result.decisions)
        assert list(result.outputs.values()) == [ANSWERS[i % 2] for i in range(len(specs))]
    if name == "admission-rejections":
        statuses = [d.status for d in result.decisions]
        # ghost-only decisions are refused; ghost with a fallback succeeds on beta.
        assert statuses[3] == "overloaded" and statuses[0] == statuses[6] == "succeeded"
    if name == "cancellations":
        assert result.status == "cancelled"
    if name == "deadline":
        assert result.status == "timeout"


def test_CNC_ORDER_002_scheduled_outcomes_equal_serial_outcomes():
    specs, _ = SCENARIOS["retries"]
    serial, _ = evaluate(specs, enabled=False, binding=1)
    scheduled, _ = evaluate(specs, enabled=True, binding=4)
    assert [(d.status, d.output) for d in serial.decisions] == [
        (d.status, d.output) for d in scheduled.decisions
    ]


STEP = st.builds(
    FakeStep,
    latency_ms=st.integers(min_value=0, max_value=200),
    answer=st.sampled_from(ANSWERS),
    error=st.sampled_from([None, None, None, "server-error", "rate-limited", "uncertain"]),
    retry_after_ms=st.sampled_from([None, 5, 40]),
)
SPEC = st.fixed_dictionaries(
    {
        "adapter": st.sampled_from(["alpha", "alpha", "beta", "ghost"]),
        "steps": st.lists(STEP, min_size=1, max_size=3),
    },
    optional={
        "max_attempts": st.integers(min_value=1, max_value=3),
        "backoff_ms": st.integers(min_value=0, max_value=50),
        "fallback": st.booleans(),
        "timeout_ms": st.sampled_from([60, 150, 10_000]),
    },
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    specs=st.lists(SPEC, min_size=1, max_size=10),
    enabled=st.booleans(),
    binding=st.integers(min_value=1, max_value=4),
    cancel_at_ms=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),
    deadline_ms=st.one_of(st.none(), st.integers(min_value=1, max_value=600)),
    receipts=st.booleans(),
)
def test_CNC_ORDER_003_property_canonical_order_under_random_timing(
    specs, enabled, binding, cancel_at_ms, deadline_ms, receipts
):
    options = {
        "enabled": enabled,
        "binding": binding,
        "cancel_at_ms": cancel_at_ms,
        "deadline_ms": deadline_ms,
        "receipts": receipts,
    }
    result, fake = evaluate(specs, **options)
    check_conformance(specs, result, fake)
    if not enabled:
        assert result.max_active == 1
    # Virtual time makes a run reproducible, outcome for outcome.
    again, _ = evaluate(specs, **options)
    assert again.to_dict() == result.to_dict()
    if cancel_at_ms is None and deadline_ms is None:
        serial, _ = evaluate(specs, enabled=False, binding=1)
        assert [(d.status, d.output) for d in serial.decisions] == [
            (d.status, d.output) for d in result.decisions
        ]
