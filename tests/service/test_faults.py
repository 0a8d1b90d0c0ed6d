"""Faults with real processes: a worker SIGKILLed mid-dispatch, and a broker that is down.

A killed worker's run goes back to the backlog when the next worker's sweeper sees its claimant
is gone, and is claimed again. The new claim resumes from the database receipt: the call that
was in flight becomes `execution-uncertain` and is never sent again; the rest run once.
"""

from __future__ import annotations

import collections
import json
import signal

import pytest

from console.forms.runs import example_request

from .conftest import free_port, wait_for

pytestmark = pytest.mark.celery

SLOW = 1500
RECEIPT = """
import json
from evaluator.models import EvaluationRun, Receipt
run = EvaluationRun.objects.get(pk="{run_id}")
receipt = Receipt.objects.get(workspace_id="demo", invocation_id=run.invocation_id)
print(json.dumps({{"state": receipt.state, "pending": receipt.pending_dispatches}}))
"""


def _assert_resumed_truthfully(deployment, run):
    assert run["status"] == "execution-uncertain", run
    assert run["deliveries"] == 2
    assert run["result"]["resumed"] is True
    statuses = {d["decisionId"]: d["status"] for d in run["result"]["decisions"]}
    assert statuses == {
        "check-1": "succeeded",
        "check-2": "execution-uncertain",
        "check-3": "succeeded",
        "check-4": "succeeded",
    }
    uncertain = [a for a in run["attempts"] if a["decisionId"] == "check-2"]
    assert len(uncertain) == 1
    assert uncertain[0]["sent"] is True
    assert uncertain[0]["reason"] == "dispatch-unconfirmed"
    # Every decision reached the adapter exactly once, across both worker processes.
    calls = collections.Counter(call["decisionId"] for call in deployment.adapter_calls())
    assert calls == {"check-1": 1, "check-2": 1, "check-3": 1, "check-4": 1}
    assert len({call["pid"] for call in deployment.adapter_calls()}) == 2
    receipt = json.loads(deployment.django(RECEIPT.format(run_id=run["id"])).splitlines()[-1])
    assert receipt == {"state": "completed", "pending": 0}


def _submit_and_wait_for_second_dispatch(deployment):
    submitted = deployment.submit(example_request(4))
    wait_for(lambda: len(deployment.adapter_calls()) >= 2, 60, "the second adapter call")

    # check-1's record is written as its call ends, beside check-2's slot write and call, not
    # before them: seeing check-2's call does not mean check-1's record has landed. It lands
    # one write later, well inside check-2's call; kill only once it is in the database.
    def first_recorded_second_out() -> bool:
        progress = deployment.evaluation(submitted["id"])["progress"]
        out = [call["decisionId"] for call in progress["inFlight"]]
        return progress["outcomes"] == {"succeeded": 1} and out == ["check-2"]

    wait_for(first_recorded_second_out, SLOW / 1000 / 2, "check-1 recorded, check-2 in flight")
    return submitted


def test_a_whole_worker_killed_mid_dispatch_is_redelivered_to_the_next_one(deployment):
    deployment.start_web()
    env = {"SLUICE_ADAPTERS": deployment.adapters(latency_ms=SLOW)}
    first = deployment.start_worker(env)
    submitted = _submit_and_wait_for_second_dispatch(deployment)

    first.kill_group(signal.SIGKILL)
    assert deployment.evaluation(submitted["id"])["status"] == "running"

    second = deployment.start_worker(env)
    run = deployment.wait_run(submitted["id"], timeout=120)
    _assert_resumed_truthfully(deployment, run)
    assert "claimed again (delivery 2)" in second.log()


def test_a_broker_that_is_down_at_submit_still_queues_the_run_and_a_worker_runs_it(deployment):
    dead_broker = f"redis://127.0.0.1:{free_port()}/0"
    deployment.start_web({"CELERY_BROKER_URL": dead_broker})
    document = {**example_request(2), "invocationId": "no-doorbell-1"}
    path = "/api/workspaces/demo/evaluations/"

    # The run row is the queue: it is accepted although its doorbell could not be published.
    response = deployment.api("POST", path, json=document)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "queued"

    # A worker on a broker that works finds it in the database all the same.
    deployment.start_worker()
    run = deployment.wait_run(response.json()["id"])
    assert run["status"] == "completed", run
    assert run["deliveries"] == 1
    assert collections.Counter(c["decisionId"] for c in deployment.adapter_calls()) == {
        "check-1": 1,
        "check-2": 1,
    }

    # Load runs travel the same way: accepted although no doorbell rings, run from the row.
    load = deployment.api(
        "POST",
        "/api/workspaces/demo/load-runs/",
        json={"manifest": "load-manifest.v2.json", "target": "admission-controller"},
    )
    assert load.status_code == 201, load.text
    assert load.json()["status"] == "queued"
    assert deployment.wait_run(load.json()["id"], timeout=120, load=True)["status"] == "completed"
