import contextlib
import copy
import json
import math
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import admission.core.limits as limits_module
from admission.core.canonical import sha256_digest
from admission.core.errors import InvalidProfileError
from admission.core.limits import BreakerConfig, Limits, Profile

from .conftest import examples

MANIFEST_V2 = json.loads(
    (Path(__file__).resolve().parents[3] / "manifests" / "load-manifest.v2.json").read_text()
)
V2_PROFILE_DIGEST = "sha256:e88407c56f96adc79c87a5ff7ae8d45d90291eeecb242db2a9417e121ad3464b"
SECTIONS = ("profileVersion", "workspace", "providers", "principals")


def v2_doc():
    return copy.deepcopy({key: MANIFEST_V2[key] for key in SECTIONS})


def mapping_form(doc):
    doc = copy.deepcopy(doc)
    doc["principals"] = {entry["id"]: entry["limits"] for entry in doc["principals"]}
    return doc


def parse(doc, workspace_id="ws-1"):
    return Profile.from_dict(doc, workspace_id=workspace_id)


def set_at(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def drop_at(doc, path):
    doc = copy.deepcopy(doc)
    node = doc
    for step in path[:-1]:
        node = node[step]
    del node[path[-1]]
    return doc


def assert_invalid(doc, field, workspace_id="ws-1"):
    with pytest.raises(InvalidProfileError) as caught:
        parse(doc, workspace_id)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    return caught.value


# Digests and round trip


def test_v2_manifest_profile_digest_matches_the_preregistered_value():
    profile = Profile.from_manifest(MANIFEST_V2, workspace_id="ws-1")
    assert profile.profile_digest == V2_PROFILE_DIGEST


def test_digest_covers_workspace_and_provider_limits_as_written():
    profile = Profile.from_manifest(MANIFEST_V2, workspace_id="ws-1")
    expected = sha256_digest(
        {"workspace": MANIFEST_V2["workspace"], "providers": MANIFEST_V2["providers"]}
    )
    assert profile.digest == expected
    assert profile.digest != profile.profile_digest


def test_profile_digest_ignores_version_workspace_id_and_extra_principal_keys():
    doc = v2_doc()
    doc["profileVersion"] = "another-label"
    doc["principals"][0]["weight"] = 0.9
    doc["principals"][0]["class"] = "quiet"
    profile = parse(doc, workspace_id="ws-2")
    assert profile.profile_digest == V2_PROFILE_DIGEST


def test_list_and_mapping_principals_give_the_same_profile_digest():
    listed = parse(v2_doc())
    mapped = parse(mapping_form(v2_doc()))
    assert listed.profile_digest == mapped.profile_digest == V2_PROFILE_DIGEST
    assert listed.digest == mapped.digest
    assert listed == mapped


def test_to_dict_writes_the_document_back_as_written():
    doc = v2_doc()
    assert parse(doc).to_dict() == doc
    mapped = mapping_form(doc)
    assert parse(mapped).to_dict() == mapped


def test_round_trip_is_equal_and_keeps_both_digests():
    for doc in (v2_doc(), mapping_form(v2_doc())):
        profile = parse(doc)
        again = parse(profile.to_dict())
        assert again == profile
        assert hash(again) == hash(profile)
        assert again.digest == profile.digest
        assert again.profile_digest == profile.profile_digest


def test_from_manifest_ignores_the_other_manifest_keys():
    from_manifest = Profile.from_manifest(MANIFEST_V2, workspace_id="ws-1")
    assert from_manifest == parse(v2_doc())
    assert set(from_manifest.to_dict()) == set(SECTIONS)


def test_omitted_optional_fields_stay_out_of_the_digest():
    base = {
        "profileVersion": "v1",
        "workspace": {"concurrency": 2},
        "providers": {},
        "principals": {},
    }
    explicit = set_at(base, ("workspace", "allowUnknownCost"), False)
    assert parse(base) == parse(explicit)
    assert parse(base).digest != parse(explicit).digest
    assert parse(explicit).workspace.to_dict() == {"concurrency": 2, "allowUnknownCost": False}


def test_breaker_defaults_are_not_written_into_the_digest():
    short = {"failureThreshold": 3}
    full = {"failureThreshold": 3, "openMs": 30000, "halfOpenMaxCalls": 1}
    base = {"profileVersion": "v1", "workspace": {"concurrency": 2}, "principals": {}}
    a = parse({**base, "providers": {"p": {"concurrency": 1, "circuitBreaker": short}}})
    b = parse({**base, "providers": {"p": {"concurrency": 1, "circuitBreaker": full}}})
    assert a.provider("p").circuit_breaker == b.provider("p").circuit_breaker
    assert a.provider("p").circuit_breaker.open_ms == 30000
    assert a.digest != b.digest
    assert a.to_dict()["providers"]["p"]["circuitBreaker"] == short


def test_limits_built_in_python_write_set_fields_and_true_flags_only():
    assert Limits(concurrency=2).to_dict() == {"concurrency": 2}
    limits = Limits(
        concurrency=2,
        max_tokens=10,
        allow_unknown_cost=True,
        circuit_breaker=BreakerConfig(failure_threshold=4),
    )
    assert limits.to_dict() == {
        "concurrency": 2,
        "allowUnknownCost": True,
        "maxTokens": 10,
        "circuitBreaker": {"failureThreshold": 4},
    }
    assert BreakerConfig(2, open_ms=5).to_dict() == {"failureThreshold": 2, "openMs": 5}


def test_profile_built_in_python_matches_the_parsed_document():
    doc = {
        "profileVersion": "v1",
        "workspace": {"concurrency": 4, "maxPrincipalShare": 0.5},
        "providers": {"p": {"concurrency": 3, "circuitBreaker": {"failureThreshold": 2}}},
        "principals": {"a": {"concurrency": 2, "reservedConcurrency": 1}},
    }
    built = Profile(
        workspace_id="ws-1",
        profile_version="v1",
        workspace=Limits(concurrency=4, max_principal_share=0.5),
        providers={"p": Limits(concurrency=3, circuit_breaker=BreakerConfig(2))},
        principals={"a": Limits(concurrency=2, reserved_concurrency=1)},
    )
    assert built == parse(doc)
    assert built.profile_digest == parse(doc).profile_digest
    assert built.to_dict() == doc


def test_digests_are_computed_once(monkeypatch):
    profile = parse(v2_doc())
    hashed: list[dict] = []

    def counting_digest(value):
        hashed.append(value)
        return sha256_digest(value)

    monkeypatch.setattr(limits_module, "sha256_digest", counting_digest)
    first = [profile.profile_digest, profile.digest]
    assert len(hashed) == 2
    # Read again: the same values, and nothing is hashed again.
    assert [profile.profile_digest, profile.digest] == first
    assert [profile.profile_digest, profile.digest] == first
    assert len(hashed) == 2
    assert first == [sha256_digest(hashed[0]), sha256_digest(hashed[1])]


def test_snake_case_attributes_are_read_from_camel_case_keys():
    profile = parse(v2_doc())
    jev = profile.provider("jev")
    assert jev.requests_per_minute == 1800
    assert jev.max_principal_share == 0.75
    assert jev.circuit_breaker == BreakerConfig(5, 1000, 1)
    assert profile.principal("quiet-reserved").reserved_concurrency == 1
    assert profile.workspace.max_queue_wait_ms == 2000
    assert profile.principal("nobody") is None
    assert profile.provider("nowhere") is None


def test_profile_is_immutable_and_detached_from_its_document():
    doc = v2_doc()
    profile = parse(doc)
    doc["principals"][0]["weight"] = 99
    doc["providers"]["jev"]["concurrency"] = 99
    assert profile.to_dict() == v2_doc()
    with pytest.raises(TypeError):
        profile.providers["new"] = Limits(concurrency=1)
    with pytest.raises(AttributeError):
        profile.workspace.concurrency = 9
    emitted = profile.to_dict()
    emitted["principals"][0]["class"] = "changed"
    assert profile.to_dict() == v2_doc()


def test_profile_survives_pickling():
    profile = parse(v2_doc())
    again = pickle.loads(pickle.dumps(profile))
    assert again == profile
    assert again.to_dict() == profile.to_dict()
    assert again.profile_digest == V2_PROFILE_DIGEST


def test_integral_float_counts_as_an_integer_and_is_stored_as_int():
    doc = set_at(v2_doc(), ("providers", "jev", "concurrency"), 2.0)
    doc = set_at(doc, ("providers", "jev", "circuitBreaker", "failureThreshold"), 5.0)
    profile = parse(doc)
    assert profile.provider("jev").concurrency == 2
    assert type(profile.provider("jev").concurrency) is int
    assert type(profile.provider("jev").circuit_breaker.failure_threshold) is int


def test_fractional_rates_and_money_are_accepted():
    doc = set_at(v2_doc(), ("workspace", "maxCostUsd"), 0.25)
    doc = set_at(doc, ("workspace", "tokensPerSecond"), 12.5)
    profile = parse(doc)
    assert profile.workspace.max_cost_usd == 0.25
    assert profile.workspace.tokens_per_second == 12.5


# Validation: one rule per test, each naming its field


def test_rejects_unknown_limits_key():
    assert_invalid(set_at(v2_doc(), ("workspace", "maxWidgets"), 1), "workspace.maxWidgets")


def test_rejects_unknown_top_level_key():
    assert_invalid({**v2_doc(), "schema": "x"}, "schema")


def test_rejects_unknown_breaker_key():
    doc = set_at(v2_doc(), ("providers", "jev", "circuitBreaker", "resetMs"), 1)
    assert_invalid(doc, "providers.jev.circuitBreaker.resetMs")


def test_rejects_non_string_limits_key():
    error = assert_invalid(set_at(v2_doc(), ("workspace", 7), 1), "workspace.7")
    assert "unknown key" in str(error)


@pytest.mark.parametrize("missing", SECTIONS)
def test_rejects_a_missing_top_level_section(missing):
    assert_invalid(drop_at(v2_doc(), (missing,)), missing)


def test_rejects_missing_concurrency():
    assert_invalid(
        drop_at(v2_doc(), ("providers", "jev", "concurrency")), "providers.jev.concurrency"
    )


def test_rejects_wrong_type():
    doc = set_at(v2_doc(), ("principals", 1, "limits", "maxQueueLength"), "32")
    error = assert_invalid(doc, "principals[1].limits.maxQueueLength")
    assert "a string" in str(error)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("workspace", "concurrency"), "workspace.concurrency"),
        (("workspace", "maxCostUsd"), "workspace.maxCostUsd"),
        (("workspace", "maxPrincipalShare"), "workspace.maxPrincipalShare"),
        (("providers", "jev", "circuitBreaker", "openMs"), "providers.jev.circuitBreaker.openMs"),
    ],
)
def test_rejects_booleans_where_numbers_are_due(path, field):
    error = assert_invalid(set_at(v2_doc(), path, True), field)
    assert "boolean" in str(error)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rejects_non_finite_numbers(bad):
    assert_invalid(
        set_at(v2_doc(), ("workspace", "maxQueueWaitMs"), bad), "workspace.maxQueueWaitMs"
    )


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("workspace", "requestsPerMinute"), "workspace.requestsPerMinute"),
        (("providers", "jev", "maxRetainedWork"), "providers.jev.maxRetainedWork"),
        (("principals", 2, "limits", "maxCostUsd"), "principals[2].limits.maxCostUsd"),
    ],
)
def test_rejects_negative_numbers(path, field):
    error = assert_invalid(set_at(v2_doc(), path, -1), field)
    assert "negative" in str(error) or "at least" in str(error)


