"""The ``run_load_harness`` management command."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from evaluator.harness.records import verify_record

from .conftest import EVIDENCE, MANIFESTS, PROJECT_ROOT


def test_unknown_manifest_is_refused_with_a_clear_message(tmp_path):
    changed = tmp_path / "load-manifest.v2.json"
    changed.write_bytes((MANIFESTS / "load-manifest.v2.json").read_bytes() + b" ")
    with pytest.raises(CommandError, match="not a preregistered load manifest") as refused:
        call_command(
            "run_load_harness", "--manifest", str(changed), "--target", "admission-controller"
        )
    assert "sha256:" in str(refused.value)


def test_missing_manifest_file_is_a_command_error(tmp_path):
    with pytest.raises(CommandError, match="load manifest not found"):
        call_command(
            "run_load_harness",
            "--manifest",
            str(tmp_path / "absent.json"),
            "--target",
            "admission-controller",
        )


def test_v1_manifest_has_no_controller_path_and_the_command_says_so():
    with pytest.raises(CommandError, match="use target 'evaluator'"):
        call_command(
            "run_load_harness",
            "--manifest",
            "manifests/load-manifest.v1.json",
            "--target",
            "admission-controller",
        )


def test_command_writes_a_verified_record_and_a_summary(tmp_path):
    output = tmp_path / "result.json"
    stdout = io.StringIO()
    call_command(
        "run_load_harness",
        "--manifest",
        "manifests/load-manifest.v2.json",
        "--target",
        "evaluator",
        "--output",
        str(output),
        stdout=stdout,
    )
    record = json.loads(output.read_text(encoding="utf-8"))
    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    summary = stdout.getvalue()
    assert "arrivals" in summary and "passed" in summary
    assert record["digest"] in summary
    # Not a terminal: no progress bar redraws in the output.
    assert "\r" not in summary


def test_without_a_destination_the_record_is_the_output(capsys):
    stdout = io.StringIO()
    call_command(
        "run_load_harness",
        "--manifest",
        "manifests/load-manifest.v2.json",
        "--target",
        "evaluator",
        stdout=stdout,
    )
    record = json.loads(stdout.getvalue())
    verify_record(record)
    # The human summary stepped aside to stderr.
    assert "passed" in capsys.readouterr().err


def _harness(*args, cwd):
    # The Django-free entry point, in a fresh interpreter without a settings module.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "evaluator.harness", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_python_m_evaluator_harness_writes_the_same_record_without_django(tmp_path):
    output = tmp_path / "result.json"
    done = _harness(
        "--manifest",
        "manifests/load-manifest.v2.json",
        "--target",
        "admission-controller",
        "--output",
        str(output),
        cwd=tmp_path,  # a relative manifest path is also looked up in the project root
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(output.read_text(encoding="utf-8"))
    verify_record(record, (MANIFESTS / "load-manifest.v2.json").read_bytes())
    assert record["target"] == "admission-controller" and record["passed"]
    assert record["digest"] in done.stdout and f"wrote {output}" in done.stdout
    retained = json.loads((EVIDENCE / "admission-controller.json").read_text(encoding="utf-8"))
    assert record["observations"] == retained["observations"]


def test_python_m_evaluator_harness_refuses_bad_input_with_a_message(tmp_path):
    missing = _harness(
        "--manifest", str(tmp_path / "absent.json"), "--target", "evaluator", cwd=tmp_path
    )
    assert missing.returncode == 2
    assert "load manifest not found" in missing.stderr and "Traceback" not in missing.stderr
    changed = tmp_path / "load-manifest.v2.json"
    changed.write_bytes((MANIFESTS / "load-manifest.v2.json").read_bytes() + b" ")
    refused = _harness("--manifest", str(changed), "--target", "evaluator", cwd=tmp_path)
    assert refused.returncode == 2 and "not a preregistered load manifest" in refused.stderr
    unknown = _harness("--manifest", str(changed), "--target", "nowhere", cwd=tmp_path)
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr
