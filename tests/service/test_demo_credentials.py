"""The first run on another address keeps the demo passwords: `python -m config.cli run` (what
`make run` runs) on a fresh copy of the tree writes them to a file under var/ that only its owner
can read, says where, and its curl lines name the token they use and work as printed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import ROOT, free_port

pytestmark = pytest.mark.celery

_COPIED_NOT = (".venv", ".git", "var", "build", "*.egg-info", "__pycache__", ".*_cache")
_STRIPPED = ("DATABASE_URL", "CELERY_BROKER_URL", "VIRTUAL_ENV", "PYTHONPATH")


def test_first_run_on_another_address_keeps_the_passwords_in_an_owner_only_file(tmp_path):
    tree = tmp_path / "sluice"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*_COPIED_NOT))
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _STRIPPED and not key.startswith(("SLUICE_", "DJANGO_"))
    }
    env["SLUICE_ADDR"] = f"127.0.0.1:{port}"
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "config.cli", "run"],
            cwd=tree,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output() -> str:
        return log_path.read_text(encoding="utf-8", errors="replace")

    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while "Press Ctrl-C" not in output():
            assert launcher.poll() is None, f"the launcher exited early:\n{output()[-5000:]}"
            assert time.monotonic() < deadline, f"not ready:\n{output()[-5000:]}"
            time.sleep(0.2)
        banner = output()
        credentials = tree / "var" / "demo-credentials.txt"
        assert "The demo passwords are in var/demo-credentials.txt (readable by you only)." in (
            banner
        )
        assert oct(credentials.stat().st_mode & 0o777) == "0o600"
        passwords = dict(
            line.split(" ", 1)
            for line in credentials.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")
        )
        assert set(passwords) == {"demo-proposer", "demo-approver"}
        # Nothing secret on the terminal of a server on another address.
        assert not any(password in banner for password in passwords.values())

        # Each password signs in: an API token over HTTP Basic, and the admin's login form.
        for username, password in passwords.items():
            issued = httpx.post(f"{base}/api/auth/token/", auth=(username, password), timeout=30)
            assert issued.status_code == 200, issued.text
            with httpx.Client(base_url=base, timeout=30) as browser:
                form = browser.get("/admin/login/")
                token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
                assert token, form.text
                signed_in = browser.post(
                    "/admin/login/?next=/admin/",
                    data={
                        "username": username,
                        "password": password,
                        "csrfmiddlewaretoken": token.group(1),
                    },
                    headers={"Referer": f"{base}/admin/login/"},
                )
                assert signed_in.status_code == 302, signed_in.text
                assert browser.get("/admin/").status_code == 200

        # The curl lines say whose token they use, and run as printed.
        assert "Run an evaluation as demo-proposer (TOKEN is demo-proposer's API token" in banner
        block = banner.split("Run an evaluation as", 1)[1].split("\n\n", 1)[0]
        commands = "\n".join(block.splitlines()[1:])
        commands = commands.replace("curl -sS", "curl -sS -o /dev/null -w '%{http_code}'")
        assert commands.lstrip().startswith("TOKEN=$(cd ")
        ran = subprocess.run(
            ["bash", "-c", commands], env=env, capture_output=True, text=True, timeout=120
        )
        assert ran.returncode == 0 and ran.stdout.strip() == "201", ran.stdout + ran.stderr
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            raise

    # A later run creates no account: the file stays as it was, and the banner still names it.
    kept = credentials.read_text(encoding="utf-8")
    again = subprocess.run(
        [sys.executable, "-m", "config.cli", "demo-setup"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "The passwords are kept in var/demo-credentials.txt" in again.stdout
    assert credentials.read_text(encoding="utf-8") == kept