def test_rejects_non_integer_where_integer_is_due():
    doc = set_at(v2_doc(), ("principals", 2, "limits", "concurrency"), 1.5)
    error = assert_invalid(doc, "principals[2].limits.concurrency")
    assert "integer" in str(error)


def test_rejects_concurrency_below_one():
    assert_invalid(set_at(v2_doc(), ("workspace", "concurrency"), 0), "workspace.concurrency")


def test_rejects_integers_beyond_the_exact_javascript_range():
    doc = set_at(v2_doc(), ("workspace", "maxTokens"), 2**53)
    assert_invalid(doc, "workspace.maxTokens")
    assert parse(set_at(v2_doc(), ("workspace", "maxTokens"), 2**53 - 1))


def test_rejects_a_huge_integer_where_a_finite_number_is_due():
    assert_invalid(set_at(v2_doc(), ("workspace", "maxCostUsd"), 10**400), "workspace.maxCostUsd")


@pytest.mark.parametrize("share", [0, 1.0000001, 2, -0.5])
def test_rejects_share_outside_zero_to_one(share):
    doc = set_at(v2_doc(), ("providers", "llm-subagent", "maxPrincipalShare"), share)
    assert_invalid(doc, "providers.llm-subagent.maxPrincipalShare")


def test_accepts_a_share_of_exactly_one():
    assert parse(set_at(v2_doc(), ("workspace", "maxPrincipalShare"), 1))


