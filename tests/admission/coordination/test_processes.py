"""Real processes against a real Redis and a loopback HTTP provider that counts what reaches it.

Each process runs `driver.py`: coordinated admission in front of real HTTP calls. The provider
server records every request and its high-water mark of requests in flight, so a limit is
checked where it matters, at the provider.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from admission.coordination.clients import sync_client
from tests.admission.coordination.conftest import _reachable
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivateRedis

ROOT = Path(__file__).resolve().parents[3]
# A round trip may take two seconds: on a loaded CI machine a shorter budget refuses decisions
# as coordination-unavailable, which the sharing test counts as a failure. (A stopped Redis
# refuses connections at once, so the restart test sees its refusals as soon as before.)
SETTINGS = {
    "lease_ttl_ms": 1500,
    "heartbeat_ms": 100,
    "recovery_grace_ms": 500,
    "timeout_ms": 2000,
}


def document(provider: dict[str, Any], version: str = "procs-v1") -> dict[str, Any]:
    """The drivers' profile: wide workspace and principal limits, `provider` for `llm`."""
    return {
        "profileVersion": version,
        "workspace": {"concurrency": 50},
        "providers": {"llm": provider},
        "principals": {"alice": {"concurrency": 50}, "bob": {"concurrency": 50}},
    }


class Drivers:
    """Driver processes of one test, sharing a key prefix, a profile and a provider."""

    def __init__(self, tmp: Path, url: str, base_url: str, profile: dict[str, Any]) -> None:
        self.tmp = tmp
        self.url = url
        self.base_url = base_url
        self.profile = profile
        self.prefix = f"procs{uuid.uuid4().hex[:10]}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.outputs: list[Path] = []

    def start(self, **config: Any) -> tuple[subprocess.Popen[bytes], Path]:
        index = len(self.processes)
        out = self.tmp / f"driver-{index}.jsonl"
        path = self.tmp / f"driver-{index}.json"
        path.write_text(
            json.dumps(
                {
                    "url": self.url,
                    "prefix": self.prefix,
                    "settings": SETTINGS,
                    "profile": self.profile,
                    "workspace": "ws",
                    "sequence": 1,
                    "principal": "alice",
                    "provider": "llm",
                    "base_url": self.base_url,
                    "concurrency": 2,
                    "count": 10_000,
                    "seconds": 10,
                    "out": str(out),
                    **config,
                }
            )
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.admission.coordination.driver", str(path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.processes.append(process)
        self.outputs.append(out)
        return process, out

    def lines(self, index: int | None = None) -> list[dict[str, Any]]:
        paths = self.outputs if index is None else [self.outputs[index]]
        found = []
        for path in paths:
            if path.exists():
                found += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return found

    def wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # Where is it stuck? The driver prints every task's stack on SIGUSR1.
                process.send_signal(signal.SIGUSR1)
                time.sleep(1)
                raise
            assert code == 0

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.02)


@pytest.fixture
def provider() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server


def _drivers(tmp_path: Path, url: str, provider: LoopbackServer, limits: dict[str, Any]) -> Drivers:
    if not _reachable(url):
        pytest.skip(f"needs Redis at {url}")
    return Drivers(tmp_path, url, provider.base_url, document(limits))


def test_two_processes_share_one_concurrency_and_one_rate(
    tmp_path: Path, provider: LoopbackServer, shared_url: str
) -> None:
    provider.default = Reply(delay=0.2)
    drivers = _drivers(
        tmp_path,
        shared_url,
        provider,
        {"concurrency": 2, "requestsPerMinute": 30, "maxQueueWaitMs": 1500},
    )
    started = time.monotonic()
    try:
        for _ in range(2):
            drivers.start(concurrency=4, seconds=6)
        drivers.wait()
    finally:
        drivers.stop()
    elapsed = time.monotonic() - started
    lines = drivers.lines()
    admitted = [line for line in lines if line["decision"] == "admit"]
    # Two processes with four callers each never had more than two calls at the provider.
    assert provider.max_in_flight == 2
    assert all(line["active"] <= 2 for line in admitted)
    # One bucket for the deployment: 30 at once, then 0.5 a second.
    assert len(provider.requests) == len(admitted)
    assert 30 <= len(provider.requests) <= 30 + elapsed * 0.5 + 1
    reasons = {line["reason"] for line in lines if line["decision"] == "reject"}
    assert reasons <= {"queue-timeout", "queue-full"}, reasons


