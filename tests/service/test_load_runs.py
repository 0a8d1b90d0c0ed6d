"""Load runs on the evaluations' path, with real processes: the queued row survives a broker
restart, a SIGKILLed worker's run is taken back (a virtual-time run starts again and completes,
a staged-provider run ends `interrupted`), queued and running load runs are cancelled, and one
workspace's backlog of load runs does not hold up another's."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedis

from .conftest import Deployment, full_mode_urls, staged_provider_env, wait_for

pytestmark = pytest.mark.celery

LOAD_RUNS = "/api/workspaces/demo/load-runs/"
VIRTUAL = {"manifest": "load-manifest.v2.json", "target": "admission-controller"}


def _start(deployment: Deployment, body: dict[str, Any], workspace: str = "demo") -> str:
    response = deployment.api("POST", f"/api/workspaces/{workspace}/load-runs/", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "queued"
    return str(response.json()["id"])


def _load_run(deployment: Deployment, run_id: str, workspace: str = "demo") -> dict[str, Any]:
    response = deployment.api("GET", f"/api/workspaces/{workspace}/load-runs/{run_id}/")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _held(hold: Path) -> dict[str, str]:
    """A worker's environment whose load runs hold still while `hold` exists
    (tests/service/held_load_run.py)."""
    return {
        "DJANGO_SETTINGS_MODULE": "tests.service.held_load_run_settings",
        "SLUICE_TEST_HOLD_LOAD_RUN": str(hold),
    }


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_a_load_run_queued_across_a_redis_restart_completes(tmp_path: Path) -> None:
    full_mode_urls()
    redis = PrivateRedis()
    deployment = Deployment(tmp_path, "full", broker_url=redis.url)
    try:
        deployment.setup()
        deployment.start_web()
        run_id = _start(deployment, VIRTUAL)
        # Its doorbell is in Redis; Redis restarts without persistence and forgets it.
        redis.stop()
        redis.start()
        import redis as redis_client

        assert (
            redis_client.Redis.from_url(redis.url).llen(deployment.env["SLUICE_CELERY_QUEUE"]) == 0
        )
        assert _load_run(deployment, run_id)["status"] == "queued"

        deployment.start_worker()
        run = deployment.wait_run(run_id, timeout=60, load=True)
        assert run["status"] == "completed", run
        assert run["deliveries"] == 1
        assert run["progress"] == 1.0
        assert run["record"]["passed"] is True
    finally:
        deployment.stop()
        redis.destroy()


def test_a_sigkilled_workers_load_runs_restart_or_end_interrupted(deployment: Deployment) -> None:
    with LoopbackServer() as server:
        server.default = Reply(content="answered")
        staged_env = {
            **staged_provider_env(server.base_url, window_seconds=2),
            "SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT": "2",
            "SLUICE_CANCEL_CHECK_SECONDS": "0.2",
        }
        deployment.env.update(staged_env)
        hold = deployment.root / "hold-load-run"
        hold.touch()
        deployment.start_web()
        doomed = deployment.start_worker(_held(hold))
        virtual = _start(deployment, VIRTUAL)
        staged = _start(
            deployment, {"manifest": "load-manifest.v2.json", "target": "staged-provider"}
        )

        def both_held() -> bool:
            runs = [_load_run(deployment, run_id) for run_id in (virtual, staged)]
            return all(r["status"] == "running" and (r["progress"] or 0) > 0 for r in runs)

        wait_for(both_held, 90, "both load runs to run and hold")
        doomed.kill_group(signal.SIGKILL)
        hold.unlink()
        assert _load_run(deployment, virtual)["status"] == "running"

        survivor = deployment.start_worker()
        restarted = deployment.wait_run(virtual, timeout=60, load=True)
        assert restarted["status"] == "completed", restarted
        assert restarted["deliveries"] == 2
        assert restarted["record"]["passed"] is True
        interrupted = deployment.wait_run(staged, timeout=60, load=True)
        assert interrupted["status"] == "failed", interrupted
        assert interrupted["error"]["type"] == "interrupted"
        assert interrupted["deliveries"] == 1
        assert "stopped" in survivor.log()


def test_cancel_a_queued_and_a_running_load_run(deployment: Deployment) -> None:
    hold = deployment.root / "hold-load-run"
    hold.touch()
    deployment.start_web()
    deployment.start_worker({**_held(hold), "SLUICE_CANCEL_CHECK_SECONDS": "0.2"})
    running = _start(deployment, VIRTUAL)
    wait_for(lambda: Path(f"{hold}.held").exists(), 90, "the first load run to hold")
    # One load run of a workspace in flight: the second waits queued.
    queued = _start(deployment, VIRTUAL)
    time.sleep(0.5)
    assert _load_run(deployment, queued)["status"] == "queued"

    cancelled = deployment.api("POST", f"{LOAD_RUNS}{queued}/cancel/")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"

    asked = deployment.api("POST", f"{LOAD_RUNS}{running}/cancel/")
    assert asked.status_code == 202, asked.text
    requested = time.monotonic()
    ended = deployment.wait_run(running, timeout=30, load=True)
    assert ended["status"] == "cancelled", ended
    assert time.monotonic() - requested < 5
    assert ended["record"] is None
    assert ended["cancelRequestedBy"] == "demo-proposer"
    # The queued one never started.
    never = _load_run(deployment, queued)
    assert (never["status"], never["startedAt"], never["deliveries"]) == ("cancelled", None, 0)


@pytest.mark.parametrize("mode", ["full"])
def test_a_backlog_of_thirty_load_runs_does_not_hold_up_another_workspaces_run(
    deployment: Deployment,
) -> None:
    deployment.django(
        "from django.contrib.auth import get_user_model;"
        "from admission.models import Workspace;"
        "other = Workspace.objects.create(key='other', name='Other');"
        "other.members.add(get_user_model().objects.get(username='demo-proposer'),"
        " through_defaults={'role': 'operator'})"
    )
    deployment.start_web()
    deployment.start_worker({"SLUICE_WORKER_LOAD_SLOTS": "1"})
    burst = [_start(deployment, VIRTUAL) for _ in range(30)]
    quiet = _start(deployment, VIRTUAL, workspace="other")

    run = deployment.wait_run(quiet, timeout=120, load=True, workspace="other")
    assert run["status"] == "completed", run
    noisy = [_load_run(deployment, run_id) for run_id in burst]
    durations = [
        _at(r["finishedAt"]) - _at(r["startedAt"]) for r in noisy if r["status"] == "completed"
    ]
    assert durations
    waited = _at(run["startedAt"]) - _at(run["createdAt"])
    # It started when the load run in flight ended, not behind the backlog.
    assert waited <= max(durations), (waited, durations)
    started_before = [
        r for r in noisy if r["startedAt"] and _at(r["startedAt"]) < _at(run["startedAt"])
    ]
    assert len(started_before) <= 2, len(started_before)
