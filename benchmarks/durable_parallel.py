"""Durable parallel runs: what a receipt-backed evaluation costs at the scheduler ceiling.

Run:  DATABASE_URL=postgres://... CELERY_BROKER_URL=redis://... \\
      .venv/bin/python benchmarks/durable_parallel.py [--decisions 40] [--latency-ms 300]
      [--ceiling 8] [--repeat 3] [--no-trace] [--service-only | --engine-only]

1. Through the service (PostgreSQL + Redis, a real web server and worker, a loopback
   OpenAI-compatible provider answering after `--latency-ms`): one evaluation of `--decisions`
   decisions with `scheduler: {enabled: true, bindingConcurrency: --ceiling}` under a profile
   whose ceilings are all `--ceiling`, submitted through the API; submit-to-complete (seen by the
   client, and `finishedAt - createdAt` as the server recorded it) against the provider-bound
   ideal `ceil(decisions / ceiling) x latency`, the most calls the provider had at once, and the
   receipt writes per decision: the document writes (the receipt's final revision counts them)
   plus the slot writes, at most one per call (slots marked together share one). The worker is
   `benchmarks/traced_worker.py` (unless `--no-trace`), which notes when each phase begins and
   ends; the benchmark lines those notes up with what the client and the provider saw and prints
   where submit-to-complete went: before the first call (API, doorbell, claim, run start), in
   each call (admission, slot write, HTTP request, the provider, the answer, its record), between
   an answer and the next call on its permit, and after the last answer (receipt close, result
   write, the client noticing), each as median and p90 over the calls.
2. In this process, on a throwaway PostgreSQL database, the same evaluation through the engine
   with the database receipt store and a thread pool as a worker has, twice: slot writes on the
   pool's threads, and sent from the event loop on connections of its own (as a worker sends
   them); each after a first run that opens the connections. For each: how long each call
   waited for its slot to become durable before its adapter call (p50/p99), and writes per
   decision, slot writes and document writes counted apart. Then the floor of any durable write
   there: a bare single-row INSERT in autocommit, timed in a pool thread, awaited from the loop
   through the pool, and sent from the loop on its own connection.

Figures only; no bounds. Skips the service part when DATABASE_URL / CELERY_BROKER_URL do not
point at PostgreSQL and Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
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

import psycopg  # noqa: E402
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
            trace = Path(tmp) / "trace.jsonl"
            if args.trace:
                _start_traced_worker(deployment, trace)
            else:
                deployment.start_worker()
            # Warm the worker: connections to the database, Redis and the provider.
            deployment.wait_run(deployment.submit(_document(8, args.ceiling, "warm-up"))["id"])
            breakdowns: list[tuple[str, dict[str, list[float]]]] = []
            for attempt in range(args.repeat):
                load = _load_average()
                provider.max_in_flight = 0
                before = len(provider.requests)
                started = time.monotonic()
                submitted = deployment.submit(
                    _document(args.decisions, args.ceiling, f"bench {attempt}")
                )
                posted = time.monotonic()
                run, noticed = _wait_fast(deployment, submitted["id"])
                client_s = noticed - started
                if run["status"] != "completed":
                    print(deployment.logs()[-3000:], run["attempts"][:1])
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
                if args.trace:
                    marks = {"submit": started, "posted": posted, "noticed": noticed}
                    phases = _phases(
                        _events(trace, since=started), provider.requests[before:], marks, args
                    )
                    breakdowns.append((load, phases))
                    _print_phases([(load, phases)])
            if len(breakdowns) > 1:
                print("phase medians over the runs above:")
                _print_phases(breakdowns)
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
        # Per slot written (invocation, decision, attempt number), ms its write took in the
        # store's add_slots (the statement, as the loop saw it).
        self.add_slots_ms: dict[tuple[str, int, int], float] = {}

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        return await self.inner.load(key)

    async def create(self, key: ReceiptKey, document: Any) -> None:
        self.document_writes += 1
        await self.inner.create(key, document)

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        return await self.inner.claim(key)

    async def add_slots(self, key: ReceiptKey, slots: Any, *, claim: int) -> None:
        self.slot_writes += 1
        began = time.perf_counter()
        await self.inner.add_slots(key, slots, claim=claim)
        took = (time.perf_counter() - began) * 1000
        for slot in slots:
            self.add_slots_ms[key.invocation_id, slot["decisionIndex"], slot["number"]] = took

    async def update(
        self, key: ReceiptKey, document: Any, *, expected_revision: int, settled: Any = ()
    ) -> None:
        self.document_writes += 1
        await self.inner.update(key, document, expected_revision=expected_revision, settled=settled)


def _bare_commits(pool: ThreadPoolExecutor, count: int) -> dict[str, list[float]]:
    """Milliseconds per single-row INSERT in autocommit: on a pool thread, timed in the thread
    (the database's share) and awaited from an event loop (with the hops to the thread and back,
    as the pool's slot writes are); and sent from the loop itself on an async connection (as
    direct slot writes are)."""

    def insert() -> float:
        with connections["default"].cursor() as cursor:
            began = time.perf_counter()
            cursor.execute("INSERT INTO bench_commit (at) VALUES (now())")
            return (time.perf_counter() - began) * 1000

    async def awaited() -> dict[str, list[float]]:
        figures: dict[str, list[float]] = {
            "thread": [],
            "awaited": [],
            "direct": [],
            "no-flush": [],
        }
        for _ in range(count):
            began = time.perf_counter()
            figures["thread"].append(await in_database_thread(insert, pool)())
            figures["awaited"].append((time.perf_counter() - began) * 1000)
        params = connections["default"].get_connection_params()
        for name in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(name, None)
        async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as direct:
            # Interleaved with the same INSERT under synchronous_commit off (for this
            # comparison only; the store keeps it on): the difference is the WAL flush.
            for _ in range(count):
                for name, setting in (("direct", "on"), ("no-flush", "off")):
                    await direct.execute(f"SET synchronous_commit = {setting}")
                    began = time.perf_counter()
                    await direct.execute("INSERT INTO bench_commit (at) VALUES (now())")
                    figures[name].append((time.perf_counter() - began) * 1000)
        return figures

    def create() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit (id bigserial, at timestamptz)")

    pool.submit(create).result()
    return asyncio.run(awaited())


def _wait_fast(deployment: Deployment, run_id: str) -> tuple[dict[str, Any], float]:
    """The finished run, and when the client had it (`time.monotonic()`)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run = deployment.evaluation(run_id)
        if run["status"] not in ("queued", "running"):
            return run, time.monotonic()
        time.sleep(0.02)
    raise SystemExit(f"run {run_id} did not finish")


