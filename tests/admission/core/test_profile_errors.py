"""The exact `field` and `problem` of each kind of bad profile, and what valid profiles write back.

`InvalidProfileError.field` and `.problem` reach the operator (admin form errors, API responses),
so they are asserted here word for word, for documents parsed by `Profile.from_dict` and for
objects built in Python.
"""

import copy
import math
import pickle
from types import MappingProxyType

import pytest

from admission.core.errors import InvalidProfileError, ProfileConflictError
from admission.core.limits import BreakerConfig, Limits, Profile

MAX_SAFE = 2**53 - 1


def document():
    return {
        "profileVersion": "v1",
        "workspace": {"concurrency": 10},
        "providers": {"llm": {"concurrency": 8, "circuitBreaker": {"failureThreshold": 3}}},
        "principals": [
            {"id": "alice", "limits": {"concurrency": 4}},
            {"id": "bob", "limits": {"concurrency": 4}},
        ],
    }


def replaced(path, value, doc=None):
    doc = copy.deepcopy(document() if doc is None else doc)
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def dropped(path):
    doc = document()
    node = doc
    for step in path[:-1]:
        node = node[step]
    del node[path[-1]]
    return doc


def refusal(doc, workspace_id="ws-1"):
    with pytest.raises(InvalidProfileError) as caught:
        Profile.from_dict(doc, workspace_id=workspace_id)
    error = caught.value
    assert str(error) == f"{error.field}: {error.problem}"
    return error.field, error.problem


def refusal_of(build):
    with pytest.raises(InvalidProfileError) as caught:
        build()
    return caught.value.field, caught.value.problem


# Values of the wrong kind, per kind of field


WORKSPACE_CONCURRENCY = ("workspace", "concurrency")
QUEUE_LENGTH = ("principals", 0, "limits", "maxQueueLength")
COST = ("workspace", "maxCostUsd")
SHARE = ("workspace", "maxPrincipalShare")
FLAG = ("workspace", "allowUnknownCost")
BREAKER = ("providers", "llm", "circuitBreaker")

BAD_VALUES = [
    # A positive count (concurrency).
    (WORKSPACE_CONCURRENCY, "4", "must be an integer, got a string"),
    (WORKSPACE_CONCURRENCY, None, "must be an integer, got null"),
    (WORKSPACE_CONCURRENCY, True, "must be an integer, got a boolean"),
    (WORKSPACE_CONCURRENCY, [4], "must be an integer, got an array"),
    (WORKSPACE_CONCURRENCY, {"n": 4}, "must be an integer, got an object"),
    (WORKSPACE_CONCURRENCY, {4}, "must be an integer, got a set"),
    (WORKSPACE_CONCURRENCY, 0, "must be at least 1, got 0"),
    (WORKSPACE_CONCURRENCY, 0.0, "must be at least 1, got 0"),
    (WORKSPACE_CONCURRENCY, -3, "must be at least 1, got -3"),
    (WORKSPACE_CONCURRENCY, 2.5, "must be an integer, got 2.5"),
    (WORKSPACE_CONCURRENCY, math.nan, "must be finite, got nan"),
    (WORKSPACE_CONCURRENCY, math.inf, "must be finite, got inf"),
    (WORKSPACE_CONCURRENCY, 2**53, f"must be at most {MAX_SAFE}"),
    (WORKSPACE_CONCURRENCY, 10**400, "must be an integer of finite size"),
    # A count that may be zero.
    (QUEUE_LENGTH, -1, "must be at least 0, got -1"),
    (QUEUE_LENGTH, -1.0, "must be at least 0, got -1"),
    (QUEUE_LENGTH, 0.5, "must be an integer, got 0.5"),
    (QUEUE_LENGTH, False, "must be an integer, got a boolean"),
    (QUEUE_LENGTH, "32", "must be an integer, got a string"),
    (("providers", "llm", "maxRequestBytes"), 2**53, f"must be at most {MAX_SAFE}"),
    # An amount.
    (COST, "1.5", "must be a number, got a string"),
    (COST, None, "must be a number, got null"),
    (COST, True, "must be a number, got a boolean"),
    (COST, -0.5, "must not be negative, got -0.5"),
    (COST, -2, "must not be negative, got -2"),
    (COST, -math.inf, "must be finite, got -inf"),
    (COST, 10**400, "must be a number of finite size"),
    (("providers", "llm", "requestsPerMinute"), math.nan, "must be finite, got nan"),
    # A share.
    (SHARE, "0.5", "must be a number, got a string"),
    (SHARE, True, "must be a number, got a boolean"),
    (SHARE, 0, "must be in (0, 1], got 0"),
    (SHARE, 1.5, "must be in (0, 1], got 1.5"),
    (SHARE, -0.5, "must be in (0, 1], got -0.5"),
    (SHARE, 10**400, "must be a number of finite size"),
    (("providers", "llm", "maxPrincipalShare"), 2, "must be in (0, 1], got 2"),
    # A flag.
    (FLAG, 1, "must be true or false, got a number"),
    (FLAG, "true", "must be true or false, got a string"),
    (FLAG, None, "must be true or false, got null"),
    (FLAG, [], "must be true or false, got an array"),
    # The circuit breaker and its fields.
    (BREAKER, 3, "must be an object, got a number"),
    (BREAKER, [], "must be an object, got an array"),
    ((*BREAKER, "failureThreshold"), 0, "must be at least 1, got 0"),
    ((*BREAKER, "failureThreshold"), 1.5, "must be an integer, got 1.5"),
    ((*BREAKER, "failureThreshold"), "5", "must be an integer, got a string"),
    ((*BREAKER, "openMs"), -1, "must not be negative, got -1"),
    ((*BREAKER, "openMs"), math.nan, "must be finite, got nan"),
    ((*BREAKER, "halfOpenMaxCalls"), 0, "must be at least 1, got 0"),
    ((*BREAKER, "halfOpenMaxCalls"), True, "must be an integer, got a boolean"),
]


