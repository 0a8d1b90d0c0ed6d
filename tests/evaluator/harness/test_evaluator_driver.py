"""The evaluator-path driver on small, hand-shaped timelines whose outcome is known."""

from __future__ import annotations

from evaluator.harness.arrivals import ArrivalModel, generate_arrivals
from evaluator.harness.evaluator_target import EvaluatorDriver

from .conftest import accounted, solo_manifest


def _run(manifest, end_ms=20_000):
    arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest), end_ms)
    driver = EvaluatorDriver(manifest, arrivals, end_ms)
    run = driver.run()
    return driver, run.observations


def test_a_first_dispatch_failure_is_retried_once_by_the_evaluator(manifest_v2):
    _, observed = _run(solo_manifest(manifest_v2, 4, retryableFailureRate=1))
    assert observed["arrivals"] > 50
    assert observed["attempts"] == 2 * observed["arrivals"]
    assert observed["completed"] == observed["arrivals"]
    assert accounted(observed) == observed["arrivals"]


def test_CNC_LOAD_002_evaluator_cancellation_during_the_backoff_is_prompt(manifest_v2):
    manifest = solo_manifest(
        manifest_v2, 4, retryableFailureRate=1, cancellationRate=1, cancelAfterMs=200
    )
    driver, observed = _run(manifest)
    assert observed["cancelled"] == observed["arrivals"] > 50
    assert observed["attempts"] == observed["arrivals"]
    assert observed["maximumCancellationLatencyMs"] == 0
    assert driver.tally.active == driver.tally.queued == 0


def test_CNC_LOAD_002_evaluator_cancellation_stops_queued_and_active_calls(manifest_v2):
    manifest = solo_manifest(
        manifest_v2,
        1,
        averageRequestsPerSecond=50,
        serviceTimeMs={"minimum": 100, "maximum": 100},
        cancellationRate=1,
        cancelAfterMs=50,
    )
    driver, observed = _run(manifest, end_ms=5_000)
    assert observed["maximumQueuedCalls"] > 1
    assert observed["maximumActiveCalls"] == 1
    assert observed["cancelled"] == observed["arrivals"]
    assert observed["maximumCancellationLatencyMs"] == 0
    snapshot = driver.registry.controller("load-harness").snapshot("solo")
    assert (snapshot.active, snapshot.queued) == (0, 0)
