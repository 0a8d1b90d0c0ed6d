"""A real worker runs evaluations and load runs submitted over the REST API, end to end.

In `full` mode (CI) the worker is a subprocess on Redis and PostgreSQL; in `embedded` mode it
runs on the filesystem broker and SQLite, as `make run` does with no environment.
"""

from __future__ import annotations

import pytest

from console.forms.runs import example_request

pytestmark = pytest.mark.celery


def test_an_evaluation_submitted_over_the_api_completes_on_a_real_worker(deployment):
    deployment.start_web()
    deployment.start_worker()

    submitted = deployment.submit(example_request(10))
    assert submitted["status"] == "queued"
    assert submitted["principalId"] == "demo-proposer"
    assert submitted["workspaceId"] == "demo"

    run = deployment.wait_run(submitted["id"])
    assert run["status"] == "completed", run
    assert run["profileVersion"] == "demo-v1"
    assert run["deliveries"] == 1
    assert run["result"]["succeeded"] is True
    assert [d["decisionId"] for d in run["result"]["decisions"]] == [
        f"check-{i}" for i in range(1, 11)
    ]
    assert len(run["attempts"]) == 10
    for attempt in run["attempts"]:
        assert attempt["sent"] is True
        assert attempt["evidence"]["decision"] == "admit"
        assert attempt["evidence"]["reason"] == "admitted"
    # The run was claimed from the database by the worker process's runner, which registered
    # itself; the doorbell stored no Celery result (the run row is the record).
    stored = deployment.django(
        "from django_celery_results.models import TaskResult;"
        "from evaluator.models import EvaluationRun, WorkerProcess;"
        f"run = EvaluationRun.objects.get(pk='{run['id']}');"
        "worker = WorkerProcess.objects.get(pk=run.claimed_by);"
        f"print(worker.slots, TaskResult.objects.filter(task_id='{run['taskId']}').count())"
    )
    assert stored.split() == ["64", "0"]

    listing = deployment.api("GET", "/api/workspaces/demo/evaluations/").json()
    assert [item["id"] for item in listing["results"]] == [submitted["id"]]


def test_a_load_run_started_over_the_api_keeps_its_record(deployment):
    deployment.start_web()
    deployment.start_worker()

    response = deployment.api(
        "POST",
        "/api/workspaces/demo/load-runs/",
        json={"manifest": "load-manifest.v2.json", "target": "admission-controller"},
    )
    assert response.status_code == 201, response.text
    run = deployment.wait_run(response.json()["id"], timeout=240, load=True)
    assert run["status"] == "completed", run
    record = run["record"]
    assert record["schema"] == "decision-load-result/v1"
    assert record["target"] == "admission-controller"
    assert record["manifest"]["digest"] == run["manifestDigest"]
    assert run["passed"] is record["passed"] is True


def test_bad_requests_are_typed_400s_and_nothing_is_queued(deployment):
    deployment.start_web()
    path = "/api/workspaces/demo/evaluations/"

    def fields(document):
        response = deployment.api("POST", path, json=document)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid"
        return response.json()["error"]["fields"]

    assert "principal" in fields({**example_request(1), "principal": "someone-else"})
    assert "ruleset" in fields({"input": {}})
    unknown = example_request(1)
    unknown["ruleset"]["decisions"][0]["binding"]["primary"]["adapter"] = "nope"
    assert "ruleset.decisions[0].binding.primary.adapter" in fields(unknown)
    limits = {**example_request(1), "scheduler": {"profile": {"profileVersion": "x"}}}
    assert "scheduler.profile" in fields(limits)
    assert "non_field_errors" in fields([1, 2])

    load = deployment.api(
        "POST", "/api/workspaces/demo/load-runs/", json={"manifest": "x.json", "target": "y"}
    )
    assert load.status_code == 400
    assert "manifest" in load.json()["error"]["fields"]

    # A workspace the caller does not belong to does not exist for it.
    assert deployment.api("GET", "/api/workspaces/other/evaluations/").status_code == 404
    assert deployment.api("GET", path).json()["results"] == []


@pytest.mark.parametrize("mode", ["embedded"])
def test_a_second_worker_without_shared_admission_refuses_to_start(deployment):
    first = deployment.start_worker()
    second = deployment.start("worker-second", ["-m", "celery", "-A", "config", "worker"])
    # It stops by itself, saying why, and the first keeps running evaluations.
    second.popen.wait(timeout=60)
    assert "refuses to run evaluations" in second.log()
    assert "SLUICE_ADMISSION_REDIS_URL" in second.log()
    assert first.popen.poll() is None
    deployment.start_web()
    run = deployment.wait_run(deployment.submit(example_request(2))["id"])
    assert run["status"] == "completed"
    assert {call["pid"] for call in deployment.adapter_calls()} == {first.pid}