def _dotted(path):
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    BAD_VALUES,
    ids=[f"{_dotted(path)}={value!r:.20}" for path, value, _ in BAD_VALUES],
)
def test_a_value_of_the_wrong_kind_is_refused_with_its_field_and_problem(path, value, problem):
    assert refusal(replaced(path, value)) == (_dotted(path), problem)


ACCEPTED_EDGES = [
    (WORKSPACE_CONCURRENCY, 1, "concurrency", 1),
    (WORKSPACE_CONCURRENCY, 3.0, "concurrency", 3),
    (("workspace", "maxAttempts"), 0, "max_attempts", 0),
    (("workspace", "maxQueueLength"), 0, "max_queue_length", 0),
    (("workspace", "maxRequestBytes"), MAX_SAFE, "max_request_bytes", MAX_SAFE),
    (COST, 0, "max_cost_usd", 0),
    (COST, 0.25, "max_cost_usd", 0.25),
    (SHARE, 1, "max_principal_share", 1),
    (SHARE, 0.001, "max_principal_share", 0.001),
    (FLAG, False, "allow_unknown_cost", False),
]


@pytest.mark.parametrize(("path", "value", "attr", "stored"), ACCEPTED_EDGES)
def test_values_at_the_edge_of_their_range_are_accepted(path, value, attr, stored):
    profile = Profile.from_dict(replaced(path, value), workspace_id="ws-1")
    got = getattr(profile.workspace, attr)
    assert got == stored
    assert type(got) is type(stored)


def test_breaker_fields_at_their_minimum_are_accepted():
    breaker = {"failureThreshold": 1, "openMs": 0, "halfOpenMaxCalls": 1}
    profile = Profile.from_dict(replaced(BREAKER, breaker), workspace_id="ws-1")
    assert profile.providers["llm"].circuit_breaker == BreakerConfig(1, 0, 1)


# The shape of the document


