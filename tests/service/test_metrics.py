"""`/metrics` on a real deployment, admission coordinated in Redis or kept in the one worker:
after an evaluation its counters have moved (admissions, throttles, breaker transitions, queue
delay, runs by status), figures are the deployment's (the worker decided, the web server
reports), and no series carries an id in any label."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import (
    BREAKING_ADAPTERS,
    admission_redis_env,
    request_with_unknown_provider,
    wait_for,
)

pytestmark = pytest.mark.celery

TOKEN = "metrics-token-4b1d9e0a7c"


def scrape(deployment, token: str | None = TOKEN) -> dict[tuple[str, tuple], float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(deployment.web_url + "/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, found), value in samples.items()
        if sample == name and labels.items() <= dict(found).items()
    )


def test_metrics_after_an_evaluation_show_the_deployment_without_ids(deployment):
    env = {
        "SLUICE_ADAPTERS": BREAKING_ADAPTERS,
        "SLUICE_METRICS_TOKEN": TOKEN,
        # Admission in the worker: it publishes its figures twice a second for this test.
        "SLUICE_ADMISSION_SNAPSHOT_SECONDS": "0.5",
    }
    env.update(admission_redis_env(deployment))
    deployment.start_web(env)
    deployment.start_worker(env)

    refused = httpx.get(deployment.web_url + "/metrics", timeout=10)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden"
    wrong = httpx.get(
        deployment.web_url + "/metrics",
        headers={"Authorization": "Bearer " + "x" * len(TOKEN)},
        timeout=10,
    )
    assert wrong.status_code == 403

    before = scrape(deployment)
    coordinated = deployment.mode == "full"
    assert total(before, "sluice_admission_coordinated") == (1 if coordinated else 0)
    assert total(before, "sluice_runs", kind="evaluation") == 0
    assert total(before, "sluice_admission_decisions_total") == 0
    assert total(before, "sluice_dependency_up", dependency="database") == 1
    assert total(before, "sluice_dependency_up", dependency="broker") == 1

    document = request_with_unknown_provider("inv-metrics-5e2a")
    run = deployment.wait_run(deployment.submit(document)["id"])
    assert run["status"] in ("completed", "execution-uncertain"), run

    after = scrape(deployment)
    assert total(after, "sluice_runs", kind="evaluation", status=run["status"]) == 1
    assert total(after, "sluice_runs", kind="evaluation", status="queued") == 0
    assert total(after, "sluice_runs_oldest_queued_seconds", kind="evaluation") == 0

    # The worker made the decisions; the web server reads them from the shared state in Redis
    # or, with admission kept in the worker, from the figures the worker publishes. Rejections
    # decided without a round trip arrive with the worker's next heartbeat or snapshot, and a
    # snapshot written while the run's last call was out still shows that call: wait for the
    # first one written after the run.
    def counted() -> bool:
        nonlocal after
        after = scrape(deployment)
        return (
            total(
                after,
                "sluice_admission_throttles_total",
                decision="reject",
                reason="unconfigured-provider",
            )
            >= 1
            and total(after, "sluice_admission_breaker_transitions_total", provider="fake") >= 1
            and total(after, "sluice_admission_active_calls", provider="fake") == 0
        )

    wait_for(counted, 30, "the worker's rejections in /metrics")
    admitted = total(after, "sluice_admission_decisions_total", provider="fake", decision="admit")
    assert admitted >= 5
    assert (
        total(
            after,
            "sluice_admission_breaker_transitions_total",
            provider="fake",
            to="open",
            **{"from": "closed"},
        )
        >= 1
    )
    # Every admitted request has its queue delay in the histogram.
    assert total(after, "sluice_admission_queue_delay_seconds_count", provider="fake") == admitted
    assert (
        total(after, "sluice_admission_queue_delay_seconds_bucket", provider="fake", le="+Inf")
        == admitted
    )
    assert total(after, "sluice_admission_limit", provider="fake", limit="concurrency") == 4
    assert total(after, "sluice_admission_active_calls", provider="fake") == 0
    assert total(after, "sluice_admission_breakers", provider="fake") == 1
    assert total(after, "sluice_admission_workspaces") == 1
    assert total(after, "sluice_admission_principals") == 2
    assert total(after, "sluice_admission_processes") >= 1
    if coordinated:
        assert total(after, "sluice_dependency_up", dependency="redis") == 1

    # Every label value of every series: no principal, workspace, run or invocation id.
    labels = [(key, value) for _, found in after for key, value in found]
    assert len(labels) > 40
    for key, value in labels:
        assert value != "demo", (key, value)
        for secret in ("demo-proposer", "demo-approver", "inv-metrics-5e2a", run["id"]):
            assert secret not in value, (key, value)