def test_rejects_share_on_principal_limits():
    doc = set_at(v2_doc(), ("principals", 0, "limits", "maxPrincipalShare"), 0.5)
    error = assert_invalid(doc, "principals[0].limits.maxPrincipalShare")
    assert "workspace and provider" in str(error)


def test_rejects_reservation_on_workspace_limits():
    doc = set_at(v2_doc(), ("workspace", "reservedConcurrency"), 1)
    assert_invalid(doc, "workspace.reservedConcurrency")


def test_rejects_reservation_on_provider_limits():
    doc = set_at(v2_doc(), ("providers", "jev", "reservedConcurrency"), 1)
    assert_invalid(doc, "providers.jev.reservedConcurrency")


def test_rejects_reservation_above_the_principals_own_concurrency():
    doc = set_at(v2_doc(), ("principals", 1, "limits", "reservedConcurrency"), 3)
    error = assert_invalid(doc, "principals[1].limits.reservedConcurrency")
    assert "concurrency 2" in str(error)


def test_rejects_reservations_summing_above_workspace_concurrency():
    doc = set_at(v2_doc(), ("workspace", "concurrency"), 3)
    for index in (1, 2, 3):
        doc = set_at(doc, ("principals", index, "limits", "reservedConcurrency"), 1)
    doc = set_at(doc, ("principals", 4, "limits", "reservedConcurrency"), 1)
    error = assert_invalid(doc, "principals")
    assert "reservedConcurrency sums to 4" in str(error)
    assert "workspace.concurrency" in str(error)


