"""Rulesets and requests: parsing, validation with field names, trusted identities."""

from __future__ import annotations

import pytest

from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.invocation import DecisionEvaluationRequest, SchedulerOptions
from evaluator.engine.outputs import InvalidOutputError, OutputSpec
from evaluator.engine.rulesets import RetryPolicy, Ruleset
from tests.evaluator.builders import PRINCIPAL, WORKSPACE, decision_doc, profile_doc, ruleset_doc


def parse(doc, **kwargs):
    return DecisionEvaluationRequest.from_dict(
        doc, principal_id=kwargs.get("principal_id", PRINCIPAL), workspace_id=WORKSPACE
    )


def base_doc():
    return {"ruleset": ruleset_doc(2), "input": {"text": "hello"}}


def test_round_trip_of_a_full_ruleset():
    doc = {
        "id": "triage",
        "version": "3",
        "decisions": [
            decision_doc(
                "spam",
                retry={"maxAttempts": 3, "initialBackoffMs": 50, "maxBackoffMs": 400},
                costPerTokenUsd=0.000002,
                fallbacks=[{"adapter": "backup", "model": "m2", "timeoutMs": 500}],
            ),
            {
                "id": "score",
                "prompt": "Score ${text}",
                "outputSchema": {
                    "type": "object",
                    "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}},
                    "required": ["score"],
                    "additionalProperties": False,
                },
                "binding": {"primary": {"adapter": "fake", "model": "m"}},
            },
        ],
    }
    ruleset = Ruleset.from_dict(doc)
    assert [d.id for d in ruleset.decisions] == ["spam", "score"]
    spam = ruleset.decisions[0]
    assert spam.binding.primary.retry == RetryPolicy(3, 50, 400)
    assert [t.adapter for t in spam.binding.targets] == ["fake", "backup"]
    assert Ruleset.from_dict(ruleset.to_dict()) == ruleset
    assert ruleset.digest == Ruleset.from_dict(ruleset.to_dict()).digest
    assert ruleset.adapter_ids() == {"fake", "backup"}


