"""CNC-SCHED-005 as v1's load run: the bounded-scheduler gate recorded as a load result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from rest_framework.test import APIClient

from admission.models import Workspace
from evaluator import qualification
from evaluator.harness.errors import UnknownTargetError
from evaluator.harness.records import MODE_OFFLINE, verify_record
from evaluator.harness.scheduler_gate import run_scheduler_gate
from evaluator.harness.service import run_manifest
from evaluator.models import LoadRun

from .conftest import MANIFESTS, PROJECT_ROOT

RETAINED = PROJECT_ROOT / "evidence" / "load-offline-v1" / "evaluator.json"
REFUSAL = "runs as the bounded-scheduler gate (CNC-SCHED-005) through the evaluator"


@pytest.fixture(scope="module")
def v1_record(tmp_path_factory):
    # As an operator runs it: its own process, so the resource bounds (resident memory, CPU)
    # measure the load run and not whatever else this test process did before.
    output = tmp_path_factory.mktemp("v1") / "record.json"
    command = [sys.executable, "-m", "evaluator.harness", "--target", "evaluator"]
    command += ["--manifest", str(MANIFESTS / "load-manifest.v1.json"), "--output", str(output)]
    env = {**os.environ, "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY", "harness-test")}
    subprocess.run(command, cwd=PROJECT_ROOT, env=env, check=True, capture_output=True, timeout=600)
    return json.loads(output.read_text(encoding="utf-8"))


def test_CNC_SCHED_005_v1_load_run_is_the_gate_and_passes(v1_record, manifest_v1):
    verify_record(v1_record, (MANIFESTS / "load-manifest.v1.json").read_bytes())
    assert v1_record["mode"] == MODE_OFFLINE and v1_record["target"] == "evaluator"
    assert v1_record["window"]["seconds"] == 990
    assert [c["bound"] for c in v1_record["comparisons"]] == list(manifest_v1.bounds)
    assert v1_record["passed"] is True
    observed = v1_record["observations"]
    report = run_scheduler_gate(manifest_v1)
    assert observed["arrivals"] == observed["completed"] == report.arrivals
    assert observed["maximumActiveCalls"] == report.maximum_active_calls == 3
    assert observed["maximumEligibleLaneWaitMs"] == report.maximum_eligible_lane_wait_ms
    assert observed["canonicalOrderKept"] is True
    assert observed["schedulerCeiling"] == 3 and observed["evaluations"] == report.evaluations


def test_CNC_SCHED_005_retained_v1_record_verifies_and_is_reproduced(v1_record):
    retained = json.loads(RETAINED.read_text(encoding="utf-8"))
    verify_record(retained, (MANIFESTS / "load-manifest.v1.json").read_bytes())
    assert retained["passed"] is True
    assert retained["observations"] == v1_record["observations"]


def test_v1_has_no_admission_controller_path(manifest_v1):
    with pytest.raises(UnknownTargetError, match=re.escape(REFUSAL)):
        run_manifest(manifest_v1, "admission-controller")


@pytest.mark.django_db
def test_v1_for_the_controller_path_is_refused_at_submission(django_user_model):
    workspace = Workspace.objects.create(key="acme", name="Acme")
    user = django_user_model.objects.create_user(username="sam")
    # Load runs are an operator's act in the workspace (admission.access).
    workspace.members.add(user, through_defaults={"role": "operator"})
    client = APIClient()
    client.force_authenticate(user)
    body = {"manifest": "load-manifest.v1.json", "target": "admission-controller"}
    response = client.post("/api/workspaces/acme/load-runs/", body, format="json")
    assert response.status_code == 400
    assert REFUSAL in response.json()["error"]["fields"]["target"][0]
    assert LoadRun.objects.count() == 0

    with pytest.raises(qualification.QualificationError, match=re.escape(REFUSAL)) as refused:
        qualification.check("load-manifest.v1.json", "staged-provider")
    assert refused.value.field == "target"
    qualification.check("load-manifest.v1.json", "evaluator")
