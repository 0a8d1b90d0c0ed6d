"""Finding 6 (API side): throttles per user, per workspace, and a stricter scope for POSTs that
start runs; a refusal is 429 with Retry-After and the typed body; counters are shared by every
process through the cache (Redis in full mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.forms.runs import example_request
from evaluator.models import EvaluationRun

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def _rates(settings: Any, **rates: str | None) -> None:
    settings.SLUICE_THROTTLE_RATES = {"anon": None, "user": None, "workspace": None, "submit": None}
    settings.SLUICE_THROTTLE_RATES.update(rates)


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _assert_throttled(response: Any) -> None:
    assert response.status_code == 429, response.content
    assert 0 < int(response["Retry-After"]) <= 60
    error = response.json()["error"]
    assert error["type"] == "throttled"
    assert "Expected available in" in error["detail"]


def test_submissions_have_their_own_stricter_budget(settings, member, workspace):
    _rates(settings, submit="3/minute", user="100/minute")
    client = _client(member)
    url = "/api/workspaces/acme/evaluations/"
    for _ in range(3):
        # No active profile: each is a 400, and each still spends the submission budget.
        assert client.post(url, example_request(1), format="json").status_code == 400
    _assert_throttled(client.post(url, example_request(1), format="json"))
    assert client.get(url).status_code == 200
    assert not EvaluationRun.objects.exists()


def test_load_run_posts_share_the_submission_budget(settings, proposer, workspace):
    _rates(settings, submit="2/minute")
    client = _client(proposer)
    body = {"manifest": "no-such-manifest.json", "target": "evaluator"}
    for _ in range(2):
        assert (
            client.post("/api/workspaces/acme/load-runs/", body, format="json").status_code == 400
        )
    _assert_throttled(client.post("/api/workspaces/acme/load-runs/", body, format="json"))


def test_each_user_has_a_budget_of_their_own(settings, member, proposer, workspace):
    _rates(settings, user="2/minute")
    mia, pat = _client(member), _client(proposer)
    for _ in range(2):
        assert mia.get("/api/workspaces/").status_code == 200
    _assert_throttled(mia.get("/api/workspaces/"))
    assert pat.get("/api/workspaces/").status_code == 200


def test_a_workspace_budget_is_shared_by_its_members_and_only_by_them(
    settings, member, proposer, workspace, other_workspace, make_user
):
    _rates(settings, workspace="3/minute")
    outsider = _client(make_user("otto"))
    for _ in range(10):
        # Knocking on a workspace one cannot see spends nothing of its budget.
        assert outsider.get("/api/workspaces/acme/profiles/").status_code == 404
    mia, pat = _client(member), _client(proposer)
    assert mia.get("/api/workspaces/acme/profiles/").status_code == 200
    assert pat.get("/api/workspaces/acme/profile-history/").status_code == 200
    assert mia.get("/api/workspaces/acme/evaluations/").status_code == 200
    _assert_throttled(pat.get("/api/workspaces/acme/profiles/"))
    other_workspace.members.add(member)
    assert mia.get("/api/workspaces/globex/profiles/").status_code == 200


def _redis_url() -> str:
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL=redis://... (CI sets it)")
    return broker


def _throttle_in_a_new_process(environment: dict[str, str]) -> dict[str, Any]:
    code = """
import json, django
django.setup()
from django.conf import settings
from console.api.throttles import UserThrottle

class Caller:
    pk = 424242
    is_authenticated = True

class Request:
    user = Caller()
    META = {"REMOTE_ADDR": "127.0.0.1"}
    method = "GET"

print(json.dumps({
    "backend": settings.CACHES["default"]["BACKEND"],
    "allowed": [UserThrottle().allow_request(Request(), None) for _ in range(2)],
}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(environment, DJANGO_SETTINGS_MODULE="config.settings")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_throttle_counters_are_shared_across_processes_through_redis():
    import redis

    broker = _redis_url()
    prefix = f"sluice-test-{uuid.uuid4().hex[:10]}"
    # The broker's Redis is the cache when no SLUICE_CACHE_URL says otherwise.
    environment = {
        "CELERY_BROKER_URL": broker,
        "SLUICE_CACHE_KEY_PREFIX": prefix,
        "SLUICE_THROTTLE_USER": "3/minute",
    }
    try:
        first = _throttle_in_a_new_process(environment)
        second = _throttle_in_a_new_process(environment)
    finally:
        client = redis.Redis.from_url(broker)
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
    assert first["backend"] == second["backend"] == "django.core.cache.backends.redis.RedisCache"
    assert first["allowed"] == [True, True]
    assert second["allowed"] == [True, False]


def test_without_redis_the_cache_is_local_memory():
    result = _throttle_in_a_new_process({"CELERY_BROKER_URL": "filesystem://"})
    assert result["backend"] == "django.core.cache.backends.locmem.LocMemCache"
