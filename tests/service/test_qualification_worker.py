"""What-if and staged-provider load runs travel the same path as every load run: a row, a Celery
task on a real broker, a real worker process that keeps the record on the row."""

from __future__ import annotations

import pytest

from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import staged_provider_env

pytestmark = pytest.mark.celery

START_WHAT_IF = """
from django.contrib.auth import get_user_model
from admission.models import ProfileVersion
from evaluator.services.runs import load_run_submit
version = ProfileVersion.objects.get(workspace__key="demo", profile_version="demo-v1")
approver = get_user_model().objects.get(username="demo-approver")
run = load_run_submit(version.workspace, approver, "load-manifest.v2.json", "evaluator",
                      what_if_version=version)
print(run.pk)
"""


def test_what_if_and_staged_runs_complete_on_a_real_worker(deployment):
    with LoopbackServer() as server:
        server.default = Reply(content="answered")
        env = staged_provider_env(server.base_url, window_seconds=1)
        deployment.start_web(env)
        deployment.start_worker(env)

        run_id = deployment.django(START_WHAT_IF).strip().splitlines()[-1]
        what_if = deployment.wait_run(run_id, timeout=120, load=True)
        assert what_if["status"] == "completed", what_if
        assert what_if["whatIfVersion"] == "demo-v1"
        assert what_if["record"]["mode"] == "what-if"
        assert what_if["record"]["whatIf"]["mapping"]["providers"] == {
            "jev": "fake",
            "llm-subagent": "fake",
        }

        response = deployment.api(
            "POST",
            "/api/workspaces/demo/load-runs/",
            json={"manifest": "load-manifest.v2.json", "target": "staged-provider"},
        )
        assert response.status_code == 201, response.text
        staged = deployment.wait_run(response.json()["id"], timeout=120, load=True)
        assert staged["status"] == "completed", staged
        assert staged["record"]["mode"] == "staged-provider"
        assert staged["passed"] is True
        assert staged["record"]["observations"]["completed"] == len(server.requests) > 0