STRUCTURE = [
    pytest.param(["not", "an", "object"], "profile", "must be an object, got an array", id="doc"),
    pytest.param({**document(), "schema": "x"}, "schema", "unknown key", id="unknown-top"),
    pytest.param({**document(), 3: "x"}, "3", "unknown key", id="non-string-top"),
    pytest.param(dropped(("profileVersion",)), "profileVersion", "is required", id="no-version"),
    pytest.param(dropped(("workspace",)), "workspace", "is required", id="no-workspace"),
    pytest.param(dropped(("providers",)), "providers", "is required", id="no-providers"),
    pytest.param(dropped(("principals",)), "principals", "is required", id="no-principals"),
    pytest.param(
        replaced(("workspace",), "x"), "workspace", "must be an object, got a string", id="ws"
    ),
    pytest.param(
        replaced(("providers",), []), "providers", "must be an object, got an array", id="prov"
    ),
    pytest.param(
        replaced(("providers", "llm"), None),
        "providers.llm",
        "must be an object, got null",
        id="provider-limits",
    ),
    pytest.param(
        replaced(("principals",), "x"),
        "principals",
        "must be an array or an object, got a string",
        id="principals-string",
    ),
    pytest.param(
        replaced(("principals",), None),
        "principals",
        "must be an array or an object, got null",
        id="principals-null",
    ),
    pytest.param(
        replaced(("principals", 1), 7),
        "principals[1]",
        "must be an object, got a number",
        id="entry",
    ),
    pytest.param(dropped(("principals", 0, "id")), "principals[0].id", "is required", id="no-id"),
    pytest.param(
        dropped(("principals", 1, "limits")), "principals[1].limits", "is required", id="no-lim"
    ),
    pytest.param(
        replaced(("principals", 0, "limits"), 4),
        "principals[0].limits",
        "must be an object, got a number",
        id="limits-number",
    ),
    pytest.param(
        replaced(("principals", 1, "id"), "alice"),
        "principals[1].id",
        "duplicate principal id 'alice'",
        id="duplicate",
    ),
    pytest.param(
        replaced(("principals", 0, 5), "x"),
        "principals[0].5",
        "keys must be strings",
        id="entry-key",
    ),
    pytest.param(
        dropped(("workspace", "concurrency")), "workspace.concurrency", "is required", id="no-conc"
    ),
    pytest.param(
        dropped(("principals", 1, "limits", "concurrency")),
        "principals[1].limits.concurrency",
        "is required",
        id="no-principal-conc",
    ),
    pytest.param(
        dropped((*BREAKER, "failureThreshold")),
        "providers.llm.circuitBreaker.failureThreshold",
        "is required",
        id="no-threshold",
    ),
    pytest.param(
        replaced(("workspace", "maxWidgets"), 1), "workspace.maxWidgets", "unknown key", id="lim"
    ),
    pytest.param(replaced(("workspace", 7), 1), "workspace.7", "unknown key", id="lim-int-key"),
    pytest.param(
        replaced((*BREAKER, "resetMs"), 1),
        "providers.llm.circuitBreaker.resetMs",
        "unknown key",
        id="breaker-key",
    ),
    pytest.param(
        replaced((*BREAKER, 7), 1),
        "providers.llm.circuitBreaker.7",
        "unknown key",
        id="breaker-int-key",
    ),
]


@pytest.mark.parametrize(("doc", "field", "problem"), STRUCTURE)
def test_a_malformed_document_is_refused_with_its_field_and_problem(doc, field, problem):
    assert refusal(doc) == (field, problem)


FORBIDDEN = [
    (("workspace", "reservedConcurrency"), 1, "is allowed only on principal limits"),
    (
        ("workspace", "circuitBreaker"),
        {"failureThreshold": 2},
        "is allowed only on provider limits",
    ),
    (("providers", "llm", "reservedConcurrency"), 1, "is allowed only on principal limits"),
    (
        ("principals", 0, "limits", "maxPrincipalShare"),
        0.5,
        "is allowed only on workspace and provider limits",
    ),
    (
        ("principals", 1, "limits", "circuitBreaker"),
        {"failureThreshold": 2},
        "is allowed only on provider limits",
    ),
]


@pytest.mark.parametrize(("path", "value", "problem"), FORBIDDEN)
def test_a_key_forbidden_on_its_scope_is_refused(path, value, problem):
    assert refusal(replaced(path, value)) == (_dotted(path), problem)


def test_a_key_forbidden_on_a_principal_is_refused_in_mapping_form_too():
    doc = replaced(("principals",), {"alice": {"concurrency": 1, "maxPrincipalShare": 0.5}})
    assert refusal(doc) == (
        "principals.alice.maxPrincipalShare",
        "is allowed only on workspace and provider limits",
    )


# Ids and labels

LABELS = [
    ("", "must be a non-empty string"),
    (7, "must be a non-empty string"),
    (None, "must be a non-empty string"),
    ("   ", "must not be only whitespace"),
    (" v1", "must not start or end with whitespace"),
    ("v1\t", "must not start or end with whitespace"),
    ("v" * 129, "must be at most 128 characters"),
    ("v\u200b1", "must be printable text (U+200B is a control or format character)"),
    ("v\x001", "must be printable text (U+0000 is a control or format character)"),
]


@pytest.mark.parametrize(("label", "problem"), LABELS)
def test_a_bad_profile_version_is_refused(label, problem):
    doc = replaced(("profileVersion",), label)
    assert refusal(doc) == ("profileVersion", f"profile version {problem}")


@pytest.mark.parametrize(("label", "problem"), LABELS)
def test_a_bad_workspace_id_is_refused(label, problem):
    assert refusal(document(), workspace_id=label) == ("workspaceId", f"workspace id {problem}")