def test_rejects_reservations_summing_above_a_provider_concurrency():
    doc = v2_doc()
    for index in (2, 3):
        doc = set_at(doc, ("principals", index, "limits", "reservedConcurrency"), 1)
    # 3 reserved: fits jev (3) and the workspace (4), not a provider of concurrency 2.
    assert parse(doc)
    doc = set_at(doc, ("providers", "llm-subagent", "concurrency"), 2)
    error = assert_invalid(doc, "principals")
    assert "providers.llm-subagent.concurrency" in str(error)


def test_rejects_breaker_on_workspace_limits():
    doc = set_at(v2_doc(), ("workspace", "circuitBreaker"), {"failureThreshold": 1})
    assert_invalid(doc, "workspace.circuitBreaker")


def test_rejects_breaker_on_principal_limits():
    doc = set_at(v2_doc(), ("principals", 0, "limits", "circuitBreaker"), {"failureThreshold": 1})
    assert_invalid(doc, "principals[0].limits.circuitBreaker")


@pytest.mark.parametrize("threshold", [0, -1, 1.5, "5", None])
def test_rejects_breaker_threshold_below_one_or_not_an_integer(threshold):
    path = ("providers", "jev", "circuitBreaker", "failureThreshold")
    assert_invalid(
        set_at(v2_doc(), path, threshold), "providers.jev.circuitBreaker.failureThreshold"
    )


def test_rejects_breaker_without_threshold():
    doc = drop_at(v2_doc(), ("providers", "jev", "circuitBreaker", "failureThreshold"))
    assert_invalid(doc, "providers.jev.circuitBreaker.failureThreshold")


@pytest.mark.parametrize("calls", [0, 0.5])
def test_rejects_half_open_calls_below_one_or_fractional(calls):
    path = ("providers", "jev", "circuitBreaker", "halfOpenMaxCalls")
    assert_invalid(set_at(v2_doc(), path, calls), "providers.jev.circuitBreaker.halfOpenMaxCalls")


@pytest.mark.parametrize("open_ms", [-1, math.inf, math.nan])
def test_rejects_open_ms_negative_or_not_finite(open_ms):
    path = ("providers", "jev", "circuitBreaker", "openMs")
    assert_invalid(set_at(v2_doc(), path, open_ms), "providers.jev.circuitBreaker.openMs")