def test_defaults_keep_the_scheduler_serial():
    request = parse(base_doc())
    assert request.scheduler == SchedulerOptions()
    assert request.scheduler.enabled is False
    assert request.scheduler.binding_concurrency == 1
    assert request.principal_id == PRINCIPAL and request.workspace_id == WORKSPACE


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("ruleset"), "ruleset"),
        (lambda d: d["ruleset"].pop("decisions"), "ruleset.decisions"),
        (lambda d: d["ruleset"].update(decisions=[]), "ruleset.decisions"),
        (lambda d: d["ruleset"].update(extra=1), "ruleset.extra"),
        (lambda d: d["ruleset"]["decisions"][1].update(id="d0"), "ruleset.decisions[1].id"),
        (lambda d: d["ruleset"]["decisions"][0].update(id="bad id!"), "ruleset.decisions[0].id"),
        (lambda d: d["ruleset"]["decisions"][0].update(prompt=""), "ruleset.decisions[0].prompt"),
        (
            lambda d: d["ruleset"]["decisions"][0].update(prompt="Is ${ broken"),
            "ruleset.decisions[0].prompt",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0].update(prompt="Is ${missing}?"),
            "ruleset.decisions[0].prompt",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0].update(outputSchema={"type": "string"}),
            "ruleset.decisions[0].allowedOutputs",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0].update(allowedOutputs=["a", "a"]),
            "ruleset.decisions[0].allowedOutputs",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(timeoutMs=0),
            "ruleset.decisions[0].binding.primary.timeoutMs",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(timeoutMs=True),
            "ruleset.decisions[0].binding.primary.timeoutMs",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(
                timeoutMs=float("nan")
            ),
            "ruleset.decisions[0].binding.primary.timeoutMs",
        ),
        (
            # A JSON integer literal beyond any float: refused, never an OverflowError.
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(timeoutMs=10**400),
            "ruleset.decisions[0].binding.primary.timeoutMs",
        ),
        (lambda d: d.update(deadlineMs=-(10**400)), "deadlineMs"),
        (
            lambda d: (
                d["ruleset"]["decisions"][0].update(
                    outputSchema={"type": ["string"]}, allowedOutputs=None
                )
                or d["ruleset"]["decisions"][0].pop("allowedOutputs")
            ),
            "ruleset.decisions[0].outputSchema.type",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].pop("model"),
            "ruleset.decisions[0].binding.primary.model",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(
                retry={"maxAttempts": 0}
            ),
            "ruleset.decisions[0].binding.primary.retry.maxAttempts",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(
                retry={"maxAttempts": 2.5}
            ),
            "ruleset.decisions[0].binding.primary.retry.maxAttempts",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(
                retry={"initialBackoffMs": 500, "maxBackoffMs": 100}
            ),
            "ruleset.decisions[0].binding.primary.retry.initialBackoffMs",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"]["primary"].update(
                apiKeyEnv="sk-live-not-a-name"
            ),
            "ruleset.decisions[0].binding.primary.apiKeyEnv",
        ),
        (
            lambda d: d["ruleset"]["decisions"][0]["binding"].update(fallbacks=[{}]),
            "ruleset.decisions[0].binding.fallbacks[0].adapter",
        ),
        (lambda d: d.update(callerConcurrency=0), "callerConcurrency"),
        (lambda d: d.update(graphConcurrency=-1), "graphConcurrency"),
        (lambda d: d.update(deadlineMs="soon"), "deadlineMs"),
        (lambda d: d.update(scheduler={"enabled": "yes"}), "scheduler.enabled"),
        (lambda d: d.update(scheduler={"bindingConcurrency": 0}), "scheduler.bindingConcurrency"),
        (lambda d: d.update(scheduler={"turbo": True}), "scheduler.turbo"),
        (
            lambda d: d.update(scheduler={"profile": {**profile_doc(), "workspace": {}}}),
            "scheduler.profile.workspace.concurrency",
        ),
        (lambda d: d.update(input=[1, 2]), "input"),
        (lambda d: d.update(input={"text": float("inf")}), "input"),
    ],
)
def test_malformed_requests_are_invalid_definitions_naming_the_field(mutate, field):
    doc = base_doc()
    mutate(doc)
    with pytest.raises(InvalidDefinitionError) as caught:
        parse(doc)
    assert caught.value.reason == "invalid-definition"
    assert caught.value.field == field


@pytest.mark.parametrize("key", ["principal", "principalId", "workspace", "workspaceId"])
def test_identity_comes_from_the_host_never_from_the_document(key):
    doc = base_doc()
    doc[key] = "someone-else"
    with pytest.raises(InvalidDefinitionError) as caught:
        parse(doc)
    assert caught.value.field == key


def test_a_profile_in_the_request_is_read_for_the_trusted_workspace():
    doc = base_doc()
    doc["scheduler"] = {"enabled": True, "bindingConcurrency": 4, "profile": profile_doc()}
    request = parse(doc)
    assert request.scheduler.profile is not None
    assert request.scheduler.profile.workspace_id == WORKSPACE


def test_request_repr_keeps_identities_and_input_out():
    request = parse(base_doc())
    text = repr(request)
    assert PRINCIPAL not in text and WORKSPACE not in text and "hello" not in text


def test_output_spec_parsing():
    closed = OutputSpec(allowed_outputs=("yes", "no"))
    assert closed.parse(" yes\n") == "yes"
    assert closed.parse("YES") == "yes"
    with pytest.raises(InvalidOutputError):
        closed.parse("maybe")
    schema = OutputSpec(
        schema={
            "type": "object",
            "properties": {"score": {"type": "integer", "maximum": 10}},
            "required": ["score"],
        }
    )
    assert schema.parse('{"score": 3}') == {"score": 3}
    for bad in ('{"score": 11}', "{}", "not json", '{"score": true}'):
        with pytest.raises(InvalidOutputError):
            schema.parse(bad)


def test_prompt_rendering_writes_non_text_input_as_json():
    request = parse({"ruleset": ruleset_doc(1), "input": {"text": {"b": 1, "a": [2]}}})
    assert request.ruleset.decisions[0].render(request.input) == 'Is {"a": [2], "b": 1} acceptable?'
