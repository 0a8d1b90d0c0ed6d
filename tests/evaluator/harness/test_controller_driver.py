"""The admission-controller driver on small, hand-shaped timelines whose outcome is known."""

from __future__ import annotations

from evaluator.harness.arrivals import ArrivalModel, generate_arrivals
from evaluator.harness.controller_target import ControllerDriver

from .conftest import solo_manifest


def _run(manifest, end_ms=20_000):
    arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest), end_ms)
    driver = ControllerDriver(manifest, arrivals, end_ms)
    run = driver.run()
    return driver, run.observations


def _accounted(observations):
    return (
        observations["completed"]
        + observations["failed"]
        + observations["shed"]
        + observations["cancelled"]
    )


def test_every_first_attempt_failure_is_retried_once(manifest_v2):
    _, observed = _run(solo_manifest(manifest_v2, 4, retryableFailureRate=1))
    assert observed["arrivals"] > 50
    assert observed["attempts"] == 2 * observed["arrivals"]
    assert observed["retryAmplificationRatio"] == 2
    assert observed["completed"] == observed["arrivals"]
    assert _accounted(observed) == observed["arrivals"]


def test_without_retries_a_first_attempt_failure_fails_the_arrival(manifest_v2):
    _, observed = _run(solo_manifest(manifest_v2, 4, retryableFailureRate=1, maxRetries=0))
    assert observed["attempts"] == observed["arrivals"]
    assert observed["failed"] == observed["arrivals"]
    assert observed["completed"] == 0


def test_CNC_LOAD_002_cancellation_is_honoured_during_the_retry_backoff(manifest_v2):
    # Service 40 ms, failure, backoff 250 ms: a cancel at +200 ms lands inside the backoff.
    manifest = solo_manifest(
        manifest_v2, 4, retryableFailureRate=1, cancellationRate=1, cancelAfterMs=200
    )
    driver, observed = _run(manifest)
    assert observed["cancelled"] == observed["arrivals"] > 50
    # The backoff never ended in a second attempt.
    assert observed["attempts"] == observed["arrivals"]
    assert observed["maximumCancellationLatencyMs"] == 0
    assert driver.tally.active == driver.tally.queued == 0


def test_CNC_LOAD_002_cancellation_stops_queued_and_active_calls_at_once(manifest_v2):
    # 50 arrivals a second against one permit and 100 ms of service: most calls wait.
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
    snapshot = driver.controller.snapshot("solo")
    assert (snapshot.active, snapshot.queued) == (0, 0)


def test_high_water_marks_are_exact_at_the_ceiling(manifest_v2):
    manifest = solo_manifest(
        manifest_v2, 2, averageRequestsPerSecond=40, serviceTimeMs={"minimum": 100, "maximum": 160}
    )
    driver, observed = _run(manifest, end_ms=10_000)
    assert observed["maximumActiveCalls"] == 2
    assert observed["maximumQueuedCalls"] >= 1
    assert observed["maximumEligibleLaneWaitMs"] > 0
    assert _accounted(observed) == observed["arrivals"]
    assert driver.tally.active == driver.tally.queued == 0
    assert observed["quietPrincipalAdmissionRatio"] == 1
    assert observed["noisyPrincipalAdmissionRatio"] is None
