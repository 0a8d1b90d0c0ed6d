"""The load run timeline: bounded, true to the tally's peaks and totals, outside the record."""

from __future__ import annotations

import json

from evaluator.harness.manifests import load_manifest
from evaluator.harness.records import verify_record
from evaluator.harness.service import run_manifest
from evaluator.harness.tally import LoadTally
from evaluator.harness.timeline import TIMELINE_SCHEMA, TimelineSampler

from .conftest import MANIFESTS


def test_a_spike_between_samples_is_kept_as_that_steps_peak():
    tally = LoadTally()
    sampler = TimelineSampler(tally, 1000.0, steps=10)
    for _ in range(3):
        tally.activate()
    for _ in range(3):
        tally.deactivate()
    tally.enqueue()
    sampler.sample(100.0)
    tally.dequeue()
    sampler.sample(200.0)
    sampler.sample(300.0)
    series = sampler.to_dict()
    assert series["schema"] == TIMELINE_SCHEMA
    assert series["atMs"] == [0, 100, 200, 300]
    assert series["activePeak"] == [0, 3, 0, 0]
    # A step's peak includes the level it started at: the call queued until during step two.
    assert series["queuedPeak"] == [0, 1, 1, 0]
    assert tally.max_active == 3 and tally.max_queued == 1


def test_ratios_and_sheds_are_running_totals_per_class_and_reason():
    tally = LoadTally()
    sampler = TimelineSampler(tally, 1000.0, steps=10)
    tally.arrive("quiet")
    tally.admitted_once("quiet")
    tally.arrive("noisy")
    sampler.sample(100.0)
    tally.arrive("noisy")
    tally.admitted_once("noisy")
    tally.shed_for("queue-full")
    sampler.sample(200.0)
    series = sampler.to_dict()
    assert series["admissionRatio"] == {"noisy": [None, 0.0, 0.5], "quiet": [None, 1.0, 1.0]}
    assert series["shed"] == [0, 0, 1]
    assert series["shedByReason"] == {"queue-full": [0, 0, 1]}


def test_a_long_run_merges_samples_instead_of_growing():
    tally = LoadTally()
    sampler = TimelineSampler(tally, 100.0, steps=10, max_samples=20)
    for step in range(1, 200):
        if step == 77:
            tally.activate()
            tally.deactivate()
        sampler.sample(step * 10.0)
    series = sampler.to_dict()
    assert len(series["atMs"]) <= 20
    assert series["atMs"][0] == 0 and series["atMs"][-1] == 1990
    assert series["atMs"] == sorted(series["atMs"])
    assert max(series["activePeak"]) == 1
    assert series["stepMs"] > 10


def test_a_run_keeps_its_timeline_beside_an_unchanged_record():
    kept: list = []
    manifest = load_manifest(MANIFESTS / "load-manifest.v2.json")
    record = run_manifest(manifest, "evaluator", keep_timeline=kept.append)
    (series,) = kept
    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    assert "timeline" not in json.dumps(sorted(record))
    observations = record["observations"]
    assert series is not None and series["windowEndMs"] == 90_000
    assert max(series["activePeak"]) == observations["maximumActiveCalls"]
    assert max(series["queuedPeak"]) == observations["maximumQueuedCalls"]
    assert series["shed"][-1] == observations["shed"]
    assert {k: v[-1] for k, v in series["shedByReason"].items()} == observations["shedReasons"]
    assert series["admissionRatio"]["quiet"][-1] == round(
        observations["quietPrincipalAdmissionRatio"], 6
    )
    assert series["atMs"][-1] == observations["virtualDurationMs"]
    columns = [series["atMs"], series["activePeak"], series["queuedPeak"], series["shed"]]
    assert len({len(column) for column in columns}) == 1
    assert 100 <= len(series["atMs"]) <= 400
    assert len(json.dumps(series)) < 40_000
