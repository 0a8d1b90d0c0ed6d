"""`python -m config.cli web` as a real child process with its own environment and log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.service.conftest import free_port
from tests.service.conftest import wait_for as wait_until

ROOT = Path(__file__).resolve().parents[2]
_CONTROLLED = ("DATABASE_URL", "CELERY_BROKER_URL", "SLUICE_VAR_DIR", "DJANGO_SETTINGS_MODULE")


def sluice_env(var_dir: Path, **overrides: str) -> dict[str, str]:
    """The test process's environment without its deployment settings, plus `overrides`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _CONTROLLED and not k.startswith("SLUICE_ADMISSION_")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        SLUICE_VAR_DIR=str(var_dir),
        PYTHONUNBUFFERED="1",
        **overrides,
    )
    return env


def manage(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"manage.py {argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class WebServer:
    """The production web command on a free port; `stop()` sends SIGTERM and waits."""

    def __init__(self, env: dict[str, str], log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = log.open("ab")
        argv = [sys.executable, "-m", "config.cli", "web", "--bind", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(
            [*argv, "--workers", "1", *extra],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        wait_until(self._up, 90, f"the web server to answer\n{self.log()}")

    def _up(self) -> bool:
        assert self.process.poll() is None, f"the web server exited:\n{self.log()}"
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=20, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log.close()
        return self.process.returncode