@pytest.mark.parametrize(("label", "problem"), LABELS)
def test_a_bad_principal_id_in_list_form_is_refused(label, problem):
    doc = replaced(("principals", 1, "id"), label)
    assert refusal(doc) == ("principals[1].id", f"principal id {problem}")


def test_bad_provider_and_mapping_form_principal_ids_are_refused():
    doc = replaced(("providers",), {" llm": {"concurrency": 1}})
    assert refusal(doc) == (
        "providers. llm",
        "provider id must not start or end with whitespace",
    )
    doc = replaced(("providers",), {"": {"concurrency": 1}})
    assert refusal(doc) == ("providers.''", "provider id must be a non-empty string")
    doc = replaced(("principals",), {"": {"concurrency": 1}})
    assert refusal(doc) == ("principals.''", "principal id must be a non-empty string")
    doc = replaced(("principals",), {"a\nb": {"concurrency": 1}})
    assert refusal(doc) == (
        "principals.'a\\nb'",
        "principal id must be printable text (U+000A is a control or format character)",
    )


KEY_LABELS = [
    ("k" * 64, "workspace." + "k" * 64),
    ("k" * 65, "workspace.'kkkkkkkkkkkk...kkkkkkkkkkkkk'"),
    ("max\nTokens", "workspace.'max\\nTokens'"),
    ("", "workspace.''"),
    (7, "workspace.7"),
    (None, "workspace.None"),
]


@pytest.mark.parametrize(("key", "field"), KEY_LABELS)
def test_a_field_name_is_shown_as_written_when_short_and_printable_else_abbreviated(key, field):
    assert refusal(replaced(("workspace", key), 1)) == (field, "unknown key")


# Reservations


def test_a_reservation_above_the_principals_own_concurrency_is_refused():
    doc = replaced(("principals", 1, "limits"), {"concurrency": 2, "reservedConcurrency": 3})
    assert refusal(doc) == (
        "principals[1].limits.reservedConcurrency",
        "3 is above this principal's concurrency 2",
    )


def test_a_reservation_equal_to_the_principals_concurrency_is_accepted():
    doc = replaced(("principals", 1, "limits"), {"concurrency": 2, "reservedConcurrency": 2})
    profile = Profile.from_dict(doc, workspace_id="ws-1")
    assert profile.principals["bob"].reserved_concurrency == 2


def _reserving(workspace_concurrency, provider_concurrency, each):
    doc = document()
    doc["workspace"]["concurrency"] = workspace_concurrency
    doc["providers"]["llm"]["concurrency"] = provider_concurrency
    for entry in doc["principals"]:
        entry["limits"] = {"concurrency": 4, "reservedConcurrency": each}
    return doc


def test_reservations_summing_above_the_workspace_pool_are_refused():
    assert refusal(_reserving(3, 8, 2)) == (
        "principals",
        "reservedConcurrency sums to 4, above workspace.concurrency 3",
    )


def test_reservations_summing_above_a_provider_pool_are_refused():
    assert refusal(_reserving(10, 3, 2)) == (
        "principals",
        "reservedConcurrency sums to 4, above providers.llm.concurrency 3",
    )


def test_reservations_summing_to_exactly_the_pools_are_accepted():
    profile = Profile.from_dict(_reserving(4, 4, 2), workspace_id="ws-1")
    assert [limits.reserved_concurrency for limits in profile.principals.values()] == [2, 2]


# Extra keys of list-form principal entries


def nested(levels, leaf=0, *, as_object=False):
    value = leaf
    for _ in range(levels):
        value = {"k": value} if as_object else [value]
    return value


def with_extra(value, key="note"):
    return replaced(("principals", 0, key), value)


def test_extra_keys_of_principal_entries_are_written_back_unchanged():
    extras = {
        "team": "core",
        "note": None,
        "weight": 2.5,
        "ids": [1, -2, 0.5, True, False, None, "x"],
        "meta": {"owner": {"name": "Alice", "tags": ["a", {"b": []}]}, "empty": {}},
    }
    doc = document()
    doc["principals"][0] = {"id": "alice", **extras, "limits": {"concurrency": 4}}
    profile = Profile.from_dict(doc, workspace_id="ws-1")
    written = profile.to_dict()["principals"][0]
    assert written == {"id": "alice", **extras, "limits": {"concurrency": 4}}
    assert list(written) == ["id", *extras, "limits"]


