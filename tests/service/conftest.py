"""A throwaway Sluice deployment per test: its own database, broker queue, web server and workers,
all real processes, driven over HTTP with the demo's API token.

Two modes. `embedded`: SQLite and the filesystem broker in a temporary var dir (always runs).
`full`: PostgreSQL and Redis from DATABASE_URL / CELERY_BROKER_URL (CI sets both); each test gets
a fresh PostgreSQL database and its own queue name, and the mode is skipped with a reason when
those variables do not point at reachable servers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TERMINAL = {"completed", "execution-uncertain", "cancelled", "timeout", "failed"}
_CONTROLLED = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "SLUICE_VAR_DIR",
    "SLUICE_ADAPTERS",
    "SLUICE_CELERY_QUEUE",
    "SLUICE_PROFILE_LISTEN",
    "SLUICE_PROFILE_POLL_SECONDS",
    "SLUICE_BROKER_VISIBILITY_TIMEOUT",
    "SLUICE_ADMISSION_REDIS_URL",
    "SLUICE_ADMISSION_KEY_PREFIX",
    "SLUICE_ADMISSION_RECOVERY_GRACE_MS",
    "SLUICE_WORKER_SLOTS",
    "SLUICE_WORKSPACE_RUNS_IN_FLIGHT",
    "SLUICE_DISPATCH_POLL_SECONDS",
    "SLUICE_RUN_HEARTBEAT_SECONDS",
    "SLUICE_RUN_STALE_SECONDS",
    "SLUICE_ADMISSION_SNAPSHOT_SECONDS",
    "SLUICE_TEST_HOLD_PUBLISH",
    "SLUICE_TEST_HOLD_LOAD_RUN",
    "SLUICE_WORKER_LOAD_SLOTS",
    "SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT",
    "SLUICE_WORKSPACE_LOAD_RUNS_QUEUED",
    "DJANGO_SETTINGS_MODULE",
)


_static_lock = threading.Lock()
_static: list[Path] = []


def collected_static(env: dict[str, str]) -> Path:
    """The project's static files as production serves them: `collectstatic` into a directory
    of this test session's own (once), which each deployment's STATIC_ROOT links to, so the
    web server's WhiteNoise serves them with DEBUG off."""
    with _static_lock:
        if not _static:
            var = Path(tempfile.mkdtemp(prefix="sluice-static-"))
            atexit.register(shutil.rmtree, var, True)
            subprocess.run(
                [PYTHON, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                cwd=ROOT,
                env={**env, "SLUICE_VAR_DIR": str(var)},
                check=True,
                capture_output=True,
                timeout=180,
            )
            _static.append(var / "static")
        return _static[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def full_mode_urls() -> tuple[str, str]:
    """The PostgreSQL and Redis URLs of the environment, or a skip saying what is missing."""
    database = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not database.startswith(("postgres://", "postgresql://")):
        pytest.skip("full mode needs DATABASE_URL=postgres://... (CI sets it)")
    if not broker.startswith(("redis://", "amqp://")):
        pytest.skip("full mode needs CELERY_BROKER_URL=redis://... (CI sets it)")
    if not _reachable(database, 5432):
        pytest.skip(f"PostgreSQL at {urlsplit(database).netloc} is not reachable")
    if not _reachable(broker, 6379 if broker.startswith("redis") else 5672):
        pytest.skip(f"the broker at {urlsplit(broker).netloc} is not reachable")
    return database, broker


class _Database:
    """A fresh PostgreSQL database next to the one DATABASE_URL names, dropped afterwards."""

    def __init__(self, base_url: str) -> None:
        import psycopg

        parts = urlsplit(base_url)
        base = parts.path.lstrip("/") or "postgres"
        self.name = f"{base}_svc_{uuid.uuid4().hex[:10]}"
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))
        # The maintenance database always exists; the one DATABASE_URL names may not.
        self._admin = dict(
            dbname="postgres",
            user=parts.username or None,
            password=parts.password or None,
            host=parts.hostname or None,
            port=parts.port or 5432,
        )
        with psycopg.connect(**self._admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(**self._admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Process:
    """A child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("ab")
        # Its own process group, so a test can kill a worker with all its pool children.
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, process_group=0
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def children(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == self.pid:
                found.append(int(entry.name))
        return found

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)
        self.popen.wait(timeout=30)

    def stop(self, grace: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._log.close()


class Deployment:
    """One isolated Sluice: database, broker queue, var dir, web server, workers."""

    def __init__(
        self,
        root: Path,
        mode: str,
        *,
        database_url: str | None = None,
        broker_url: str | None = None,
    ) -> None:
        self.root = root
        self.mode = mode
        self.processes: list[Process] = []
        self.database: _Database | None = None
        self.calls = root / "adapter-calls.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            SLUICE_VAR_DIR=str(root / "var"),
            SLUICE_CELERY_QUEUE=f"sluice-test-{uuid.uuid4().hex[:10]}",
            # Each deployment has admission state of its own in a shared Redis.
            SLUICE_ADMISSION_KEY_PREFIX=f"sluice-test-{uuid.uuid4().hex[:10]}",
            SLUICE_ADMISSION_RECOVERY_GRACE_MS="200",
            SLUICE_ADAPTERS=self.adapters(latency_ms=20),
            PYTHONUNBUFFERED="1",
            # Plain HTTP on loopback, as the demo launcher allows itself.
            DJANGO_HTTPS="0",
            # These tests poll faster than any person; throttling has tests of its own.
            SLUICE_THROTTLE_USER="off",
            SLUICE_THROTTLE_WORKSPACE="off",
            SLUICE_THROTTLE_SUBMIT="off",
        )
        if mode == "full":
            # A test may bring servers of its own (tests/private_services.py) to stop and start.
            default_database, default_broker = full_mode_urls()
            self.database = _Database(database_url or default_database)
            env["DATABASE_URL"] = self.database.url
            env["CELERY_BROKER_URL"] = broker_url or default_broker
        self.env = env
        self.web_url = ""
        self.demo: dict[str, Any] = {}

    def adapters(self, *, latency_ms: float) -> str:
        spec = {"kind": "fake", "latencyMs": latency_ms, "callLog": str(self.calls)}
        return json.dumps({"fake": spec})

    # ------------------------------------------------------------------ processes

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
        result = subprocess.run(
            [PYTHON, *argv],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"{argv} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def setup(self) -> Deployment:
        self.demo = json.loads(
            self.run("-m", "config.cli", "demo-setup", "--json").splitlines()[-1]
        )
        return self

    def django(self, code: str) -> str:
        """Run Python with Django set up in this deployment (activations, row checks)."""
        return self.run("manage.py", "shell", "--no-imports", "-c", code)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.root / f"{name}.log"
        process = Process(name, [PYTHON, *argv], {**self.env, **(env or {})}, log)
        self.processes.append(process)
        return process

    def start_web(self, env: dict[str, str] | None = None) -> Process:
        # Static files as in production: collected, served by WhiteNoise (runserver serves
        # none itself with DEBUG off).
        var = Path({**self.env, **(env or {})}["SLUICE_VAR_DIR"])
        var.mkdir(parents=True, exist_ok=True)
        if not (var / "static").exists():
            (var / "static").symlink_to(collected_static(self.env), target_is_directory=True)
        port = free_port()
        name = f"web-{len(self.processes)}"
        web = self.start(name, ["manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"], env)
        self.web_url = f"http://127.0.0.1:{port}"
        self._wait(lambda: self._answers("/admin/login/"), 60, f"{name} did not answer", web)
        return web

    def start_worker(
        self, env: dict[str, str] | None = None, *, concurrency: int = 2, pool: str = "threads"
    ) -> Process:
        name = f"worker-{len(self.processes)}"
        argv = [
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--loglevel",
            "INFO",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--without-gossip",
            "--without-mingle",
            "--hostname",
            f"{name}-{uuid.uuid4().hex[:6]}@%h",
        ]
        worker = self.start(name, argv, env)
        self._wait(lambda: " ready." in worker.log(), 60, f"{name} did not start", worker)
        return worker

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        if self.database is not None:
            self.database.drop()

    # ------------------------------------------------------------------------ API

    def token(self, username: str = "demo-proposer") -> str:
        return next(u["token"] for u in self.demo["users"] if u["username"] == username)

    def api(self, method: str, path: str, *, user: str = "demo-proposer", **kwargs: Any) -> Any:
        headers = {"Authorization": f"Token {self.token(user)}"}
        return httpx.request(method, self.web_url + path, headers=headers, timeout=30, **kwargs)

    def submit(self, document: dict[str, Any], *, user: str = "demo-proposer") -> dict[str, Any]:
        response = self.api("POST", "/api/workspaces/demo/evaluations/", json=document, user=user)
        assert response.status_code == 201, response.text
        return response.json()

    def evaluation(self, run_id: str) -> dict[str, Any]:
        response = self.api("GET", f"/api/workspaces/demo/evaluations/{run_id}/")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_run(
        self, run_id: str, timeout: float = 90, *, load: bool = False, workspace: str = "demo"
    ) -> dict[str, Any]:
        kind = "load-runs" if load else "evaluations"
        path = f"/api/workspaces/{workspace}/{kind}/{run_id}/"
        last: dict[str, Any] = {}

        def finished() -> bool:
            nonlocal last
            last = self.api("GET", path).json()
            return last.get("status") in TERMINAL

        self._wait(finished, timeout, f"run {run_id} did not finish: {last}")
        return last

    def adapter_calls(self) -> list[dict[str, Any]]:
        if not self.calls.exists():
            return []
        return [json.loads(line) for line in self.calls.read_text().splitlines() if line]

    def _answers(self, path: str) -> bool:
        try:
            return httpx.get(self.web_url + path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        return "\n".join(f"==== {p.name}\n{p.log()[-6000:]}" for p in self.processes)

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        message: str,
        process: Process | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if process is not None and process.popen.poll() is not None:
                raise AssertionError(f"{message}: it exited\n{process.log()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"{message} within {timeout} s\n{self.logs()}")


@pytest.fixture(params=["embedded", "full"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def deployment(tmp_path: Path, mode: str) -> Iterator[Deployment]:
    """A migrated deployment with the demo set up; web server and workers are up to the test."""
    deployment = Deployment(tmp_path, mode)
    try:
        yield deployment.setup()
    finally:
        deployment.stop()


def wait_for(condition: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{message} within {timeout} s")


def admission_redis_env(deployment: Deployment) -> dict[str, str]:
    """Full mode shares admission through the broker's Redis; with RabbitMQ as the broker the
    admission Redis is named apart (CI's RabbitMQ pass), so full mode is always coordinated."""
    if deployment.mode != "full" or deployment.env["CELERY_BROKER_URL"].startswith("redis"):
        return {}
    url = os.environ.get("SLUICE_TEST_ADMISSION_REDIS_URL", "redis://127.0.0.1:6379/0")
    if not _reachable(url, 6379):
        pytest.skip(f"no Redis for deployment-wide admission at {url}")
    return {"SLUICE_ADMISSION_REDIS_URL": url}


def staged_provider_env(base_url: str, *, window_seconds: float) -> dict[str, str]:
    """A deployment's environment for staged-provider load runs: the demo's `fake` adapter and a
    `staged` OpenAI-compatible one at `base_url` (a loopback server), the latter the staged
    provider with a window of `window_seconds`."""
    return {
        "SLUICE_ADAPTERS": json.dumps(
            {
                "fake": {"kind": "fake", "latencyMs": 20},
                "staged": {
                    "kind": "openai-chat",
                    "baseUrl": base_url,
                    "capacity": {"concurrency": 4, "requestsPerMinute": 2400},
                },
            }
        ),
        "SLUICE_STAGED_PROVIDER": json.dumps(
            {"adapter": "staged", "model": "staged-model", "windowSeconds": window_seconds}
        ),
    }


def demo_provider_over_http(base_url: str) -> str:
    """`SLUICE_ADAPTERS` with the demo profile's provider, `fake`, as an OpenAI-compatible HTTP
    endpoint at `base_url` (a loopback server)."""
    return json.dumps({"fake": {"kind": "openai-chat", "baseUrl": base_url}})


# Adapters for a deployment whose provider breaks: every call to `fake` fails, so its breaker
# opens; `ghost` answers but is no provider of the demo profile.
BREAKING_ADAPTERS = json.dumps(
    {
        "fake": {"kind": "fake", "latencyMs": 5, "error": "server-error"},
        "ghost": {"kind": "fake", "latencyMs": 5},
    }
)


def request_with_unknown_provider(invocation_id: str) -> dict[str, Any]:
    """Six decisions of the example request and a seventh bound to `ghost`, which the demo
    profile does not know, under `invocation_id`."""
    from console.forms.runs import example_request

    document = example_request(6)
    document["invocationId"] = invocation_id
    document["ruleset"]["decisions"].append(
        {
            "id": "ghost-check",
            "prompt": "Is ${text} acceptable?",
            "allowedOutputs": ["yes", "no"],
            "binding": {"primary": {"adapter": "ghost", "model": "m"}},
        }
    )
    return document
