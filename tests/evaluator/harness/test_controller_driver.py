"""The admission-controller driver on small, hand-shaped timelines whose outcome is known (what
both drivers share: tests/evaluator/harness/test_drivers.py)."""

from __future__ import annotations

from evaluator.harness.arrivals import ArrivalModel, generate_arrivals
from evaluator.harness.controller_target import ControllerDriver

from .conftest import accounted, solo_manifest


def _run(manifest, end_ms=20_000):
    arrivals = generate_arrivals(ArrivalModel.from_manifest(manifest), end_ms)
    driver = ControllerDriver(manifest, arrivals, end_ms)
    run = driver.run()
    return driver, run.observations


def test_without_retries_a_first_attempt_failure_fails_the_arrival(manifest_v2):
    _, observed = _run(solo_manifest(manifest_v2, 4, retryableFailureRate=1, maxRetries=0))
    assert observed["attempts"] == observed["arrivals"]
    assert observed["failed"] == observed["arrivals"]
    assert observed["completed"] == 0


def test_high_water_marks_are_exact_at_the_ceiling(manifest_v2):
    manifest = solo_manifest(
        manifest_v2, 2, averageRequestsPerSecond=40, serviceTimeMs={"minimum": 100, "maximum": 160}
    )
    driver, observed = _run(manifest, end_ms=10_000)
    assert observed["maximumActiveCalls"] == 2
    assert observed["maximumQueuedCalls"] >= 1
    assert observed["maximumEligibleLaneWaitMs"] > 0
    assert accounted(observed) == observed["arrivals"]
    assert driver.tally.active == driver.tally.queued == 0
    assert observed["quietPrincipalAdmissionRatio"] == 1
    assert observed["noisyPrincipalAdmissionRatio"] is None
