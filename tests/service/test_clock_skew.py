"""Liveness is judged on the database server's clock, whatever the workers' clocks say.

Two worker processes run with their wall clocks moved by libfaketime (Debian's `faketime`
package, through LD_PRELOAD): one 45 s ahead, one 45 s behind, both beside a loopback
OpenAI-compatible provider that counts the calls in flight, and a web process 45 s behind.
Heartbeats, claims, the sweepers' staleness test and the runs' creation times all use the
database's time, so neither worker's runs look dead to the other: nothing is swept, nothing is
delivered twice, the provider never sees more than its ceiling, and every time a run shows is
the real one.
A worker that really dies (SIGKILL, on what looks like another host, so only its heartbeat can
tell) still has its runs taken back within the stale window.
"""

from __future__ import annotations

import glob
import signal
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply
from tests.service.conftest import (
    Deployment,
    admission_redis_env,
    demo_provider_over_http,
    wait_for,
)

pytestmark = pytest.mark.celery

CONCURRENCY = 2
STALE_SECONDS = 3.0
POLL_SECONDS = 0.5

ACTIVATE = f"""
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-skew")
document["providers"]["fake"].update(concurrency={CONCURRENCY}, maxQueueWaitMs=120000)
print(demo_version_activate(document).kind)
"""


def _faketime(offset: str) -> dict[str, str]:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    assert found, "libfaketime is missing: apt-get install faketime (.ci/run installs it)"
    # Only the wall clock moves; monotonic clocks measure intervals and stay as they are.
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def _sql(deployment: Deployment, query: str, params: list[Any] | None = None) -> list[tuple]:
    import psycopg

    assert deployment.database is not None
    with psycopg.connect(deployment.database.url, autocommit=True) as conn:
        cursor = conn.execute(query, params or [])
        return cursor.fetchall() if cursor.description else []


def _submit(deployment: Deployment, runs: int, decisions: int, tag: str) -> list[str]:
    submitted = []
    for index in range(runs):
        document = example_request(decisions)
        document["input"]["text"] = f"{tag} {index}"
        for decision in document["ruleset"]["decisions"]:
            decision["binding"]["primary"]["timeoutMs"] = 120_000
        submitted.append(deployment.submit(document)["id"])
    return submitted


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_workers_45_s_ahead_and_behind_are_judged_by_the_database_clock(deployment):
    with LoopbackServer() as provider:
        provider.default = Reply(content="yes", delay=0.3)
        env = {
            "SLUICE_ADAPTERS": demo_provider_over_http(provider.base_url),
            "SLUICE_RUN_HEARTBEAT_SECONDS": "1",
            "SLUICE_RUN_STALE_SECONDS": str(STALE_SECONDS),
            "SLUICE_DISPATCH_POLL_SECONDS": str(POLL_SECONDS),
            # A killed worker's admission permits come back soon (its calls are short).
            "SLUICE_ADMISSION_LEASE_TTL_MS": "3000",
            "SLUICE_ADMISSION_HEARTBEAT_MS": "500",
            **admission_redis_env(deployment),
        }
        deployment.django(ACTIVATE)
        # The web process's clock is off too: the runs it creates are stamped by the database.
        deployment.start_web({**env, **_faketime("-45s")})
        ahead = deployment.start_worker({**env, **_faketime("+45s"), "SLUICE_WORKER_SLOTS": "2"})
        behind = deployment.start_worker({**env, **_faketime("-45s"), "SLUICE_WORKER_SLOTS": "2"})
        workers = dict(_sql(deployment, "SELECT pid, id FROM evaluator_workerprocess"))
        ahead_id, behind_id = workers[ahead.pid], workers[behind.pid]

        # Both workers run evaluations for a while, longer than the stale window.
        started = datetime.now(UTC)
        first = _submit(deployment, 12, 3, "skew")
        finished = [deployment.wait_run(run_id, timeout=120) for run_id in first]
        assert [run["status"] for run in finished] == ["completed"] * 12, finished
        assert [run["deliveries"] for run in finished] == [1] * 12
        claimants = {
            row[0] for row in _sql(deployment, "SELECT claimed_by FROM evaluator_evaluationrun")
        }
        assert {ahead_id, behind_id} <= claimants, "both workers should have run evaluations"
        for worker in (ahead, behind):
            assert "back in the backlog" not in worker.log()
            assert "claimed again" not in worker.log()
        assert provider.max_in_flight <= CONCURRENCY
        prompts = [r["body"]["messages"][-1]["content"] for r in provider.requests]
        assert len(prompts) == len(set(prompts)) == 36, "a decision reached the provider twice"
        # The times a run shows are the database's, not a skewed web process's or worker's.
        ended = datetime.now(UTC)
        for run in finished:
            shown = [
                datetime.fromisoformat(run[name].replace("Z", "+00:00"))
                for name in ("createdAt", "startedAt", "finishedAt")
            ]
            assert shown == sorted(shown), run
            for moment in shown:
                assert (moment - started).total_seconds() >= -2, run
                assert (moment - ended).total_seconds() <= 2, run

        # A worker that really dies: its runs are taken back within the stale window.
        provider.default = Reply(content="yes", delay=1.0)
        second = _submit(deployment, 6, 3, "dead")

        def held_by_ahead() -> list[str]:
            rows = _sql(
                deployment,
                "SELECT id FROM evaluator_evaluationrun WHERE status = 'running' "
                "AND claimed_by = %s",
                [ahead_id],
            )
            return [str(row[0]) for row in rows]

        wait_for(lambda: bool(held_by_ahead()), 60, "the ahead worker to claim a run")
        # As if it ran on another host: only its heartbeat can say it died.
        _sql(
            deployment,
            "UPDATE evaluator_workerprocess SET hostname = 'another-host' WHERE id = %s",
            [ahead_id],
        )
        ahead.kill_group(signal.SIGKILL)
        killed = time.monotonic()
        # What it held when it died (read after the kill: until then it may claim another).
        orphans = held_by_ahead()

        def taken_back() -> bool:
            rows = _sql(
                deployment,
                "SELECT count(*) FROM evaluator_evaluationrun WHERE id = ANY(%s::uuid[]) "
                "AND claimed_by = %s",
                [orphans, ahead_id],
            )
            return rows[0][0] == 0

        wait_for(taken_back, 30, "the dead worker's runs to be taken back")
        recovered = time.monotonic() - killed
        # Its last heartbeat is at most one beat old, then the stale window, then one poll.
        assert recovered <= 1.0 + STALE_SECONDS + POLL_SECONDS + 2.0, recovered
        ended = [deployment.wait_run(run_id, timeout=120) for run_id in second]
    print(
        f"figures: dead worker's runs taken back after {recovered:.1f} s; "
        f"calls in flight at most {provider.max_in_flight}"
    )

    assert all(run["status"] in ("completed", "execution-uncertain") for run in ended), ended
    redelivered = {run["id"] for run in ended if run["deliveries"] == 2}
    assert redelivered == set(orphans)
    assert provider.max_in_flight <= CONCURRENCY
    assert "back in the backlog" in behind.log()
