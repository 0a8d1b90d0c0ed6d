"""An outage of the admission Redis waits; it does not fail decisions (real processes).

The deployment's admission state lives in a private Redis that the test stops for 10 s and
starts again empty, while a worker runs two evaluations. Refusals caused by the outage
(`coordination-unavailable`) cost no attempt: each attempt asks again with a growing pause until
Redis answers, or until its deadline passes, and then the decision is `timeout`. The run's
progress counts the refusals by reason and says what the outage did, so a client that reads only
a run's status learns of it.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from console.forms.runs import example_request
from tests.private_services import PrivateRedis
from tests.service.conftest import wait_for

pytestmark = pytest.mark.celery

OUTAGE_SECONDS = 10.0


def _document(decisions: int, timeout_ms: int, text: str) -> dict:
    document = example_request(decisions)
    document["input"]["text"] = text
    for decision in document["ruleset"]["decisions"]:
        decision["binding"]["primary"]["timeoutMs"] = timeout_ms
    return document


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_a_redis_outage_delays_decisions_and_only_a_short_deadline_ends_one(deployment):
    redis = PrivateRedis()
    try:
        env = {
            "SLUICE_ADMISSION_REDIS_URL": redis.url,
            "SLUICE_ADAPTERS": json.dumps(
                {"fake": {"kind": "fake", "latencyMs": 300, "callLog": str(deployment.calls)}}
            ),
        }
        deployment.start_web(env)
        worker = deployment.start_worker({**env, "SLUICE_WORKER_SLOTS": "2"})
        # Patient: every decision may wait 30 s, longer than the outage.
        patient = deployment.submit(_document(12, 30_000, "patient"))["id"]
        # Hasty: a decision's own deadline (3 s) is shorter than the outage.
        hasty = deployment.submit(_document(6, 3_000, "hasty"))["id"]
        wait_for(lambda: len(deployment.adapter_calls()) >= 3, 60, "the first calls")

        redis.stop()
        calls_before = len(deployment.adapter_calls())
        time.sleep(OUTAGE_SECONDS)
        # Nothing was admitted while the shared state was unreachable (a call admitted just
        # before the stop may still have been on its way to the adapter).
        assert len(deployment.adapter_calls()) <= calls_before + 2
        redis.start()
        restarted_ms = time.time() * 1000.0

        runs = {
            name: deployment.wait_run(run_id, timeout=90)
            for name, run_id in (("patient", patient), ("hasty", hasty))
        }
    finally:
        redis.destroy()

    calls = deployment.adapter_calls()
    resumed_after_ms = min(c["atEpochMs"] for c in calls if c["atEpochMs"] > restarted_ms)
    resumed_after_ms -= restarted_ms
    # Waiting attempts ask again at most a second apart (plus the restart's recovery grace).
    assert resumed_after_ms < 3000, resumed_after_ms
    print(
        "figures:",
        json.dumps(
            {
                name: {
                    "decisions": dict(Counter(d["status"] for d in run["result"]["decisions"])),
                    "refusals": run["progress"]["refusals"],
                    "outage": run["progress"]["outage"],
                }
                for name, run in runs.items()
            }
        ),
        f"first call {resumed_after_ms:.0f} ms after the restart",
    )

    for run in runs.values():
        outcomes = Counter(a["outcome"] for a in run["attempts"])
        # No decision was refused because of the outage: nothing ended overloaded.
        assert "overloaded" not in outcomes, run["attempts"]
        assert run["progress"]["refusals"].get("coordination-unavailable", 0) >= 1, run

    patient_run = runs["patient"]
    assert patient_run["status"] == "completed", patient_run
    statuses = Counter(d["status"] for d in patient_run["result"]["decisions"])
    assert statuses == {"succeeded": 12}, statuses
    outage = patient_run["progress"]["outage"]
    assert outage["decisionsDelayed"] >= 1
    assert outage["decisionsUnanswered"] == 0
    assert outage["refusals"]["coordination-unavailable"] >= 1
    waited = [a for a in patient_run["attempts"] if a.get("infrastructureRefusals")]
    # The attempt that met the outage waited it out and was then sent, as attempt number 1.
    assert all(a["sent"] and a["outcome"] == "succeeded" for a in waited), waited
    assert max(a["infrastructureWaitMs"] for a in waited) >= (OUTAGE_SECONDS - 2) * 1000

    hasty_run = runs["hasty"]
    statuses = Counter(d["status"] for d in hasty_run["result"]["decisions"])
    assert statuses["timeout"] >= 1, statuses
    assert statuses["timeout"] + statuses["succeeded"] == 6, statuses
    outage = hasty_run["progress"]["outage"]
    assert outage["decisionsUnanswered"] == statuses["timeout"]
    assert hasty_run["progress"]["outcomes"]["timeout"] == statuses["timeout"]
    unanswered = [a for a in hasty_run["attempts"] if not a["sent"]]
    assert {(a["outcome"], a["reason"]) for a in unanswered} == {
        ("timeout", "coordination-unavailable")
    }
    # Every answered decision reached the provider once; an unanswered one never did.
    answered = sum(
        d["status"] == "succeeded" for run in runs.values() for d in run["result"]["decisions"]
    )
    assert len(calls) == answered
    assert "Traceback" not in worker.log()
