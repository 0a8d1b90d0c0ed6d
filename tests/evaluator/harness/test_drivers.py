"""Both load-harness drivers, the admission controller's and the evaluator path's, on small,
hand-shaped timelines whose outcome is known: retries, cancellation in a backoff and in the
queue, every arrival accounted for."""

from __future__ import annotations

import pytest

from evaluator.harness.arrivals import ArrivalModel, generate_arrivals
from evaluator.harness.controller_target import ControllerDriver
from evaluator.harness.evaluator_target import EvaluatorDriver

from .conftest import accounted, solo_manifest

# Each driver, and where its admission controller is.
DRIVERS = {
    "controller": (ControllerDriver, lambda driver: driver.controller),
    "evaluator": (EvaluatorDriver, lambda driver: driver.registry.controller("load-harness")),
}


@pytest.fixture(params=sorted(DRIVERS))
def run(request):
    """Runs a manifest through the driver under test: (driver, observations, its controller)."""
    driver_class, controller_of = DRIVERS[request.param]

    def run(manifest, end_ms=20_000):
        arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest), end_ms)
        driver = driver_class(manifest, arrivals, end_ms)
        return driver, driver.run().observations, controller_of(driver)

    return run


def test_every_first_attempt_failure_is_retried_once(run, manifest_v2):
    _, observed, _ = run(solo_manifest(manifest_v2, 4, retryableFailureRate=1))
    assert observed["arrivals"] > 50
    assert observed["attempts"] == 2 * observed["arrivals"]
    assert observed["retryAmplificationRatio"] == 2
    assert observed["completed"] == observed["arrivals"]
    assert accounted(observed) == observed["arrivals"]


def test_CNC_LOAD_002_cancellation_is_honoured_during_the_retry_backoff(run, manifest_v2):
    # Service 40 ms, failure, backoff 250 ms: a cancel at +200 ms lands inside the backoff.
    manifest = solo_manifest(
        manifest_v2, 4, retryableFailureRate=1, cancellationRate=1, cancelAfterMs=200
    )
    driver, observed, _ = run(manifest)
    assert observed["cancelled"] == observed["arrivals"] > 50
    # The backoff never ended in a second attempt.
    assert observed["attempts"] == observed["arrivals"]
    assert observed["maximumCancellationLatencyMs"] == 0
    assert driver.tally.active == driver.tally.queued == 0


def test_CNC_LOAD_002_cancellation_stops_queued_and_active_calls_at_once(run, manifest_v2):
    # 50 arrivals a second against one permit and 100 ms of service: most calls wait.
    manifest = solo_manifest(
        manifest_v2,
        1,
        averageRequestsPerSecond=50,
        serviceTimeMs={"minimum": 100, "maximum": 100},
        cancellationRate=1,
        cancelAfterMs=50,
    )
    _, observed, controller = run(manifest, end_ms=5_000)
    assert observed["maximumQueuedCalls"] > 1
    assert observed["maximumActiveCalls"] == 1
    assert observed["cancelled"] == observed["arrivals"]
    assert observed["maximumCancellationLatencyMs"] == 0
    snapshot = controller.snapshot("solo")
    assert (snapshot.active, snapshot.queued) == (0, 0)
