"""Who may read `/metrics`, and what the page holds when admission stays in one process."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from admission.models import Workspace
from config.env import SettingsError, env_networks
from evaluator.models import EvaluationRun, WorkerProcess

TOKEN = "a-metrics-token-of-some-length"


def families(response) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}


@pytest.fixture
def locked(settings):
    settings.SLUICE_METRICS_TOKEN = TOKEN
    settings.SLUICE_METRICS_ALLOW_FROM = (ipaddress.ip_network("10.1.0.0/16"),)
    return settings


@pytest.mark.django_db
def test_metrics_need_the_token_or_an_allowed_address(locked):
    # Scrapers call the pod's address, which is no allowed host.
    client = Client(HTTP_HOST="10.0.0.7:8000", REMOTE_ADDR="192.0.2.5")
    refused = client.get("/metrics")
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "forbidden"
    assert "sluice_" not in refused.content.decode()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {TOKEN}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t\u00e9st\u2603").status_code == 403

    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert answer["Cache-Control"] == "no-store"

    inside = Client(HTTP_HOST="10.0.0.7:8000", REMOTE_ADDR="10.1.200.3")
    assert inside.get("/metrics").status_code == 200
    assert inside.head("/metrics").status_code == 200
    posted = inside.post("/metrics")
    assert posted.status_code == 405 and posted["Allow"] == "GET, HEAD"


@pytest.mark.django_db
def test_with_nothing_configured_nobody_reads_metrics(settings):
    settings.SLUICE_METRICS_TOKEN = ""
    settings.SLUICE_METRICS_ALLOW_FROM = ()
    client = Client(REMOTE_ADDR="127.0.0.1")
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403


@pytest.mark.django_db
def test_in_process_admission_reports_runs_and_dependencies_only(
    locked, django_user_model, tmp_path
):
    if str(locked.CELERY_BROKER_URL).startswith("filesystem://"):
        # The embedded broker's folder exists once a worker made it; here, a folder of the test's.
        options = dict(locked.CELERY_BROKER_TRANSPORT_OPTIONS)
        options["data_folder_in"] = str(tmp_path)
        locked.CELERY_BROKER_TRANSPORT_OPTIONS = options
    user = django_user_model.objects.create_user("uma")
    workspace = Workspace.objects.create(key="acme", name="Acme")
    for index, status in enumerate(["queued", "queued", "completed", "failed"]):
        EvaluationRun.objects.create(
            workspace=workspace,
            submitted_by=user,
            principal_id="uma",
            invocation_id=f"inv-{index}",
            document={},
            status=status,
        )
    answer = Client(REMOTE_ADDR="10.1.0.9").get("/metrics")
    found = families(answer)
    runs = {
        (s.labels["kind"], s.labels["status"]): s.value for s in found["sluice_runs"] if s.value
    }
    assert runs == {
        ("evaluation", "queued"): 2,
        ("evaluation", "completed"): 1,
        ("evaluation", "failed"): 1,
    }
    oldest = {s.labels["kind"]: s.value for s in found["sluice_runs_oldest_queued_seconds"]}
    assert oldest["evaluation"] > 0 and oldest["load"] == 0
    assert [s.value for s in found["sluice_admission_coordinated"]] == [0]
    assert found["sluice_admission_decisions"] == []
    up = {s.labels["dependency"]: s.value for s in found["sluice_dependency_up"]}
    # Redis is skipped when admission is kept in process: no series for it.
    assert up == {"database": 1, "broker": 1}
    text = answer.content.decode()
    for identity in ("acme", "uma", "inv-0"):
        assert identity not in text


def test_allowed_networks_are_read_and_checked(monkeypatch):
    monkeypatch.setenv("SLUICE_METRICS_ALLOW_FROM", "10.0.0.0/8, 192.168.1.7 ,::1")
    assert [str(n) for n in env_networks("SLUICE_METRICS_ALLOW_FROM")] == [
        "10.0.0.0/8",
        "192.168.1.7/32",
        "::1/128",
    ]
    monkeypatch.setenv("SLUICE_METRICS_ALLOW_FROM", "10.0.0.0/8,intranet")
    with pytest.raises(SettingsError, match=r"SLUICE_METRICS_ALLOW_FROM .* got 'intranet'"):
        env_networks("SLUICE_METRICS_ALLOW_FROM")


@pytest.mark.django_db
def test_workers_and_the_sweeper_they_run_are_reported(locked, django_user_model):
    def scrape() -> dict[str, list]:
        return families(Client(REMOTE_ADDR="10.1.0.9").get("/metrics"))

    found = scrape()
    assert [s.value for s in found["sluice_sweeper_up"]] == [0]

    now = timezone.now()
    stale = now - timedelta(seconds=locked.SLUICE_RUN_STALE_SECONDS + 5)
    for name, beat, stopped, slots in [
        ("w-live", now, None, 64),
        ("w-quiet", stale, None, 64),
        ("w-gone", now, now, 64),
        ("w-live-2", now, None, 8),
    ]:
        WorkerProcess.objects.create(
            id=name,
            hostname="h",
            pid=1,
            coordinated=True,
            slots=slots,
            heartbeat_at=beat,
            stopped_at=stopped,
        )
    user = django_user_model.objects.create_user("uma")
    workspace = Workspace.objects.create(key="acme", name="Acme")
    for index, beat in enumerate([now, stale, stale]):
        EvaluationRun.objects.create(
            workspace=workspace,
            submitted_by=user,
            principal_id="uma",
            invocation_id=f"inv-{index}",
            document={},
            status="running",
            heartbeat_at=beat,
        )

    found = scrape()
    workers = {s.labels["state"]: s.value for s in found["sluice_worker_processes"]}
    assert workers == {"live": 2, "stale": 1}
    assert [s.value for s in found["sluice_worker_slots"]] == [72]
    assert [s.value for s in found["sluice_sweeper_up"]] == [1]
    assert [s.value for s in found["sluice_runs_stale_running"]] == [2]