def test_extra_keys_are_copied_out_of_the_document():
    doc = with_extra({"owner": {"tags": ["a"]}}, key="meta")
    profile = Profile.from_dict(doc, workspace_id="ws-1")
    doc["principals"][0]["meta"]["owner"]["tags"].append("b")
    doc["principals"][0]["meta"]["added"] = 1
    assert profile.to_dict()["principals"][0]["meta"] == {"owner": {"tags": ["a"]}}


def test_tuples_in_extra_keys_are_written_back_as_arrays():
    profile = Profile.from_dict(with_extra((1, (2, "x"))), workspace_id="ws-1")
    assert profile.to_dict()["principals"][0]["note"] == [1, [2, "x"]]


@pytest.mark.parametrize("as_object", [False, True], ids=["arrays", "objects"])
def test_extra_keys_nested_64_levels_are_accepted(as_object):
    value = nested(64, as_object=as_object)
    profile = Profile.from_dict(with_extra(value), workspace_id="ws-1")
    assert profile.to_dict()["principals"][0]["note"] == value


@pytest.mark.parametrize("as_object", [False, True], ids=["arrays", "objects"])
def test_extra_keys_nested_65_levels_are_refused(as_object):
    assert refusal(with_extra(nested(65, as_object=as_object))) == (
        "principals[0].note",
        "is nested deeper than 64 levels",
    )


def test_extra_keys_nested_far_too_deep_are_refused_without_recursing_away():
    assert refusal(with_extra(nested(5000, as_object=True))) == (
        "principals[0].note",
        "is nested deeper than 64 levels",
    )


NOT_JSON = [
    (math.nan, "must be finite, got nan"),
    ([1, [math.inf]], "must be finite, got inf"),
    ({"a": {"b": -math.inf}}, "must be finite, got -inf"),
    (10**400, "must be a number of finite size"),
    ({"a": [10**400]}, "must be a number of finite size"),
    ({1, 2}, "must be a JSON value, got a set"),
    ({"a": [b"x"]}, "must be a JSON value, got a bytes"),
    ({"a": {1: "x"}}, "object keys must be strings"),
    ({None: "x"}, "object keys must be strings"),
]


@pytest.mark.parametrize(("value", "problem"), NOT_JSON)
def test_extra_keys_that_are_not_json_are_refused(value, problem):
    assert refusal(with_extra(value)) == ("principals[0].note", problem)


def test_a_non_json_extra_key_is_named_abbreviated_when_unprintable():
    assert refusal(with_extra(math.nan, key="no\nte")) == (
        "principals[0].'no\\nte'",
        "must be finite, got nan",
    )


# Limits and BreakerConfig parsed on their own


def test_limits_refuse_an_unknown_scope():
    with pytest.raises(ValueError, match=r"^unknown limits scope 'global'$"):
        Limits.from_dict({"concurrency": 1}, scope="global", path="x")


def test_limits_and_breaker_name_fields_under_the_given_path():
    assert refusal_of(lambda: Limits.from_dict({}, scope="provider", path="p.q")) == (
        "p.q.concurrency",
        "is required",
    )
    assert refusal_of(lambda: Limits.from_dict([], scope="principal", path="p")) == (
        "p",
        "must be an object, got an array",
    )
    assert refusal_of(lambda: BreakerConfig.from_dict({"openMs": 1}, path="b")) == (
        "b.failureThreshold",
        "is required",
    )


def test_an_empty_path_names_the_bare_field():
    assert refusal_of(lambda: Limits.from_dict({"x": 1}, scope="workspace", path="")) == (
        "x",
        "unknown key",
    )
    assert refusal_of(lambda: BreakerConfig.from_dict({}, path="")) == (
        "failureThreshold",
        "is required",
    )


def test_breaker_fields_are_named_under_circuit_breaker_by_default():
    assert refusal_of(lambda: BreakerConfig.from_dict({})) == (
        "circuitBreaker.failureThreshold",
        "is required",
    )
    assert refusal_of(lambda: BreakerConfig.from_dict({"failureThreshold": 1, "x": 1})) == (
        "circuitBreaker.x",
        "unknown key",
    )
    assert refusal_of(lambda: BreakerConfig.from_dict("3")) == (
        "circuitBreaker",
        "must be an object, got a string",
    )


def test_from_manifest_refuses_a_manifest_that_is_not_an_object():
    assert refusal_of(lambda: Profile.from_manifest(3, workspace_id="ws-1")) == (
        "manifest",
        "must be an object, got a number",
    )


# Objects built in Python are held to the same rules

