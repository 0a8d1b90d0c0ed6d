"""CNC-SCHED-005: the v1 manifest's gate through the bounded scheduler."""

from __future__ import annotations

from evaluator.harness.scheduler_gate import gate_arrivals, run_scheduler_gate


def test_CNC_SCHED_005_v1_manifest_gate_through_the_bounded_scheduler(manifest_v1):
    report = run_scheduler_gate(manifest_v1)
    # min(binding 8, caller 4, graph 6, principal 3, workspace 4, provider 4) = 3 = the bound.
    assert report.ceiling == 3 == manifest_v1.bounds["maximumActiveCalls"]
    assert report.maximum_scheduler_active == 3
    assert report.maximum_active_calls == 3
    # The declared 60 + 30 + 900 s, expanded at 20/s with the spike: one evaluation per second.
    assert report.arrivals == len(gate_arrivals(manifest_v1)) > 19_000
    assert report.evaluations == 990
    assert report.succeeded == report.arrivals
    assert report.canonical_order_kept
    # Completions came back out of order, so keeping the canonical order was a real test.
    assert report.reordered_evaluations > 0
    assert (
        0 < report.maximum_eligible_lane_wait_ms <= manifest_v1.bounds["maximumEligibleLaneWaitMs"]
    )
    assert report.passed