def test_rejects_breaker_that_is_not_an_object():
    doc = set_at(v2_doc(), ("providers", "jev", "circuitBreaker"), [5])
    assert_invalid(doc, "providers.jev.circuitBreaker")


@pytest.mark.parametrize("flag", [1, 0, "true", None])
def test_rejects_allow_unknown_cost_that_is_not_a_real_bool(flag):
    doc = set_at(v2_doc(), ("workspace", "allowUnknownCost"), flag)
    assert_invalid(doc, "workspace.allowUnknownCost")


def test_rejects_duplicate_principal_ids():
    doc = set_at(v2_doc(), ("principals", 3, "id"), "quiet-a")
    error = assert_invalid(doc, "principals[3].id")
    assert "duplicate" in str(error)


@pytest.mark.parametrize("principal_id", ["", 5, None])
def test_rejects_empty_or_non_string_principal_id(principal_id):
    assert_invalid(set_at(v2_doc(), ("principals", 0, "id"), principal_id), "principals[0].id")


def test_rejects_empty_principal_id_in_mapping_form():
    doc = mapping_form(v2_doc())
    doc["principals"][""] = {"concurrency": 1}
    assert_invalid(doc, "principals.''")


def test_rejects_empty_provider_id():
    doc = set_at(v2_doc(), ("providers", ""), {"concurrency": 1})
    assert_invalid(doc, "providers.''")


@pytest.mark.parametrize("key", ["id", "limits"])
def test_rejects_principal_entry_without_id_or_limits(key):
    assert_invalid(drop_at(v2_doc(), ("principals", 2, key)), f"principals[2].{key}")


def test_rejects_principal_entry_that_is_not_an_object():
    assert_invalid(set_at(v2_doc(), ("principals", 4), "quiet-c"), "principals[4]")


def test_rejects_principal_entry_extra_that_is_not_json():
    doc = set_at(v2_doc(), ("principals", 0, "weight"), {1, 2})
    assert_invalid(doc, "principals[0].weight")


@pytest.mark.parametrize("principals", ["noisy", 3, None])
def test_rejects_principals_that_are_neither_list_nor_mapping(principals):
    assert_invalid(set_at(v2_doc(), ("principals",), principals), "principals")


def test_rejects_providers_that_are_not_a_mapping():
    assert_invalid(set_at(v2_doc(), ("providers",), [{"concurrency": 1}]), "providers")


def test_rejects_limits_that_are_not_an_object():
    assert_invalid(set_at(v2_doc(), ("workspace",), 4), "workspace")


@pytest.mark.parametrize("doc", [None, [], "profile", 3, True])
def test_rejects_a_document_that_is_not_an_object(doc):
    assert_invalid(doc, "profile")


@pytest.mark.parametrize("version", ["", 2, None])
def test_rejects_empty_or_non_string_profile_version(version):
    assert_invalid(set_at(v2_doc(), ("profileVersion",), version), "profileVersion")


@pytest.mark.parametrize("workspace_id", ["", None, 12])
def test_rejects_empty_or_non_string_workspace_id(workspace_id):
    assert_invalid(v2_doc(), "workspaceId", workspace_id=workspace_id)


def test_rejects_a_manifest_that_is_not_an_object():
    with pytest.raises(InvalidProfileError) as caught:
        Profile.from_manifest([], workspace_id="ws-1")
    assert caught.value.field == "manifest"


def test_limits_from_dict_names_the_given_path():
    with pytest.raises(InvalidProfileError) as caught:
        Limits.from_dict({"concurrency": -2}, scope="principal", path="principals.a")
    assert caught.value.field == "principals.a.concurrency"


def test_limits_built_in_python_are_validated_too():
    with pytest.raises(InvalidProfileError) as caught:
        Limits(concurrency=0)
    assert caught.value.field == "concurrency"
    with pytest.raises(InvalidProfileError) as caught:
        Limits(concurrency=1, reserved_concurrency=2)
    assert caught.value.field == "reservedConcurrency"
    with pytest.raises(InvalidProfileError) as caught:
        BreakerConfig(failure_threshold=0)
    assert caught.value.field == "failureThreshold"


