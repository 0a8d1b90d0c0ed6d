"""PostgreSQL stopped and frozen under two real workers: no accepted run is lost or stuck.

A private PostgreSQL server (tests/private_services.py; the shared one is never touched) holds
the deployment's database. Two Celery workers share admission through Redis and call a loopback
OpenAI-compatible provider that records every request; each prompt names its run and decision,
so "no call sent twice" is counted where the calls arrive.

- Stopped (`pg_ctl stop -m immediate`, every session killed) for longer than the stale window,
  then started again: the API answers a typed 503 meanwhile, both workers reconnect on their
  own, and every run ends with each decision sent at most once.
- Frozen (SIGSTOP on the postmaster and every backend) for longer than the stale window but
  shorter than the workers' connect timeout, then thawed: nothing failed, so nothing is
  redelivered. The sweepers must not judge the live
  workers' runs dead because a shared stall aged every heartbeat: every run completes on its
  first delivery and no call is sent twice. A request that needs a new connection meanwhile is
  answered 503 once the connect timeout passes, rather than hanging.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.private_services import PrivatePostgres
from tests.service.conftest import (
    TERMINAL,
    Deployment,
    demo_provider_over_http,
    full_mode_urls,
    wait_for,
)

pytestmark = pytest.mark.celery

DECISIONS = 3
STALE_SECONDS = 3.0
# Longer than the stale window: a heartbeat written just before the fault is "stale" after it.
OUTAGE_SECONDS = STALE_SECONDS + 1.5
CONNECT_TIMEOUT = 2
WORKER_CONNECT_TIMEOUT = 30
# Every run ends within this long after the database is back.
BOUND_SECONDS = 30.0


class Outage:
    """One deployment on a private PostgreSQL with two workers and a counting provider."""

    def __init__(self, root: Path) -> None:
        full_mode_urls()
        self.postgres = PrivatePostgres()
        self.provider = LoopbackServer().__enter__()
        self.provider.default = Reply(delay=0.3)
        # The web process's new connections give up after CONNECT_TIMEOUT rather than wait on a
        # frozen server; the workers' outlast the freeze, so theirs only wait (with a shorter
        # one, a write that needs a new connection fails and its run is given back and resumed,
        # as in the stop above).
        url = f"{self.postgres.url}?connect_timeout={WORKER_CONNECT_TIMEOUT}"
        self.deployment = Deployment(root, "full", database_url=url)
        self.deployment.env.update(
            SLUICE_ADAPTERS=demo_provider_over_http(self.provider.base_url),
            SLUICE_RUN_HEARTBEAT_SECONDS="0.5",
            SLUICE_DISPATCH_POLL_SECONDS="0.5",
            SLUICE_RUN_STALE_SECONDS=str(STALE_SECONDS),
            SLUICE_WORKER_SLOTS="3",
        )
        self.deployment.setup()
        assert self.deployment.database is not None
        web_url = self.deployment.database.url.replace(
            f"connect_timeout={WORKER_CONNECT_TIMEOUT}", f"connect_timeout={CONNECT_TIMEOUT}"
        )
        self.deployment.start_web({"DATABASE_URL": web_url})
        self.workers = [self.deployment.start_worker(), self.deployment.start_worker()]

    def close(self) -> None:
        try:
            self.deployment.stop()
        finally:
            self.provider.__exit__(None, None, None)
            self.postgres.destroy()

    # ------------------------------------------------------------------------- runs

    def submit(self, count: int) -> dict[str, str]:
        """Submit `count` evaluations; returns run id → tag (each tag appears in its prompts)."""
        runs = {}
        for index in range(count):
            tag = f"run-{index}-{uuid.uuid4().hex[:8]}"
            document = example_request(DECISIONS)
            document["input"] = {"text": tag}
            runs[self.deployment.submit(document)["id"]] = tag
        return runs

    def calls_for(self, runs: dict[str, str]) -> collections.Counter[str]:
        tags = set(runs.values())
        prompts = collections.Counter(
            request["body"]["messages"][1]["content"] for request in list(self.provider.requests)
        )
        return collections.Counter(
            {p: n for p, n in prompts.items() if p.split(" is ")[1].split(" ")[0] in tags}
        )

    def wait_all_terminal(self, runs: dict[str, str]) -> list[dict[str, Any]]:
        def done() -> bool:
            try:
                response = self.deployment.api(
                    "GET", "/api/workspaces/demo/evaluations/?page_size=500"
                )
                statuses = {run["id"]: run["status"] for run in response.json()["results"]}
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return all(statuses.get(run_id) in TERMINAL for run_id in runs)

        wait_for(done, BOUND_SECONDS, f"every run to end\n{self.deployment.logs()}")
        return [self.deployment.evaluation(run_id) for run_id in runs]

    def assert_sent_at_most_once(self, runs: dict[str, str]) -> collections.Counter[str]:
        calls = self.calls_for(runs)
        twice = {prompt: n for prompt, n in calls.items() if n > 1}
        assert not twice, f"calls sent more than once: {twice}"
        expected = {
            f"Question {i}: is {tag} acceptable?"
            for tag in runs.values()
            for i in range(1, DECISIONS + 1)
        }
        assert set(calls) <= expected
        return calls

    # --------------------------------------------------------------------- database

    def sql(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        assert self.deployment.database is not None
        with psycopg.connect(self.deployment.database.url, autocommit=True) as conn:
            return conn.execute(query, params or []).fetchall()

    def server_time(self) -> datetime:
        value: datetime = self.sql("SELECT clock_timestamp()")[0][0]
        return value

    def workers_beating_since(self, moment: datetime) -> int:
        """How many live workers wrote a heartbeat after `moment` (the database's clock)."""
        rows = self.sql(
            "SELECT count(*) FROM evaluator_workerprocess"
            " WHERE stopped_at IS NULL AND heartbeat_at > %s",
            [moment],
        )
        return int(rows[0][0])


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    setup = Outage(tmp_path_factory.mktemp("database-outage"))
    try:
        yield setup
    finally:
        setup.close()


def test_postgresql_stopped_mid_run_then_started_loses_no_run(outage: Outage) -> None:
    runs = outage.submit(8)
    wait_for(lambda: sum(outage.calls_for(runs).values()) >= 4, 30, "the first calls")

    outage.postgres.stop("immediate")
    stopped = time.monotonic()
    # Meanwhile the API answers a typed JSON 503, not an HTML error page or a traceback.
    down = outage.deployment.api("GET", "/api/workspaces/demo/evaluations/")
    assert down.status_code == 503, down.text
    assert down.headers["content-type"].startswith("application/json")
    assert down.json()["error"]["type"] == "database-unavailable"
    assert int(down.headers["Retry-After"]) > 0
    refused = outage.deployment.api(
        "POST", "/api/workspaces/demo/evaluations/", json=example_request(1)
    )
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "database-unavailable"
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
    outage.postgres.start()
    back = outage.server_time()

    settled = outage.wait_all_terminal(runs)
    for run in settled:
        assert run["status"] in {"completed", "execution-uncertain"}, run
        assert len(run["result"]["decisions"]) == DECISIONS, run
        # A call that may have gone out while the database died is recorded, never re-sent.
        for attempt in run["attempts"]:
            if attempt["outcome"] == "execution-uncertain":
                assert attempt["reason"] == "dispatch-unconfirmed", attempt
    calls = outage.assert_sent_at_most_once(runs)
    sent = {
        (runs[run["id"]], attempt["decisionId"])
        for run in settled
        for attempt in run["attempts"]
        if attempt["sent"]
    }
    # Every call the provider saw is one the runs account for.
    assert len(calls) == len(sent)
    # Both workers reconnected by themselves: each beats again and says so.
    wait_for(lambda: outage.workers_beating_since(back) == 2, 10, "both workers to beat again")
    for worker in outage.workers:
        assert worker.popen.poll() is None
        assert "database unreachable" in worker.log()
        assert "the database answers again" in worker.log()
    # Runs submitted after the outage run as usual.
    after = outage.submit(2)
    assert {run["status"] for run in outage.wait_all_terminal(after)} == {"completed"}
    assert outage.calls_for(after).total() == 2 * DECISIONS


def test_postgresql_frozen_mid_run_redelivers_nothing(outage: Outage) -> None:
    logged = [len(worker.log()) for worker in outage.workers]
    runs = outage.submit(8)
    wait_for(lambda: sum(outage.calls_for(runs).values()) >= 4, 30, "the first calls")

    frozen = outage.postgres.pause()
    paused = time.monotonic()
    try:
        # A request needing a new connection is refused once the connect timeout passes.
        down = outage.deployment.api("GET", "/api/workspaces/demo/evaluations/")
        assert down.status_code == 503, down.text
        assert down.json()["error"]["type"] == "database-unavailable"
        assert time.monotonic() - paused < CONNECT_TIMEOUT + 5
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - paused)))
    finally:
        outage.postgres.resume(frozen)

    settled = outage.wait_all_terminal(runs)
    # Nothing failed, only waited: no live worker's run was swept and run again.
    assert [run["status"] for run in settled] == ["completed"] * len(runs), settled
    assert [run["deliveries"] for run in settled] == [1] * len(runs)
    calls = outage.assert_sent_at_most_once(runs)
    assert calls.total() == len(runs) * DECISIONS
    for worker, offset in zip(outage.workers, logged, strict=True):
        assert worker.popen.poll() is None
        assert "back in the backlog" not in worker.log()[offset:]