PYTHON_LIMITS = [
    (lambda: Limits(concurrency=0), "concurrency", "must be at least 1, got 0"),
    (lambda: Limits(concurrency="2"), "concurrency", "must be an integer, got a string"),
    (
        lambda: Limits(concurrency=2, max_retained_work=-1),
        "maxRetainedWork",
        "must be at least 0, got -1",
    ),
    (
        lambda: Limits(concurrency=2, max_principal_share=2),
        "maxPrincipalShare",
        "must be in (0, 1], got 2",
    ),
    (
        lambda: Limits(concurrency=2, tokens_per_second=-1.5),
        "tokensPerSecond",
        "must not be negative, got -1.5",
    ),
    (
        lambda: Limits(concurrency=2, allow_unknown_cost=1),
        "allowUnknownCost",
        "must be true or false, got a number",
    ),
    (
        lambda: Limits(concurrency=2, circuit_breaker={"failureThreshold": 1}),
        "circuitBreaker",
        "must be a BreakerConfig, got an object",
    ),
    (
        lambda: Limits(concurrency=2, reserved_concurrency=3),
        "reservedConcurrency",
        "3 is above this principal's concurrency 2",
    ),
    (lambda: BreakerConfig(0), "failureThreshold", "must be at least 1, got 0"),
    (lambda: BreakerConfig(2, open_ms=-1), "openMs", "must not be negative, got -1"),
    (
        lambda: BreakerConfig(2, half_open_max_calls=0.5),
        "halfOpenMaxCalls",
        "must be an integer, got 0.5",
    ),
]


@pytest.mark.parametrize(("build", "field", "problem"), PYTHON_LIMITS)
def test_limits_built_in_python_are_refused_with_the_json_field_name(build, field, problem):
    assert refusal_of(build) == (field, problem)


def test_limits_built_in_python_keep_counts_as_integers():
    limits = Limits(concurrency=2.0, max_tokens=10.0, requests_per_minute=3)
    assert (limits.concurrency, limits.max_tokens, limits.requests_per_minute) == (2, 10, 3)
    assert type(limits.concurrency) is int
    assert type(limits.max_tokens) is int
    assert Limits(concurrency=2, reserved_concurrency=2).reserved_concurrency == 2


def _profile(**overrides):
    fields = {
        "workspace_id": "ws-1",
        "profile_version": "v1",
        "workspace": Limits(concurrency=4),
        "providers": {"llm": Limits(concurrency=4)},
        "principals": {"alice": Limits(concurrency=2)},
    }
    fields.update(overrides)
    return Profile(**fields)


PYTHON_PROFILES = [
    ({"workspace_id": ""}, "workspaceId", "workspace id must be a non-empty string"),
    (
        {"profile_version": " v1"},
        "profileVersion",
        "profile version must not start or end with whitespace",
    ),
    ({"workspace": {"concurrency": 1}}, "workspace", "must be a Limits"),
    ({"providers": [Limits(concurrency=1)]}, "providers", "must be an object, got an array"),
    ({"principals": None}, "principals", "must be an object, got null"),
    (
        {"providers": {"llm": {"concurrency": 1}}},
        "providers.llm",
        "must be a Limits, got an object",
    ),
    ({"principals": {"bob": 3}}, "principals.bob", "must be a Limits, got a number"),
    ({"providers": {"": Limits(concurrency=1)}}, "providers.''", "id must be a non-empty string"),
    ({"principals": {5: Limits(concurrency=1)}}, "principals.5", "id must be a non-empty string"),
    (
        {"workspace": Limits(concurrency=4, reserved_concurrency=1)},
        "workspace.reservedConcurrency",
        "is allowed only on principal limits",
    ),
    (
        {"workspace": Limits(concurrency=4, circuit_breaker=BreakerConfig(2))},
        "workspace.circuitBreaker",
        "is allowed only on provider limits",
    ),
    (
        {"providers": {"llm": Limits(concurrency=4, reserved_concurrency=1)}},
        "providers.llm.reservedConcurrency",
        "is allowed only on principal limits",
    ),
    (
        {"principals": {"alice": Limits(concurrency=4, circuit_breaker=BreakerConfig(2))}},
        "principals.alice.circuitBreaker",
        "is allowed only on provider limits",
    ),
    (
        {
            "principals": {
                "a": Limits(3, reserved_concurrency=3),
                "b": Limits(3, reserved_concurrency=2),
            }
        },
        "principals",
        "reservedConcurrency sums to 5, above workspace.concurrency 4",
    ),
]


@pytest.mark.parametrize(("overrides", "field", "problem"), PYTHON_PROFILES)
def test_a_profile_built_in_python_is_refused_with_its_field_and_problem(overrides, field, problem):
    assert refusal_of(lambda: _profile(**overrides)) == (field, problem)