def test_profile_built_in_python_checks_scopes():
    with pytest.raises(InvalidProfileError) as caught:
        Profile(
            workspace_id="ws-1",
            profile_version="v1",
            workspace=Limits(concurrency=2),
            providers={},
            principals={"a": Limits(concurrency=1, max_principal_share=0.5)},
        )
    assert caught.value.field == "principals.a.maxPrincipalShare"


def test_invalid_profile_error_pickles_with_its_field():
    error = pickle.loads(pickle.dumps(InvalidProfileError("workspace.concurrency", "bad")))
    assert error.field == "workspace.concurrency"
    assert str(error) == "workspace.concurrency: bad"
    assert isinstance(error, ValueError)


# Property: nothing but InvalidProfileError escapes the parser


def _json_like(keys):
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=8)
        | st.sampled_from(["concurrency", "maxTokens", "circuitBreaker", "id", "limits"])
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=24,
    )


KEYS = (
    st.sampled_from([*SECTIONS, "concurrency", "maxPrincipalShare", "reservedConcurrency"])
    | st.text(max_size=6)
    | st.integers(min_value=-3, max_value=3)
    | st.none()
)
ODD_VALUES = st.sampled_from(
    [
        None,
        True,
        False,
        -1,
        -0.5,
        0,
        0.5,
        1.5,
        2.0,
        math.nan,
        math.inf,
        -math.inf,
        10**30,
        2**53,
        10**400,
        "1",
        "",
        [],
        {},
        [1],
        {"x": 1},
    ]
) | _json_like(KEYS)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from _paths(child, (*prefix, index))


@st.composite
def mutated_documents(draw):
    doc = v2_doc() if draw(st.booleans()) else mapping_form(v2_doc())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = [path for path in _paths(doc) if path]
        path = draw(st.sampled_from(paths))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        operation = draw(st.sampled_from(["drop", "insert", "replace"]))
        if operation == "drop":
            del parent[path[-1]]
        elif operation == "insert" and isinstance(parent, dict):
            # Copies: sampled lists and dicts are shared objects that later steps may mutate.
            parent[draw(KEYS)] = copy.deepcopy(draw(ODD_VALUES))
        else:
            parent[path[-1]] = copy.deepcopy(draw(ODD_VALUES))
    return doc


def _assert_parses_or_raises_invalid(doc):
    try:
        profile = parse(doc)
    except InvalidProfileError as error:
        assert isinstance(error.field, str)
        assert str(error).startswith(error.field)
        return
    again = parse(profile.to_dict())
    assert again == profile
    assert again.profile_digest == profile.profile_digest
    assert again.digest == profile.digest


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(mutated_documents())
def test_malformed_profile_mutations_raise_only_invalid_profile_error(doc):
    """A malformed profile (mutated v2 document) parses or raises InvalidProfileError only."""
    _assert_parses_or_raises_invalid(doc)


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(
    _json_like(KEYS)
    | st.fixed_dictionaries({key: _json_like(KEYS) for key in SECTIONS})
    | st.fixed_dictionaries(
        {
            "profileVersion": st.text(max_size=4),
            "workspace": st.dictionaries(KEYS, ODD_VALUES, max_size=4),
            "providers": st.dictionaries(KEYS, st.dictionaries(KEYS, ODD_VALUES, max_size=4)),
            "principals": st.lists(st.dictionaries(KEYS, ODD_VALUES, max_size=4), max_size=3),
        }
    )
)
def test_malformed_profile_random_values_raise_only_invalid_profile_error(doc):
    """A malformed profile (random JSON-like value) parses or raises InvalidProfileError only."""
    _assert_parses_or_raises_invalid(doc)
    with contextlib.suppress(InvalidProfileError):
        Profile.from_manifest(doc, workspace_id="ws-1")


@given(_json_like(KEYS), st.sampled_from(["workspace", "provider", "principal"]))
def test_malformed_profile_limits_raise_only_invalid_profile_error(doc, scope):
    """Malformed profile limits parse or raise InvalidProfileError only."""
    try:
        limits = Limits.from_dict(doc, scope=scope, path="x")
    except InvalidProfileError as error:
        assert error.field == "x" or error.field.startswith("x.")
        return
    assert Limits.from_dict(limits.to_dict(), scope=scope, path="x") == limits
