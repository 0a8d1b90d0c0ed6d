"""The production worker and beat commands (`python -m config.cli worker | beat`): a worker
started by the command runs evaluations; beat starts with its schedule under the var dir and both
stop on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest

from console.forms.runs import example_request

from .conftest import wait_for

pytestmark = pytest.mark.celery


def test_worker_command_runs_evaluations_and_stops_on_sigterm(deployment):
    deployment.start_web()
    name = f"cmd-{uuid.uuid4().hex[:6]}"
    worker = deployment.start(
        "worker-cmd",
        ["-m", "config.cli", "worker", "--concurrency", "1", "--hostname", f"{name}@%h"],
        env={"SLUICE_LOG_LEVEL": "INFO"},
    )
    wait_for(lambda: " ready." in worker.log(), 90, "the worker started by `config.cli worker`")
    assert f"{name}@" in worker.log()

    run = deployment.wait_run(deployment.submit(example_request(2))["id"])
    assert run["status"] == "completed", run

    worker.popen.send_signal(signal.SIGTERM)
    assert worker.popen.wait(timeout=60) == 0, worker.log()[-3000:]


def test_beat_command_keeps_its_schedule_in_the_var_dir_and_stops_on_sigterm(deployment):
    beat = deployment.start("beat-cmd", ["-m", "config.cli", "beat", "--loglevel", "DEBUG"])
    # Beat says how often it ticks once its scheduler is set up (a SIGTERM before that would
    # land in the middle of its imports).
    wait_for(lambda: "Ticking with max interval" in beat.log(), 90, "beat's scheduler running")
    assert "beat: Starting..." in beat.log()
    var = deployment.root / "var"
    assert any(var.glob("celerybeat-schedule*")), sorted(p.name for p in var.iterdir())
    beat.popen.send_signal(signal.SIGTERM)
    try:
        code = beat.popen.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(beat.log()[-3000:]) from None
    assert code == 0, beat.log()[-3000:]
