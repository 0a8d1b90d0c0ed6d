"""Bounded prompt expansion: a prompt's rendered length is known before it is rendered, a decision
over the cap is never rendered nor sent (a submission over it: tests/config/test_request_cost.py).
"""

from __future__ import annotations

import string
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.receipts import InMemoryReceiptStore
from evaluator.engine.rulesets import Decision, prompt_values
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import decision_doc, profile, registry_with, request, run_virtual

_NAMES = ("a", "b", "long_name")
_PIECES = st.one_of(
    st.text(alphabet="xyz {}\n", max_size=6),
    st.sampled_from(["$$", "$a", "${a}", "$b", "${b}", "${long_name}", "$long_name", "$$a"]),
)


def _decision(prompt: str) -> Decision:
    doc = decision_doc("d0")
    doc["prompt"] = prompt
    return Decision.from_dict(doc, "decision")


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(_PIECES, max_size=30),
    values=st.fixed_dictionaries(
        {
            name: st.one_of(
                st.text(max_size=20), st.integers(), st.lists(st.booleans(), max_size=3)
            )
            for name in _NAMES
        }
    ),
)
def test_the_rendered_length_is_counted_exactly_without_rendering(pieces, values):
    prompt = "".join(pieces)
    template = string.Template(prompt)
    # Requests refuse blank prompts, malformed placeholders and names missing from the input.
    assume(prompt.strip() and template.is_valid())
    assume(set(template.get_identifiers()) <= set(_NAMES))
    decision = _decision(prompt)
    texts = prompt_values(values)
    assert decision.rendered_length(texts) == len(decision.render(values))


def test_counting_a_huge_expansion_costs_what_the_template_costs():
    # The finding: "${x}" x 5000 with a 200 000-character x renders to a gigabyte.
    decision = _decision("${x}" * 5000)
    texts = {"x": "v" * 200_000}
    started = time.process_time()
    assert decision.rendered_length(texts) == 1_000_000_000
    assert time.process_time() - started < 0.1


def _ruleset(prompts: list[str]) -> dict[str, Any]:
    decisions = []
    for index, prompt in enumerate(prompts):
        doc = decision_doc(f"d{index}", fallbacks=[{"adapter": "fake", "model": "model-b"}])
        doc["prompt"] = prompt
        decisions.append(doc)
    return {"id": "ruleset-a", "decisions": decisions}


@pytest.mark.parametrize("durable", [False, True])
def test_a_decision_over_the_cap_is_never_rendered_and_records_a_typed_failure(durable):
    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(default=FakeStep(latency_ms=5))
        req = request(_ruleset(["${text}" * 11, "short ${text}"]), input={"text": "x" * 100})
        store = InMemoryReceiptStore() if durable else None
        result = await evaluate_decision_ruleset(
            req,
            registry=registry,
            adapters={"fake": fake},
            receipt_store=store,
            max_prompt_chars=1_000,
        )
        return result, fake

    result, fake = run_virtual(main)
    over, fits = result.decisions
    assert result.status == "completed"
    assert over.status == "estimate-failed" and over.output is None
    # Every target of the decision refuses it, unsent; nothing reached the adapter.
    assert [(a.target_index, a.sent, a.outcome, a.reason) for a in over.attempts] == [
        (0, False, "estimate-failed", "prompt-too-large"),
        (1, False, "estimate-failed", "prompt-too-large"),
    ]
    assert [call.decision_id for call in fake.calls] == ["d1"]
    assert fits.status == "succeeded"


def test_a_prompt_at_the_cap_is_sent_whole():
    prompts: list[str] = []

    def answer(call: Any) -> FakeStep:
        prompts.append(call.prompt)
        return FakeStep(latency_ms=5)

    async def main(loop):
        registry = registry_with(loop, profile())
        fake = FakeAdapter(responder=answer)
        req = request(_ruleset(["${text}" * 10]), input={"text": "x" * 100})
        return await evaluate_decision_ruleset(
            req, registry=registry, adapters={"fake": fake}, max_prompt_chars=1_000
        )

    result = run_virtual(main)
    assert result.decisions[0].status == "succeeded"
    assert prompts == ["x" * 1_000]
