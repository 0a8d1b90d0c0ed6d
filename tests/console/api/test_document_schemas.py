"""The JSON Schemas of the profile and evaluation documents: served by the API, valid draft
2020-12, satisfied by every example in the docs and every demo document, and in agreement with
the parsers the server really uses, on documents Hypothesis mutates at random."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.core import InvalidProfileError
from admission.models import Workspace
from admission.services import profiles as services
from config.demo import DEMO_PROFILE, demo_profile
from console.api.schemas import document_schema
from console.forms.runs import example_request
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.invocation import DecisionEvaluationRequest

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS_MD = ROOT / "docs" / "documents.md"
PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")

PROFILE = jsonschema.Draft202012Validator(document_schema("profile"))
EVALUATION = jsonschema.Draft202012Validator(document_schema("evaluation"))

# What each schema cannot say, by the field the server names when it refuses.
PROFILE_BEYOND_SCHEMA = re.compile(
    r"reservedConcurrency: \d+ is above this principal's concurrency"
    r"|^principals: reservedConcurrency sums to|: duplicate principal id "
    # The schema names the invisible characters people paste; Python's full list of
    # non-printable code points (unassigned, private use, other separators) it cannot.
    r"| must be printable text \(U\+"
)
EVALUATION_BEYOND_SCHEMA = re.compile(
    r"\.prompt: refers to missing input|\.id: repeats an earlier id"
    r"|initialBackoffMs: must not exceed maxBackoffMs|outputSchema.*: nests deeper"
)


def profile_errors(document: Any) -> str | None:
    """The server's verdict on a proposed document: None, or the field it names."""
    workspace = Workspace(key="acme", name="Acme")
    try:
        services.profile_document_check(workspace, document)
    except InvalidProfileError as error:
        return f"{error.field}: {error.problem}"
    return None


def evaluation_errors(document: Any) -> str | None:
    """The verdict of the parser the submit service runs (without the deployment's adapters)."""
    scheduler = document.get("scheduler") if isinstance(document, dict) else None
    if isinstance(scheduler, dict) and scheduler.get("profile") is not None:
        return "scheduler.profile"
    try:
        DecisionEvaluationRequest.from_dict(document, principal_id="ann", workspace_id="acme")
    except InvalidDefinitionError as error:
        return f"{error.field}: {error.problem}"
    return None


def _examples() -> list[tuple[str, bool, Any]]:
    """(schema name, valid?, document) for every marked JSON block of docs/documents.md."""
    text = DOCUMENTS_MD.read_text(encoding="utf-8")
    found = re.findall(
        r"<!-- (example|counterexample): (profile|evaluation) -->\s*```json\n(.*?)```", text, re.S
    )
    return [(name, kind == "example", json.loads(body)) for kind, name, body in found]


def test_both_schemas_are_valid_draft_2020_12():
    for name in ("profile", "evaluation"):
        schema = document_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["profile", "evaluation"])
