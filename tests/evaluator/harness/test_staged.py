"""CNC-LOAD-STAGED (gate G5): the manifest's arrivals at real time against a real loopback
OpenAI-compatible server, through the real evaluator, adapter and admission controller.

Each run releases only the first seconds of the timeline (the documented window cap), so the
whole module takes a few seconds.
"""

from __future__ import annotations

import pytest

from evaluator.engine.adapters import OpenAIChatAdapter
from evaluator.harness.errors import RecordFormatError
from evaluator.harness.records import (
    FLAG_OFFLINE_PASSED,
    FLAG_QUALIFIED,
    MODE_STAGED,
    TARGET_STAGED,
    evidence_flags,
    verify_record,
)
from evaluator.harness.service import run_manifest
from evaluator.harness.staged_target import (
    STAGED_MAX_WINDOW_SECONDS,
    Capacity,
    StagedConfigError,
    StagedEndpoint,
    run_staged,
)
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import MANIFESTS

WINDOW_SECONDS = 1.5
ROOMY = Capacity(concurrency=8, requests_per_minute=6000)


def _endpoints(server, capacity=ROOMY):
    endpoint = StagedEndpoint(
        adapter_id="staged",
        adapter=OpenAIChatAdapter(base_url=server.base_url),
        model="staged-model",
        capacity=capacity,
    )
    return {"jev": endpoint, "llm-subagent": endpoint}


def test_CNC_LOAD_STAGED_a_passing_record_sets_the_qualified_flag(manifest_v2):
    with LoopbackServer() as server:
        server.default = Reply(content="answered")
        record = run_staged(manifest_v2, _endpoints(server), WINDOW_SECONDS)

    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    assert record["mode"] == MODE_STAGED
    assert record["target"] == TARGET_STAGED
    assert record["manifest"] == manifest_v2.identity()
    assert record["window"] == {"startMs": 0, "endMs": 1500, "seconds": 1.5}
    observed = record["observations"]
    # Every arrival of the window reached the real endpoint once and was answered.
    assert observed["arrivals"] > 10
    assert observed["completed"] == observed["arrivals"] == len(server.requests)
    assert observed["retryAmplificationRatio"] == 1.0
    assert {request["body"]["model"] for request in server.requests} == {"staged-model"}
    assert server.max_in_flight <= 4  # the manifest's workspace concurrency
    assert record["passed"] is True
    assert evidence_flags([record]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: True}


def test_CNC_LOAD_STAGED_a_failing_provider_gives_a_failing_record_that_qualifies_nothing(
    manifest_v2,
):
    with LoopbackServer() as server:
        server.default = Reply(status=500)
        failing = run_staged(manifest_v2, _endpoints(server), 1.0)
        server.default = Reply(content="answered")
        passing = run_staged(manifest_v2, _endpoints(server), 1.0)

    verify_record(failing, manifest_v2)
    assert failing["passed"] is False
    observed = failing["observations"]
    assert observed["completed"] == 0
    # Every 500 is retried once, so retries amplify the load beyond the manifest's bound.
    assert observed["retryAmplificationRatio"] > 1.25
    failed = {c["bound"] for c in failing["comparisons"] if not c["pass"]}
    assert "maximumRetryAmplificationRatio" in failed
    assert evidence_flags([failing]) == {FLAG_OFFLINE_PASSED: False, FLAG_QUALIFIED: False}
    # One failing staged record disqualifies the set, whatever passes beside it.
    assert passing["passed"] is True
    assert evidence_flags([passing, failing])[FLAG_QUALIFIED] is False


def test_CNC_LOAD_STAGED_offline_records_cannot_pose_as_staged(manifest_v2):
    offline = run_manifest(manifest_v2, "evaluator")
    posing = {**offline, "mode": MODE_STAGED}
    posing.pop("digest")
    from admission.core.canonical import sha256_digest

    posing["digest"] = sha256_digest(posing)
    with pytest.raises(RecordFormatError, match="does not match its target"):
        verify_record(posing)
    assert evidence_flags([posing])[FLAG_QUALIFIED] is False


@pytest.mark.parametrize(
    ("capacity", "field"),
    [
        (None, "staged.capacity"),
        (Capacity(concurrency=3), "staged.capacity.concurrency"),
        (Capacity(concurrency=8, requests_per_minute=600), "staged.capacity.requestsPerMinute"),
    ],
)
def test_a_run_above_the_documented_capacity_is_refused_before_any_call(
    manifest_v2, capacity, field
):
    with LoopbackServer() as server:
        with pytest.raises(StagedConfigError) as refused:
            run_staged(manifest_v2, _endpoints(server, capacity), WINDOW_SECONDS)
        assert server.requests == []
    assert refused.value.field == field


@pytest.mark.parametrize("window", [0, -1, STAGED_MAX_WINDOW_SECONDS + 1, True, "10"])
def test_the_window_is_capped(manifest_v2, window):
    with LoopbackServer() as server:
        with pytest.raises(StagedConfigError) as refused:
            run_staged(manifest_v2, _endpoints(server), window)
        assert server.requests == []
    assert refused.value.field == "windowSeconds"


def test_every_manifest_provider_needs_an_endpoint(manifest_v2):
    with LoopbackServer() as server:
        endpoints = _endpoints(server)
        del endpoints["llm-subagent"]
        with pytest.raises(StagedConfigError, match="llm-subagent"):
            run_staged(manifest_v2, endpoints, WINDOW_SECONDS)