def _start_traced_worker(deployment: Deployment, trace: Path) -> None:
    """The worker `Deployment.start_worker` starts, with `benchmarks/traced_worker.py`'s notes."""
    argv = [
        str(Path(__file__).with_name("traced_worker.py")),
        "-A",
        "config",
        "worker",
        "--loglevel",
        "INFO",
        "--pool",
        "threads",
        "--concurrency",
        "2",
        "--without-gossip",
        "--without-mingle",
        "--hostname",
        "traced-worker@%h",
    ]
    worker = deployment.start("worker-traced", argv, {"SLUICE_BENCH_TRACE": str(trace)})
    deadline = time.monotonic() + 60
    while " ready." not in worker.log():
        if worker.popen.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the traced worker did not start:\n{worker.log()[-4000:]}")
        time.sleep(0.1)


def _events(trace: Path, *, since: float) -> list[dict[str, Any]]:
    """The worker's notes since `since`, once its result write is among them."""
    deadline = time.monotonic() + 5
    while True:
        events = []
        for line in trace.read_text().splitlines():
            if line:
                event = json.loads(line)
                if event["at"] >= since:
                    events.append(event)
        if any(e["event"] == "runs.run_finish.end" for e in events):
            return events
        if time.monotonic() > deadline:
            return events
        time.sleep(0.02)