def test_a_profile_built_in_python_holds_read_only_copies_of_its_tables():
    providers = {"llm": Limits(concurrency=4)}
    principals = {"alice": Limits(concurrency=2)}
    profile = _profile(providers=providers, principals=principals)
    providers["other"] = Limits(concurrency=1)
    principals["bob"] = Limits(concurrency=1)
    assert list(profile.providers) == ["llm"]
    assert list(profile.principals) == ["alice"]
    with pytest.raises(TypeError):
        profile.principals["mallory"] = Limits(concurrency=1)
    with pytest.raises(TypeError):
        profile.providers["other"] = Limits(concurrency=1)


# Written keys: what to_dict gives back


def test_limits_write_only_what_was_set_or_written():
    assert Limits(concurrency=3).to_dict() == {"concurrency": 3}
    assert Limits(concurrency=3, allow_unknown_cost=False).to_dict() == {"concurrency": 3}
    assert Limits(concurrency=3, allow_unknown_cost=True).to_dict() == {
        "concurrency": 3,
        "allowUnknownCost": True,
    }
    parsed = Limits.from_dict(
        {"concurrency": 3, "allowUnknownCost": False}, scope="workspace", path="workspace"
    )
    assert parsed.to_dict() == {"concurrency": 3, "allowUnknownCost": False}
    assert parsed == Limits(concurrency=3)


ALL_LIMITS = {
    "concurrency": 6,
    "requestsPerMinute": 120,
    "tokensPerSecond": 2.5,
    "maxAttempts": 3,
    "maxBatchSize": 0,
    "maxCostUsd": 0.75,
    "allowUnknownCost": True,
    "maxTokens": 4096,
    "maxQueueLength": 10,
    "maxQueueWaitMs": 1500,
    "maxRequestBytes": 65536,
    "maxItems": 50,
    "maxRetainedWork": 7,
    "circuitBreaker": {"failureThreshold": 5, "openMs": 1000, "halfOpenMaxCalls": 2},
    "reservedConcurrency": 2,
    "maxPrincipalShare": 0.5,
}


def test_limits_with_every_provider_field_write_them_back_in_document_order():
    expected = {key: value for key, value in ALL_LIMITS.items() if key != "reservedConcurrency"}
    shuffled = dict(reversed(list(expected.items())))
    limits = Limits.from_dict(shuffled, scope="provider", path="providers.llm")
    assert limits.to_dict() == expected
    assert list(limits.to_dict()) == list(expected)


def test_limits_built_in_python_with_every_field_write_every_field():
    limits = Limits(
        concurrency=6,
        requests_per_minute=120,
        tokens_per_second=2.5,
        max_attempts=3,
        max_batch_size=0,
        max_cost_usd=0.75,
        allow_unknown_cost=True,
        max_tokens=4096,
        max_queue_length=10,
        max_queue_wait_ms=1500,
        max_request_bytes=65536,
        max_items=50,
        max_retained_work=7,
        circuit_breaker=BreakerConfig(5, open_ms=1000, half_open_max_calls=2),
        reserved_concurrency=2,
        max_principal_share=0.5,
    )
    assert limits.to_dict() == ALL_LIMITS
    assert list(limits.to_dict()) == list(ALL_LIMITS)


def test_provider_limits_write_their_breaker_as_an_object():
    doc = {"concurrency": 2, "circuitBreaker": {"failureThreshold": 4}}
    limits = Limits.from_dict(doc, scope="provider", path="providers.llm")
    assert limits.to_dict() == {"concurrency": 2, "circuitBreaker": {"failureThreshold": 4}}
    assert limits.circuit_breaker == BreakerConfig(4, open_ms=30000, half_open_max_calls=1)


def test_breaker_defaults_are_written_only_when_the_document_wrote_them():
    assert BreakerConfig(3).to_dict() == {"failureThreshold": 3}
    assert BreakerConfig(3, open_ms=500).to_dict() == {"failureThreshold": 3, "openMs": 500}
    assert BreakerConfig(3, half_open_max_calls=2).to_dict() == {
        "failureThreshold": 3,
        "halfOpenMaxCalls": 2,
    }
    explicit = {"failureThreshold": 3, "openMs": 30000, "halfOpenMaxCalls": 1}
    assert BreakerConfig.from_dict(explicit).to_dict() == explicit
    assert BreakerConfig.from_dict({"failureThreshold": 3, "openMs": 30000}).to_dict() == {
        "failureThreshold": 3,
        "openMs": 30000,
    }
    assert BreakerConfig.from_dict(explicit) == BreakerConfig(3)