def test_permits_of_a_killed_process_come_back_within_the_lease(
    tmp_path: Path, provider: LoopbackServer, shared_url: str
) -> None:
    hold = threading.Event()
    provider.replies.append(Reply(hold=hold))
    drivers = _drivers(tmp_path, shared_url, provider, {"concurrency": 1})
    try:
        holder, _ = drivers.start(concurrency=1, count=1)
        assert provider.received.acquire(timeout=30), "the holder's call never arrived"
        drivers.start(principal="bob", concurrency=1, count=1, deadline_ms=20_000)
        wait_for(lambda: _waiters(drivers) == 1, 30, "the second process did not queue")
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        assert provider.received.acquire(timeout=15), "the waiting call never went out"
        back_after = time.monotonic() - killed
        drivers.processes[1].wait(timeout=30)
    finally:
        hold.set()
        drivers.stop()
    # The dead holder renewed nothing: its permit came back when its lease lapsed, not before.
    lease_s = SETTINGS["lease_ttl_ms"] / 1000
    assert lease_s - 2 * SETTINGS["heartbeat_ms"] / 1000 <= back_after <= lease_s + 1.0
    # The killed process's own request is still open at the provider (nobody can withdraw
    # it); besides it, one call at a time.
    assert provider.max_in_flight == 2
    assert [line["decision"] for line in drivers.lines(1)] == ["admit", "done"]


def _waiters(drivers: Drivers) -> int:
    client = sync_client(drivers.url)
    return int(client.hlen(f"{drivers.prefix}:{{ws}}:W"))


def test_redis_restart_refuses_while_down_and_never_overruns(
    tmp_path: Path, provider: LoopbackServer, private_redis: PrivateRedis
) -> None:
    provider.default = Reply(delay=0.1)
    drivers = _drivers(
        tmp_path, private_redis.url, provider, {"concurrency": 2, "maxQueueWaitMs": 800}
    )
    try:
        for _ in range(2):
            drivers.start(concurrency=3, seconds=9)
        wait_for(lambda: len(provider.requests) >= 10, 30, "calls did not start")
        private_redis.stop()
        stopped = time.time()
        wait_for(
            lambda: all(
                sum(
                    line.get("reason") == "coordination-unavailable" and line["at"] > stopped + 0.3
                    for line in drivers.lines(i)
                )
                >= 3
                for i in range(2)
            ),
            30,
            "the processes did not refuse while Redis was down",
        )
        before_restart = len(provider.requests)
        private_redis.start()
        restarted = time.time()
        wait_for(
            lambda: len(provider.requests) >= before_restart + 10, 30, "admission did not resume"
        )
        drivers.wait(timeout=60)
    finally:
        drivers.stop()
    lines = drivers.lines()
    down = [line for line in lines if stopped + 0.3 < line["at"] < restarted]
    assert down and {line["decision"] for line in down} <= {"reject", "done", "aborted"}
    # Refused with the typed reason (a waiter queued before the outage may time out instead).
    reasons = {line["reason"] for line in down if line["decision"] == "reject"}
    assert "coordination-unavailable" in reasons and reasons <= {
        "coordination-unavailable",
        "queue-timeout",
    }
    assert any(line["decision"] == "admit" and line["at"] > restarted for line in lines)
    # Never more calls at the provider than the shared limit, before, during or after.
    assert provider.max_in_flight <= 2
