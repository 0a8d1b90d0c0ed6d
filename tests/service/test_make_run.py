"""The newcomer's path: `make run` in a fresh clone, with no environment, serves the admin and
the API, runs an evaluation on its worker, and leaves no process behind on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from console.forms.runs import example_request

from .conftest import ROOT, TERMINAL, free_port, wait_for

pytestmark = pytest.mark.celery

INSTALL_SECONDS = 900
_STRIPPED = ("DATABASE_URL", "CELERY_BROKER_URL", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")


def _processes_in(directory: Path) -> list[str]:
    """Processes whose working directory lies inside `directory`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cwd == str(directory) or cwd.startswith(f"{directory}/"):
            found.append(f"{entry.name}: {cmdline}")
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_make_run_in_a_fresh_clone_serves_runs_and_stops_cleanly(tmp_path):
    clone = tmp_path / "sluice"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _STRIPPED and not key.startswith(("SLUICE_", "DJANGO_"))
    }
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env["SLUICE_ADDR"] = f"127.0.0.1:{port}"
    # Not the default address: the banner shows credentials only when asked to.
    env["SLUICE_SHOW_CREDENTIALS"] = "1"
    log_path = tmp_path / "make-run.log"
    with log_path.open("wb") as log:
        make = subprocess.Popen(
            ["make", "run"],
            cwd=clone,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def output() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")

    try:
        deadline = time.monotonic() + INSTALL_SECONDS
        while "Sluice is running." not in output():
            assert make.poll() is None, f"make run exited early:\n{output()[-5000:]}"
            assert time.monotonic() < deadline, f"make run not ready:\n{output()[-5000:]}"
            time.sleep(1)
        login = httpx.get(f"{base}/admin/login/", timeout=10)
        assert login.status_code == 200
        assert "Django administration" in login.text or "Sluice" in login.text

        match = re.search(r"user demo-proposer\s+password (\S+)\s+API token (\w+)", output())
        assert match, output()
        # No DJANGO_SECRET_KEY given: the demo generated one for this deployment, owner-only.
        key_file = clone / "var" / "secret-key"
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        assert match.group(1) not in ("proposer-demo-pass", "(shown")
        headers = {"Authorization": f"Token {match.group(2)}"}
        response = httpx.post(
            f"{base}/api/workspaces/demo/evaluations/",
            json=example_request(10),
            headers=headers,
            timeout=30,
        )
        assert response.status_code == 201, response.text
        url = f"{base}/api/workspaces/demo/evaluations/{response.json()['id']}/"
        run: dict = {}

        def finished() -> bool:
            nonlocal run
            run = httpx.get(url, headers=headers, timeout=10).json()
            return run["status"] in TERMINAL

        wait_for(finished, 120, "the evaluation")
        assert run["status"] == "completed", run
        assert run["result"]["succeeded"] is True
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGTERM)
        try:
            make.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            raise
    wait_for(lambda: not _group_alive(make.pid), 30, "every process of make run to exit")
    assert _processes_in(clone) == []
    assert "Stopped." in output()