def _first(events: list[dict[str, Any]], name: str, after: float = 0.0) -> float:
    found = [e["at"] for e in events if e["event"] == name and e["at"] >= after]
    return min(found, default=math.nan)


def _last(events: list[dict[str, Any]], name: str) -> float:
    return max((e["at"] for e in events if e["event"] == name), default=math.nan)


def _times(calls: dict[int, dict[str, float]], name: str) -> list[float]:
    return sorted(call[name] for call in calls.values() if name in call)


_QUESTION = re.compile(r"Question (\d+):")


def _phases(
    events: list[dict[str, Any]],
    requests: list[dict[str, Any]],
    marks: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    """Milliseconds per phase of one run through the service (a list per phase: one figure per
    run phase, one per call for call phases)."""
    ms: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        ms.setdefault(name, []).append(value * 1000)

    # Per decision (index), the notes of its (first and only) attempt, and its provider request.
    calls: dict[int, dict[str, float]] = {}
    for event in events:
        index = event.get("index")
        if event["event"].startswith("OpenAIChatAdapter.invoke"):
            index = int(event["decision"].rsplit("-", 1)[1]) - 1
        # A slot write belongs to every decision whose slot it holds.
        indexes = event.get("indexes", [] if index is None else [index])
        for each in indexes:
            calls.setdefault(each, {}).setdefault(event["event"], event["at"])
    for request in requests:
        prompt = request["body"]["messages"][-1]["content"]
        found = _QUESTION.search(prompt)
        if found is not None and "ended" in request:
            call = calls.setdefault(int(found.group(1)) - 1, {})
            call["provider.arrived"], call["provider.answered"] = request["at"], request["ended"]
    steps = [
        (
            "attempt start -> admission asked",
            "attempts.run_attempt.start",
            "SlotFreeingController.acquire.start",
        ),
        ("admission", "SlotFreeingController.acquire.start", "SlotFreeingController.acquire.end"),
        (
            "admitted -> slot write asked",
            "SlotFreeingController.acquire.end",
            "ReceiptJournal.mark_dispatch.start",
        ),
        ("slot write", "ReceiptJournal.mark_dispatch.start", "ReceiptJournal.mark_dispatch.end"),
        (
            "  of which gathering the wave",
            "ReceiptJournal.mark_dispatch.start",
            "DatabaseReceiptStore.add_slots.start",
        ),
        (
            "  of which the store's add_slots",
            "DatabaseReceiptStore.add_slots.start",
            "DatabaseReceiptStore.add_slots.end",
        ),
        (
            "  of which the loop picking it up",
            "DatabaseReceiptStore.add_slots.end",
            "ReceiptJournal.mark_dispatch.end",
        ),
        (
            "slot durable -> adapter called",
            "ReceiptJournal.mark_dispatch.end",
            "OpenAIChatAdapter.invoke.start",
        ),
        ("HTTP request out", "OpenAIChatAdapter.invoke.start", "provider.arrived"),
        ("provider", "provider.arrived", "provider.answered"),
        ("answer read", "provider.answered", "OpenAIChatAdapter.invoke.end"),
        ("release + record", "OpenAIChatAdapter.invoke.end", "attempts.run_attempt.end"),
        (
            "  of which the record",
            "ReceiptJournal.record_attempt.start",
            "ReceiptJournal.record_attempt.end",
        ),
        ("attempt start -> at provider", "attempts.run_attempt.start", "provider.arrived"),
    ]
    for call in calls.values():
        for name, begin, end in steps:
            if begin in call and end in call:
                add(name, call[end] - call[begin])
    # Between an answer and the next call on its permit: the k-th attempt to end hands its
    # permit to the (ceiling + k)-th attempt to start.
    ends = _times(calls, "attempts.run_attempt.end")
    starts = _times(calls, "attempts.run_attempt.start")
    for end, start in zip(ends, starts[args.ceiling :], strict=False):
        add("hand-over to the next decision", start - end)
    answered = _times(calls, "provider.answered")
    arrived = _times(calls, "provider.arrived")
    for end, start in zip(answered, arrived[args.ceiling :], strict=False):
        add("answer -> next call at provider", start - end)
    first_start = min(starts, default=math.nan)
    last_answer = max(answered, default=math.nan)
    wake = _first(events, "Runner.wake.start", marks["submit"])
    claimed = _first(events, "dispatch.runs_claim.end", wake)
    claim_asked = max(
        (
            e["at"]
            for e in events
            if e["event"] == "dispatch.runs_claim.start" and e["at"] <= claimed
        ),
        default=math.nan,
    )
    prepared = _first(events, "Runner._start.end", claimed)
    evaluating = _first(events, "execute.evaluate.start", claimed)
    opened = _first(events, "ReceiptJournal.open.end")
    evaluated = _last(events, "execute.evaluate.end")
    finished = _last(events, "runs.run_finish.end")
    run = [
        ("submit: POST answered", marks["submit"], marks["posted"]),
        ("POST answered -> doorbell at the worker", marks["posted"], wake),
        ("doorbell -> claim asked", wake, claim_asked),
        ("claim asked -> run claimed", claim_asked, claimed),
        ("claimed -> run prepared (boundary, plan)", claimed, prepared),
        ("prepared -> evaluation started", prepared, evaluating),
        ("evaluation started -> receipt open", evaluating, opened),
        ("receipt open -> first attempt", opened, first_start),
        ("first attempt -> first call at provider", first_start, min(arrived, default=math.nan)),
        ("first call -> last answer at provider", min(arrived, default=math.nan), last_answer),
        ("last answer -> evaluation returned", last_answer, evaluated),
        ("evaluation returned -> result written", evaluated, finished),
        ("result written -> client noticed", finished, marks["noticed"]),
        ("submit -> client noticed", marks["submit"], marks["noticed"]),
    ]
    for name, begin, end in run:
        add(name, end - begin)
    return ms


def _print_phases(breakdowns: list[tuple[str, dict[str, list[float]]]]) -> None:
    """One line per phase: median and p90 in ms (over calls, or over runs for run phases)."""
    loads = ", ".join(load.split()[0] for load, _ in breakdowns)
    print(f"  phases (ms; load average {loads}):")
    names: list[str] = []
    for _, phases in breakdowns:
        names.extend(name for name in phases if name not in names)
    for name in names:
        values = [v for _, phases in breakdowns for v in phases.get(name, []) if not math.isnan(v)]
        if not values:
            continue
        if len(values) <= len(breakdowns):
            figures = f"{statistics.median(values):8.1f}"
            if len(values) > 1:
                figures += f"  (runs: {', '.join(f'{v:.0f}' for v in values)})"
        else:
            figures = (
                f"{statistics.median(values):8.1f} median, {_percentile(values, 0.9):7.1f} p90, "
                f"{max(values):7.1f} max over {len(values)}"
            )
        print(f"    {name:<42} {figures}", flush=True)


def in_process(args: argparse.Namespace) -> None:
    """The engine with the database receipt store on real time: slot-write waits and writes,
    with slot writes on the pool's threads and sent from the loop (as a worker sends them)."""
    waits: list[float] = []
    dispatched: list[tuple[str, int, int]] = []  # the slot of each wait
    original = ReceiptJournal.mark_dispatch

    async def timed(self: ReceiptJournal, index: int, attempt: Any) -> None:
        began = time.perf_counter()
        await original(self, index, attempt)
        waits.append((time.perf_counter() - began) * 1000)
        dispatched.append((self._key.invocation_id, index, attempt.number))

    ReceiptJournal.mark_dispatch = timed  # type: ignore[method-assign]
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench-db")
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
    runs = iter(range(10**6))

    async def one(store: _CountingStore) -> tuple[float, tuple[int, int]]:
        registry = AdmissionRegistry(clock=SystemClock())
        registry.register(profile)
        request = DecisionEvaluationRequest.from_dict(
            {**_document(args.decisions, args.ceiling, "x"), "invocationId": f"bench-{next(runs)}"},
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
        wall = time.perf_counter() - began
        assert result.status == "completed", result.status
        return wall, (store.slot_writes - before[0], store.document_writes - before[1])

    async def runs_of(
        direct: int,
    ) -> tuple[list[float], list[float], list[tuple[int, int]], list[float]]:
        store = _CountingStore(DatabaseReceiptStore(pool, direct_slots=direct))
        try:
            # A first run opens the connections (pool threads, loop connections); not counted.
            await one(store)
            del waits[:], dispatched[:]
            walls, writes = [], []
            for _ in range(args.repeat):
                wall, counted = await one(store)
                walls.append(wall)
                writes.append(counted)
            return list(waits), walls, writes, [store.add_slots_ms[slot] for slot in dispatched]
        finally:
            await store.inner.aclose()

    ideal = math.ceil(args.decisions / args.ceiling) * args.latency_ms / 1000
    try:
        for label, direct in (("pool threads", 0), ("from the loop", args.ceiling)):
            load = _load_average()
            slot_waits, walls, writes, statement = asyncio.run(runs_of(direct))
            rest = [wait - ms for wait, ms in zip(slot_waits, statement, strict=True)]
            slot_writes = statistics.median(w[0] for w in writes)
            document_writes = statistics.median(w[1] for w in writes)
            print(
                f"engine + PostgreSQL receipts, slot writes {label}, {args.decisions} decisions "
                f"x {args.latency_ms:g} ms, ceiling {args.ceiling} (load average {load}): wall "
                f"{statistics.median(walls):.3f} s vs ideal {ideal:.2f} s; slot durable before "
                f"the call p50 {_percentile(slot_waits, 0.5):.2f} ms, p99 "
                f"{_percentile(slot_waits, 0.99):.2f} ms ({len(slot_waits)} dispatches: the "
                f"store's add_slots p50 {_percentile(statement, 0.5):.2f} ms, p99 "
                f"{_percentile(statement, 0.99):.2f} ms; gathering the wave and the loop "
                f"picking the answer up p50 {_percentile(rest, 0.5):.2f} ms); "
                f"{slot_writes:g} slot writes + {document_writes:g} document writes = "
                f"{(slot_writes + document_writes) / args.decisions:.2f} receipt writes per "
                "decision",
                flush=True,
            )
        load = _load_average()
        bare = _bare_commits(pool, 200)
        figures = "; ".join(
            f"{label} p50 {_percentile(bare[name], 0.5):.2f} ms, "
            f"p99 {_percentile(bare[name], 0.99):.2f} ms"
            for name, label in (
                ("thread", "in a pool thread"),
                ("awaited", "awaited from the loop"),
                ("direct", "from the loop on its own connection"),
                ("no-flush", "the same without waiting for the WAL flush"),
            )
        )
        print(f"bare single-row commit (load average {load}): {figures}", flush=True)
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


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--ceiling", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-trace", dest="trace", action="store_false", help="an untraced worker, no phases"
    )
    parser.add_argument(
        "--service-only", action="store_true", help="skip the in-process engine part"
    )
    parser.add_argument(
        "--engine-only", action="store_true", help="skip the part through the service"
    )
    args = parser.parse_args()
    if not args.service_only:
        with throwaway_database():
            in_process(args)
    if not args.engine_only:
        through_the_service(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
