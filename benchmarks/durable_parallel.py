"""Durable parallel runs: what a receipt-backed evaluation costs at the scheduler ceiling.

Run:  DATABASE_URL=postgres://... CELERY_BROKER_URL=redis://... \\
      .venv/bin/python benchmarks/durable_parallel.py [--decisions 40] [--latency-ms 300]
      [--ceiling 8] [--repeat 3]

1. Through the service (PostgreSQL + Redis, a real web server and worker, a loopback
   OpenAI-compatible provider answering after `--latency-ms`): one evaluation of `--decisions`
   decisions with `scheduler: {enabled: true, bindingConcurrency: --ceiling}` under a profile
   whose ceilings are all `--ceiling`, submitted through the API; submit-to-complete (seen by the
   client, and `finishedAt - createdAt` as the server recorded it) against the provider-bound
   ideal `ceil(decisions / ceiling) x latency`, the most calls the provider had at once, and the
   receipt writes per decision: the document writes (the receipt's final revision counts them)
   plus the slot writes, at most one per call (slots marked together share one).
2. In this process, on a throwaway PostgreSQL database, the same evaluation through the engine
   with the database receipt store and a thread pool as a worker has: how long each call waited
   for its slot to become durable before its adapter call (p50/p99), the same for a bare
   single-row INSERT in autocommit on the same database (the floor of any durable write there),
   and writes per decision, slot writes and document writes counted apart.

Figures only; no bounds. Skips the service part when DATABASE_URL / CELERY_BROKER_URL do not
point at PostgreSQL and Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django_setup import (
    activate_profile_script,
    configure,
    epoch_seconds,
    service_deployment,
    throwaway_database,
)

configure()
logging.getLogger("httpx").setLevel(logging.WARNING)

from django.db import connections  # noqa: E402

from admission.core import AdmissionRegistry, Profile, SystemClock  # noqa: E402
from console.forms.runs import example_request  # noqa: E402
from evaluator.engine.adapters import FakeAdapter, FakeStep  # noqa: E402
from evaluator.engine.invocation import DecisionEvaluationRequest  # noqa: E402
from evaluator.engine.receipts import ReceiptJournal, ReceiptKey  # noqa: E402
from evaluator.engine.scheduler import evaluate_decision_ruleset  # noqa: E402
from evaluator.worker.receipts_db import DatabaseReceiptStore, in_database_thread  # noqa: E402
from tests.evaluator.loopback import LoopbackServer, Reply  # noqa: E402
from tests.service.conftest import Deployment  # noqa: E402

RECEIPT_REVISION = """
from evaluator.models import EvaluationRun, Receipt
run = EvaluationRun.objects.get(pk="{run_id}")
receipt = Receipt.objects.get(workspace_id="demo", invocation_id=run.invocation_id)
print(receipt.revision, receipt.document["maxPendingDispatches"])
"""


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def _document(decisions: int, ceiling: int, tag: str) -> dict[str, Any]:
    document = example_request(decisions)
    document["input"]["text"] = tag
    document["scheduler"] = {"enabled": True, "bindingConcurrency": ceiling}
    return document


def through_the_service(args: argparse.Namespace) -> None:
    ideal = math.ceil(args.decisions / args.ceiling) * args.latency_ms / 1000
    with LoopbackServer() as provider, tempfile.TemporaryDirectory(prefix="sluice-dur-") as tmp:
        provider.default = Reply(delay=args.latency_ms / 1000)
        deployment = service_deployment(tmp, "full", provider, name="service")
        if deployment is None:
            return
        try:
            deployment.setup()
            ceiling = {
                "concurrency": args.ceiling,
                "requestsPerMinute": 10**6,
                "maxQueueLength": 10000,
            }
            deployment.django(activate_profile_script("bench-ceiling", ceiling))
            deployment.start_web()
            deployment.start_worker()
            # Warm the worker: connections to the database, Redis and the provider.
            deployment.wait_run(deployment.submit(_document(8, args.ceiling, "warm-up"))["id"])
            for attempt in range(args.repeat):
                load = _load_average()
                provider.max_in_flight = 0
                before = len(provider.requests)
                started = time.monotonic()
                submitted = deployment.submit(
                    _document(args.decisions, args.ceiling, f"bench {attempt}")
                )
                run = _wait_fast(deployment, submitted["id"])
                client_s = time.monotonic() - started
                server_s = epoch_seconds(run["finishedAt"]) - epoch_seconds(run["createdAt"])
                revision, most = deployment.django(
                    RECEIPT_REVISION.format(run_id=run["id"])
                ).split()
                calls = len(provider.requests) - before
                claimed_s = epoch_seconds(run["startedAt"]) - epoch_seconds(run["createdAt"])
                spans = [(a["startedMs"], a["endedMs"]) for a in run["attempts"]]
                calls_s = (max(end for _, end in spans) - min(s for s, _ in spans)) / 1000
                waves = sorted(start for start, _ in spans)[:: args.ceiling]
                arrivals = sorted(r["at"] for r in provider.requests[before:])
                at_provider = [(t - arrivals[0]) * 1000 for t in arrivals[:: args.ceiling]]
                writes = int(revision) + calls
                print(
                    f"service, {args.decisions} decisions x {args.latency_ms:g} ms, ceiling "
                    f"{args.ceiling} (load average {load}): submit→complete {client_s:5.2f} s "
                    f"(client), {server_s:5.2f} s (server) vs ideal {ideal:.2f} s = "
                    f"x{server_s / ideal:.2f}; {run['status']}, {calls} calls, at most "
                    f"{provider.max_in_flight} at the provider, receipt slots at most {most}; "
                    f"{int(revision)} document writes + at most {calls} slot writes = at most "
                    f"{writes / args.decisions:.2f} receipt writes per decision",
                    flush=True,
                )
                print(
                    f"  of which: submit→claimed {claimed_s:.2f} s, first call→last answer "
                    f"{calls_s:.2f} s, waves started at "
                    f"{', '.join(f'{w:.0f}' for w in waves)} ms (at the provider "
                    f"{', '.join(f'{w:.0f}' for w in at_provider)} ms)",
                    flush=True,
                )
        finally:
            deployment.stop()


def _load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class _CountingStore:
    """The database store, counting slot writes and document writes."""

    def __init__(self, inner: DatabaseReceiptStore) -> None:
        self.inner = inner
        self.slot_writes = 0
        self.document_writes = 0

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        return await self.inner.load(key)

    async def create(self, key: ReceiptKey, document: Any) -> None:
        self.document_writes += 1
        await self.inner.create(key, document)

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        return await self.inner.claim(key)

    async def add_slots(self, key: ReceiptKey, slots: Any, *, claim: int) -> None:
        self.slot_writes += 1
        await self.inner.add_slots(key, slots, claim=claim)

    async def update(
        self, key: ReceiptKey, document: Any, *, expected_revision: int, settled: Any = ()
    ) -> None:
        self.document_writes += 1
        await self.inner.update(key, document, expected_revision=expected_revision, settled=settled)


def _bare_commits(pool: ThreadPoolExecutor, count: int) -> tuple[list[float], list[float]]:
    """Milliseconds per single-row INSERT in autocommit on a pool thread, as slots are: timed in
    the thread (the database's share), and awaited from an event loop (with the hops to the
    thread and back, as a slot write is)."""

    def insert() -> float:
        with connections["default"].cursor() as cursor:
            began = time.perf_counter()
            cursor.execute("INSERT INTO bench_commit (at) VALUES (now())")
            return (time.perf_counter() - began) * 1000

    async def awaited() -> tuple[list[float], list[float]]:
        inside, outside = [], []
        for _ in range(count):
            began = time.perf_counter()
            inside.append(await in_database_thread(insert, pool)())
            outside.append((time.perf_counter() - began) * 1000)
        return inside, outside

    def create() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit (id bigserial, at timestamptz)")

    pool.submit(create).result()
    return asyncio.run(awaited())


def _wait_fast(deployment: Deployment, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run = deployment.evaluation(run_id)
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.02)
    raise SystemExit(f"run {run_id} did not finish")


def in_process(args: argparse.Namespace) -> None:
    """The engine with the database store on real time: slot-write waits and writes."""
    waits: list[float] = []
    original = ReceiptJournal.mark_dispatch

    async def timed(self: ReceiptJournal, index: int, attempt: Any) -> None:
        began = time.perf_counter()
        await original(self, index, attempt)
        waits.append((time.perf_counter() - began) * 1000)

    ReceiptJournal.mark_dispatch = timed  # type: ignore[method-assign]
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench-db")
    store = _CountingStore(DatabaseReceiptStore(pool))
    limits = {"concurrency": args.ceiling, "requestsPerMinute": 10**6, "maxQueueLength": 10000}
    profile = Profile.from_dict(
        {
            "profileVersion": "bench",
            "workspace": dict(limits),
            "providers": {"fake": dict(limits)},
            "principals": {"bench-principal": dict(limits)},
        },
        workspace_id="bench",
    )
    writes: list[tuple[int, int]] = []
    walls: list[float] = []

    async def one(index: int) -> None:
        registry = AdmissionRegistry(clock=SystemClock())
        registry.register(profile)
        request = DecisionEvaluationRequest.from_dict(
            {**_document(args.decisions, args.ceiling, "x"), "invocationId": f"bench-{index}"},
            principal_id="bench-principal",
            workspace_id="bench",
        )
        before = (store.slot_writes, store.document_writes)
        began = time.perf_counter()
        result = await evaluate_decision_ruleset(
            request,
            registry=registry,
            adapters={"fake": FakeAdapter(default=FakeStep(latency_ms=args.latency_ms))},
            receipt_store=store,
        )
        walls.append(time.perf_counter() - began)
        assert result.status == "completed", result.status
        writes.append((store.slot_writes - before[0], store.document_writes - before[1]))

    load = _load_average()
    try:
        for index in range(args.repeat):
            asyncio.run(one(index))
        bare, bare_awaited = _bare_commits(pool, 200)
    finally:
        # Every pool thread closes its own connection (the barrier puts one task on each).
        barrier = threading.Barrier(8)

        def close() -> None:
            barrier.wait(10)
            connections.close_all()

        for future in [pool.submit(close) for _ in range(8)]:
            future.result()
        pool.shutdown()
        ReceiptJournal.mark_dispatch = original  # type: ignore[method-assign]
    ideal = math.ceil(args.decisions / args.ceiling) * args.latency_ms / 1000
    slot_writes = statistics.median(w[0] for w in writes)
    document_writes = statistics.median(w[1] for w in writes)
    print(
        f"engine + PostgreSQL receipts, {args.decisions} decisions x {args.latency_ms:g} ms, "
        f"ceiling {args.ceiling} (load average {load}): wall {statistics.median(walls):.3f} s "
        f"vs ideal {ideal:.2f} s; slot durable before the call p50 "
        f"{_percentile(waits, 0.5):.2f} ms, p99 {_percentile(waits, 0.99):.2f} ms "
        f"({len(waits)} dispatches); bare single-row commit p50 {_percentile(bare, 0.5):.2f} ms, "
        f"p99 {_percentile(bare, 0.99):.2f} ms (awaited from the loop: p50 "
        f"{_percentile(bare_awaited, 0.5):.2f} ms, p99 {_percentile(bare_awaited, 0.99):.2f} ms); "
        f"{slot_writes:g} slot writes + "
        f"{document_writes:g} document writes = "
        f"{(slot_writes + document_writes) / args.decisions:.2f} receipt writes per decision",
        flush=True,
    )


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--ceiling", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with throwaway_database():
        in_process(args)
    through_the_service(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