def test_written_defaults_change_the_digest_but_not_equality():
    plain = Profile.from_dict(document(), workspace_id="ws-1")
    explicit = Profile.from_dict(replaced((*BREAKER, "openMs"), 30000), workspace_id="ws-1")
    assert explicit == plain
    assert explicit.digest != plain.digest
    assert explicit.to_dict()["providers"]["llm"]["circuitBreaker"] == {
        "failureThreshold": 3,
        "openMs": 30000,
    }


# Profile identity: equality, hashing, pickling


def test_equal_profiles_hash_alike_and_different_profiles_apart():
    one = Profile.from_dict(document(), workspace_id="ws-1")
    same = Profile.from_dict(document(), workspace_id="ws-1")
    assert one == same
    assert hash(one) == hash(same)
    others = [
        Profile.from_dict(replaced(("profileVersion",), "v2"), workspace_id="ws-1"),
        Profile.from_dict(document(), workspace_id="ws-2"),
        Profile.from_dict(replaced(WORKSPACE_CONCURRENCY, 9), workspace_id="ws-1"),
        Profile.from_dict(replaced(("providers", "llm", "concurrency"), 7), workspace_id="ws-1"),
        Profile.from_dict(replaced(("principals", 1, "id"), "carol"), workspace_id="ws-1"),
    ]
    assert all(other != one for other in others)
    # Distinct profiles must not all share one hash: sets and dicts of profiles stay fast.
    assert len({hash(profile) for profile in [one, *others]}) == 1 + len(others)
    assert len({one, same, *others}) == 1 + len(others)


def test_a_pickled_profile_keeps_its_document_and_digests():
    doc = with_extra({"owner": ["a", {"b": 1}]}, key="meta")
    profile = Profile.from_dict(doc, workspace_id="ws-1")
    again = pickle.loads(pickle.dumps(profile))
    assert again == profile
    assert hash(again) == hash(profile)
    assert again.to_dict() == profile.to_dict()
    assert again.to_dict()["principals"][0]["meta"] == {"owner": ["a", {"b": 1}]}
    assert (again.digest, again.profile_digest) == (profile.digest, profile.profile_digest)


def test_a_profile_parsed_from_read_only_mappings_keeps_none_of_them_and_pickles():
    doc = document()
    doc["principals"][0]["limits"] = MappingProxyType({"concurrency": 4})
    doc["principals"][0]["meta"] = MappingProxyType({"team": "core"})
    doc["providers"] = MappingProxyType(doc["providers"])
    profile = Profile.from_dict(MappingProxyType(doc), workspace_id="ws-1")
    again = pickle.loads(pickle.dumps(profile))
    assert again == profile
    assert again.to_dict() == profile.to_dict()
    assert again.to_dict()["principals"][0] == {
        "id": "alice",
        "limits": {"concurrency": 4},
        "meta": {"team": "core"},
    }


# The errors themselves


def test_invalid_profile_error_carries_field_and_problem():
    error = InvalidProfileError("workspace.concurrency", "must be at least 1, got 0")
    assert isinstance(error, ValueError)
    assert (error.field, error.problem) == ("workspace.concurrency", "must be at least 1, got 0")
    assert error.args == ("workspace.concurrency", "must be at least 1, got 0")
    assert str(error) == "workspace.concurrency: must be at least 1, got 0"
    assert repr(error) == (
        "InvalidProfileError('workspace.concurrency', 'must be at least 1, got 0')"
    )
    again = pickle.loads(pickle.dumps(error))
    assert (again.field, again.problem, again.args) == (error.field, error.problem, error.args)
    assert str(again) == str(error)


def test_profile_conflict_error_names_version_workspace_and_both_digests():
    error = ProfileConflictError("ws-1", "v3", "sha256:aaa", "sha256:bbb")
    assert (error.workspace_id, error.profile_version) == ("ws-1", "v3")
    assert (error.existing_digest, error.new_digest) == ("sha256:aaa", "sha256:bbb")
    assert error.args == ("ws-1", "v3", "sha256:aaa", "sha256:bbb")
    assert str(error) == (
        "profileVersion 'v3' of workspace 'ws-1' is already registered with sha256:aaa; "
        "refusing sha256:bbb"
    )
    rebuilt = ProfileConflictError(*error.args)
    assert str(rebuilt) == str(error)
    again = pickle.loads(pickle.dumps(error))
    assert again.args == error.args
    assert str(again) == str(error)
