"""What progress and cancel cost: reading a running run's page, one cancel check, cancel latency.

Run:  DATABASE_URL=postgres://root@127.0.0.1:5432/sluice .venv/bin/python benchmarks/run_progress.py

It creates a throwaway test database next to the one DATABASE_URL names (SQLite when unset) and
measures, through Django's test client and the real ORM:

- `GET /api/workspaces/{key}/evaluations/{id}/` of a running run whose receipt holds N decisions,
  half of them done (the page reads the receipt: progress and attempts so far);
- one periodic cancel check (evaluator/worker/cancel_watch.py) with N runs watched on the loop;
- the time from a cancel request to the run's signal firing, with the default check interval.

Figures only; no bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
import uuid

from django_setup import configure, throwaway_database

configure(SLUICE_THROTTLE_USER="off", SLUICE_THROTTLE_WORKSPACE="off")

from asgiref.sync import sync_to_async  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import (  # noqa: E402
    CaptureQueriesContext,
)
from django.utils import timezone  # noqa: E402

from admission.models import Workspace  # noqa: E402
from console.forms.runs import example_attempt, example_request  # noqa: E402
from evaluator.models import EvaluationRun, Receipt  # noqa: E402
from evaluator.worker import cancel_watch  # noqa: E402

EVIDENCE = {
    "decision": "admit",
    "reason": "admitted",
    "queueDelayMs": 3.2,
    "active": 2,
    "queued": 0,
    "estimatedTokens": 268,
    "estimatedCostUsd": None,
    "retryPressure": 0,
    "breakerState": "closed",
}


def _percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return statistics.median(values), values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]


def _run(workspace: Workspace, user: object, decisions: int) -> EvaluationRun:
    return EvaluationRun.objects.create(
        workspace=workspace,
        submitted_by=user,
        principal_id="bench-reader",
        invocation_id=uuid.uuid4().hex,
        document=example_request(decisions),
        ruleset_id="demo-screening",
        ruleset_digest="sha256:" + "0" * 64,
        decision_count=decisions,
        status="running",
    )


def running_receipt(run: EvaluationRun, decisions: int) -> None:
    done = decisions // 2
    entries = []
    for index in range(decisions):
        attempts = []
        if index < done:
            attempts.append(
                example_attempt(
                    started_ms=index * 300.0,
                    ended_ms=index * 300.0 + 298.0,
                    evidence=EVIDENCE,
                    tokens=10,
                )
            )
        entries.append(
            {
                "decisionId": f"check-{index + 1}",
                "status": "succeeded" if index < done else None,
                "output": "yes" if index < done else None,
                "attempts": attempts,
            }
        )
    document = {
        "schema": "decision-evaluation-receipt/v2",
        "invocationId": run.invocation_id,
        "rulesetId": run.ruleset_id,
        "rulesetDigest": run.ruleset_digest,
        "state": "running",
        "revision": 2 * done + 2,
        "pendingDispatch": {
            "decisionIndex": done,
            "targetIndex": 0,
            "adapterId": "fake",
            "model": "demo-model",
            "number": 1,
            "startedMs": done * 300.0,
            "evidence": EVIDENCE,
            "atEpochMs": 0.0,
        },
        "decisions": entries,
        "createdAtEpochMs": 0.0,
        "updatedAtEpochMs": 0.0,
    }
    Receipt.objects.create(
        workspace_id=run.workspace.key,
        principal_id=run.principal_id,
        invocation_id=run.invocation_id,
        ruleset_id=run.ruleset_id,
        ruleset_digest=run.ruleset_digest,
        state="running",
        revision=document["revision"],
        document=document,
    )


def page_figures(client: Client, run: EvaluationRun, repeat: int) -> tuple[float, float, int]:
    url = f"/api/workspaces/bench/evaluations/{run.pk}/"
    client.get(url)
    timings, queries = [], 0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}")
        queries = max(queries, len(captured.captured_queries))
    p50, p95 = _percentiles(timings)
    return p50, p95, queries


async def check_figures(run_ids: list[uuid.UUID], repeat: int) -> tuple[float, float]:
    await cancel_watch.cancel_requested(run_ids)
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        await cancel_watch.cancel_requested(run_ids)
        timings.append((time.perf_counter() - started) * 1000)
    return _percentiles(timings)


def _request_cancel(run_id: uuid.UUID) -> None:
    EvaluationRun.objects.filter(pk=run_id).update(cancel_requested_at=timezone.now())


async def cancel_latencies(runs: list[EvaluationRun]) -> list[float]:
    """Seconds from a cancel request (at a random moment) to the run's signal firing."""
    latencies = []
    for run in runs:
        run_id = run.pk
        async with cancel_watch.run_cancel_signal("bench", run.invocation_id) as signal:
            # A request lands at an arbitrary point of the check interval.
            await asyncio.sleep(secrets.randbelow(1000) / 1000 * cancel_watch.check_interval())
            asked = time.perf_counter()
            await sync_to_async(_request_cancel, thread_sensitive=True)(run_id)
            await signal
            latencies.append(time.perf_counter() - asked)
    await sync_to_async(connections.close_all, thread_sensitive=True)()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()

    with throwaway_database() as database:
        reader = get_user_model().objects.create_user("bench-reader")
        workspace = Workspace.objects.create(key="bench", name="Benchmark")
        workspace.members.add(reader)
        client = Client()
        client.force_login(reader)
        print(f"run progress on {connection.vendor} ({database}), {args.repeat} requests per row")
        print(f"{'running run page':<28}{'p50 ms':>10}{'p95 ms':>10}{'queries':>9}")
        for decisions in (10, 100, 1000):
            run = _run(workspace, reader, decisions)
            running_receipt(run, decisions)
            p50, p95, queries = page_figures(client, run, args.repeat)
            label = f"{decisions} decisions, half done"
            print(f"{label:<28}{p50:>10.2f}{p95:>10.2f}{queries:>9}")

        print(f"\n{'one cancel check':<28}{'p50 ms':>10}{'p95 ms':>10}")
        watched = [_run(workspace, reader, 1).pk for _ in range(512)]
        for count in (1, 64, 512):
            p50, p95 = asyncio.run(check_figures(watched[:count], args.repeat))
            print(f"{f'{count} runs watched':<28}{p50:>10.2f}{p95:>10.2f}")

        runs = [_run(workspace, reader, 1) for _ in range(args.cancels)]
        latencies = asyncio.run(cancel_latencies(runs))
        p50, p95 = _percentiles(latencies)
        print(
            f"\ncancel request → signal fired, check every {cancel_watch.check_interval():g} s, "
            f"{len(latencies)} runs: p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(latencies):.2f} s"
        )


if __name__ == "__main__":
    main()