def test_the_api_serves_each_schema_without_authentication(client, name):
    response = client.get(f"/api/schemas/{name}.json", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/schema+json"
    assert json.loads(response.content) == document_schema(name)
    openapi = client.get("/api/schema/?format=json").json()
    assert f"/api/schemas/{name}.json" in openapi["paths"]


def test_every_example_in_the_docs_is_judged_alike_by_schema_and_parser():
    examples = _examples()
    assert {(name, valid) for name, valid, _ in examples} == {
        ("profile", True),
        ("profile", False),
        ("evaluation", True),
        ("evaluation", False),
    }
    for name, valid, document in examples:
        validator, parse = (
            (PROFILE, profile_errors) if name == "profile" else (EVALUATION, evaluation_errors)
        )
        assert validator.is_valid(document) is valid, (name, document)
        assert (parse(document) is None) is valid, (name, document)


def test_the_demo_and_manifest_documents_are_valid():
    manifest = json.loads((ROOT / "manifests" / "load-manifest.v2.json").read_text())
    profiles = [DEMO_PROFILE, demo_profile("demo-v2", concurrency=3)]
    profiles.append({key: manifest[key] for key in PROFILE_KEYS})
    for document in profiles:
        assert list(PROFILE.iter_errors(document)) == []
        assert profile_errors(document) is None
    evaluations = [
        json.loads((ROOT / "docs" / "example-evaluation.json").read_text()),
        example_request(3),
    ]
    for document in evaluations:
        assert list(EVALUATION.iter_errors(document)) == []
        assert evaluation_errors(document) is None


# ------------------------------------------------------------------ random documents

PROFILE_SEED = {
    "profileVersion": "v1",
    "workspace": {
        "concurrency": 4,
        "requestsPerMinute": 600,
        "maxQueueLength": 64,
        "maxPrincipalShare": 0.5,
    },
    "providers": {
        "jev": {
            "concurrency": 3,
            "tokensPerSecond": 12000,
            "circuitBreaker": {"failureThreshold": 5, "openMs": 1000},
        }
    },
    "principals": [
        {"id": "ann", "class": "quiet", "limits": {"concurrency": 2, "reservedConcurrency": 1}},
        {"id": "bob", "limits": {"concurrency": 2, "maxCostUsd": 1, "allowUnknownCost": True}},
    ],
}
PROFILE_MAPPING_SEED = {
    **PROFILE_SEED,
    "principals": {"ann": {"concurrency": 1, "maxTokens": 100}},
}
EVALUATION_SEED = {
    "ruleset": {
        "id": "screening",
        "version": "1",
        "decisions": [
            {
                "id": "check-1",
                "prompt": "Is ${text} acceptable? Costs $$5.",
                "allowedOutputs": ["yes", "no"],
                "binding": {
                    "primary": {
                        "adapter": "fake",
                        "model": "m",
                        "timeoutMs": 1000,
                        "retry": {"maxAttempts": 2, "initialBackoffMs": 10, "maxBackoffMs": 100},
                    },
                    "fallbacks": [{"adapter": "other", "model": "m2", "apiKeyEnv": "KEY"}],
                },
            },
            {
                "id": "score",
                "prompt": "Score $text",
                "outputSchema": {
                    "type": "object",
                    "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "required": ["score"],
                },
                "binding": {"primary": {"adapter": "fake", "model": "m"}},
            },
        ],
    },
    "input": {"text": "a refund"},
    "scheduler": {"enabled": True, "bindingConcurrency": 2},
    "deadlineMs": 60000,
    "invocationId": "inv-1",
}

# Values an edit writes: the boundaries and the wrong types the parsers must refuse.
EDGE_VALUES: list[Any] = [
    0,
    1,
    -1,
    2.0,
    2.5,
    0.5,
    1.5,
    10_000,
    10_001,
    2**53,
    2**53 - 1,
    10**400,
    True,
    False,
    None,
    "",
    " ",
    "x",
    "$5",
    "${x}",
    "a" * 129,
    "KEY",
    "1bad env",
    [],
    {},
    ["yes", "yes"],
    {"type": "string"},
    {"concurrency": 1},
    {"failureThreshold": 0},
]
VALUES = st.one_of(
    st.sampled_from(EDGE_VALUES),
    st.integers(min_value=-3, max_value=2**54),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
)
EDGE_KEYS = [
    "concurrency",
    "reservedConcurrency",
    "maxPrincipalShare",
    "circuitBreaker",
    "unknownKey",
    "allowedOutputs",
    "outputSchema",
    "principal",
    "profile",
    "version",
    "fallbacks",
    "openMs",
]
KEYS = st.sampled_from(EDGE_KEYS)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


@st.composite
def mutated(draw: Any, seeds: list[dict[str, Any]]) -> Any:
    """A seed document with one to three random edits: replace, delete or add a key."""
    document = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        if not path:
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        operation = draw(st.sampled_from(["replace", "delete", "add"]))
        # Copied: a drawn list or object must not carry edits into later examples.
        if operation == "replace":
            parent[path[-1]] = copy.deepcopy(draw(VALUES))
        elif operation == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(KEYS)] = copy.deepcopy(draw(VALUES))
    return document


def single_edits(seed: dict[str, Any]) -> list[Any]:
    """Every document one edit away from ``seed``: each value replaced by each edge value, each
    key or item deleted, each edge key added to each object."""
    documents = []
    for path in _paths(seed)[1:]:
        edits: list[tuple[str, Any]] = [("replace", value) for value in EDGE_VALUES]
        edits += [("delete", None)] + [("add", key) for key in EDGE_KEYS]
        for operation, argument in edits:
            document = copy.deepcopy(seed)
            parent = document
            for step in path[:-1]:
                parent = parent[step]
            if operation == "replace":
                parent[path[-1]] = copy.deepcopy(argument)
            elif operation == "delete":
                del parent[path[-1]]
            elif isinstance(parent[path[-1]], dict):
                parent[path[-1]][argument] = 1
            else:
                continue
            documents.append(document)
    return documents


def _agree(validator: Any, verdict: str | None, beyond: re.Pattern[str], document: Any) -> None:
    schema_ok = validator.is_valid(document)
    if verdict is None:
        assert schema_ok, (list(validator.iter_errors(document))[:1], document)
    elif schema_ok:
        # Only the rules a schema cannot state may refuse what the schema accepts.
        assert beyond.search(verdict), (verdict, document)


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [PROFILE_SEED, PROFILE_MAPPING_SEED])
def test_the_profile_schema_agrees_with_the_server_one_edit_from_a_seed(seed):
    documents = single_edits(seed)
    verdicts = [profile_errors(document) for document in documents]
    # Both kinds are represented: the sweep is not all rejections.
    assert any(v is None for v in verdicts) and any(v is not None for v in verdicts)
    for document, verdict in zip(documents, verdicts, strict=True):
        _agree(PROFILE, verdict, PROFILE_BEYOND_SCHEMA, document)


def test_the_evaluation_schema_agrees_with_the_server_one_edit_from_a_seed():
    documents = single_edits(EVALUATION_SEED)
    verdicts = [evaluation_errors(document) for document in documents]
    assert any(v is None for v in verdicts) and any(v is not None for v in verdicts)
    for document, verdict in zip(documents, verdicts, strict=True):
        _agree(EVALUATION, verdict, EVALUATION_BEYOND_SCHEMA, document)


@pytest.mark.django_db
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated([PROFILE_SEED, PROFILE_MAPPING_SEED]))
def test_the_profile_schema_agrees_with_the_server(document):
    _agree(PROFILE, profile_errors(document), PROFILE_BEYOND_SCHEMA, document)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated([EVALUATION_SEED]))
def test_the_evaluation_schema_agrees_with_the_server(document):
    _agree(EVALUATION, evaluation_errors(document), EVALUATION_BEYOND_SCHEMA, document)
