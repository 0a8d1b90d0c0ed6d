"""The limits diff an approver reads: omitted limits mean something, zeros are flagged."""

from __future__ import annotations

from admission.rollout.profile_diff import limits_diff, zero_warning

CURRENT = {
    "profileVersion": "v1",
    "workspace": {"concurrency": 4, "requestsPerMinute": 600, "maxQueueLength": 64},
    "providers": {"jev": {"concurrency": 3, "circuitBreaker": {"failureThreshold": 5}}},
    "principals": [{"id": "ann", "class": "quiet", "limits": {"concurrency": 2}}],
}


def _rows(current, proposed, **kwargs):
    return {(row.scope, row.field): row for row in limits_diff(current, proposed, **kwargs)}


def test_an_unchanged_document_has_no_rows():
    assert limits_diff(CURRENT, {**CURRENT, "profileVersion": "v2"}) == []


def test_a_dropped_limit_reads_unlimited_and_an_added_one_reads_its_value():
    proposed = {
        **CURRENT,
        "workspace": {"concurrency": 4, "maxQueueLength": 64, "maxQueueWaitMs": 2000},
    }
    rows = _rows(CURRENT, proposed)
    assert set(rows) == {
        ("workspace", "requestsPerMinute"),
        ("workspace", "maxQueueWaitMs"),
    }
    dropped = rows[("workspace", "requestsPerMinute")]
    assert (dropped.current, dropped.proposed) == ("600", "unlimited")
    added = rows[("workspace", "maxQueueWaitMs")]
    assert (added.current, added.proposed) == ("unlimited", "2000")
    assert not dropped.warning and not added.warning


def test_breaker_defaults_and_new_scopes_say_what_they_mean():
    proposed = {
        **CURRENT,
        "providers": {"jev": {"concurrency": 3}, "openai": {"concurrency": 2}},
        "principals": {"ann": {"concurrency": 2}, "bob": {"concurrency": 1}},
    }
    rows = _rows(CURRENT, proposed)
    assert rows[("providers.jev", "circuitBreaker.failureThreshold")].current == "5"
    assert rows[("providers.jev", "circuitBreaker.failureThreshold")].proposed == "no breaker"
    new = rows[("principals.bob", "concurrency")]
    assert (new.current, new.proposed) == ("not configured", "1")
    assert rows[("principals.bob", "requestsPerMinute")].proposed == "unlimited"
    # The list form of principals and the mapping form compare by id.
    assert ("principals.ann", "concurrency") not in rows


def test_zero_limits_are_flagged_even_when_unchanged():
    zero = {
        **CURRENT,
        "workspace": {"concurrency": 4, "requestsPerMinute": 0, "maxQueueLength": 64},
        "principals": [{"id": "ann", "limits": {"concurrency": 2, "maxCostUsd": 0}}],
    }
    rows = _rows(zero, {**zero, "profileVersion": "v3"})
    assert set(rows) == {("workspace", "requestsPerMinute"), ("principals.ann", "maxCostUsd")}
    assert "admits nothing" in rows[("workspace", "requestsPerMinute")].warning
    assert "costs anything" in rows[("principals.ann", "maxCostUsd")].warning
    assert not any(row.changed for row in rows.values())


def test_zero_warning_covers_what_a_zero_shuts_out():
    assert "lets nothing wait" in zero_warning("maxQueueLength", 0)
    assert zero_warning("maxQueueLength", 1) is None
    assert zero_warning("reservedConcurrency", 0) is None
    assert zero_warning("allowUnknownCost", False) is None
    assert zero_warning("maxTokens", 0.0) is not None


def test_with_no_current_version_every_limit_is_new():
    rows = limits_diff(None, CURRENT)
    assert rows and all(row.current == "not configured" for row in rows)
    everything = limits_diff(CURRENT, CURRENT, everything=True)
    assert {row.scope for row in everything} == {"workspace", "providers.jev", "principals.ann"}
