"""Service benchmark: evaluations per second through a real web server and Celery workers.

Run with `python benchmarks/service.py [--evaluations 300] [--decisions 5] [--latency-ms 300]
[--workers 1,2] [--modes full] [--limits wide|demo] [--provider-concurrency N]`. The provider
is a loopback OpenAI-compatible server answering every call after `--latency-ms`; each
evaluation has `--decisions` decisions. `--limits demo` keeps the demo profile's admission
limits (a principal may have 2 calls in flight); `wide` (the default) activates a profile that
lets every call through at once (concurrency 256 at every level), so the figures show what the
workers do, not what admission allows. Submissions go through the REST API from 8 client threads;
submit-to-complete is the run's `finishedAt - createdAt` as the server recorded it.
With `--provider-concurrency N` the provider takes N calls at once (the rest of the profile stays
wide) and every run asks for the scheduler at N: provider calls per second against the
physical limit N / latency.

Each is measured twice: submitted while the workers run (`--cap`, the default per-workspace
cap of runs in flight), and queued first with the workers started afterwards (`--backlog-cap`),
which shows what the workers do apart from the web server. Then, with one worker: a quiet
workspace's 1-decision evaluation when nothing else runs, and again one second into a noisy
workspace's burst (`--burst`, default 100 evaluations).

Runs on the embedded default (SQLite and the filesystem broker; one worker only) and, when
DATABASE_URL and CELERY_BROKER_URL point at PostgreSQL and Redis, on those too. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django_setup import activate_profile_script, configure, epoch_seconds, service_deployment

# The example request lives in a module that imports models.
configure()
# Figures only: one log line per polling request would bury them.
logging.getLogger("httpx").setLevel(logging.WARNING)

from console.forms.runs import example_request  # noqa: E402
from tests.evaluator.loopback import LoopbackServer, Reply  # noqa: E402
from tests.service.conftest import TERMINAL, Deployment  # noqa: E402
from tests.service.test_fairness import QUIET_WORKSPACE  # noqa: E402

WIDE_LIMITS = {"concurrency": 256, "requestsPerMinute": 10**7, "maxQueueLength": 100000}
# With --provider-concurrency: the provider's ceiling, and every call waits its turn at the
# provider (none may time out in the queue).
PROVIDER_CEILING = """
if {provider_concurrency}:
    document["providers"]["fake"]["concurrency"] = {provider_concurrency}
    for part in parts:
        part["maxQueueWaitMs"] = 600000
"""


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _wait_all(deployment: Deployment, ids: set[str], path: str, user: str) -> list[dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 900
    while len(runs) < len(ids) and time.monotonic() < deadline:
        page = deployment.api("GET", path, params={"page_size": 500}, user=user).json()
        for run in page["results"]:
            if run["id"] in ids and run["status"] in TERMINAL:
                runs[run["id"]] = run
        time.sleep(0.2)
    return list(runs.values())


def _document(args: argparse.Namespace) -> dict[str, Any]:
    document = example_request(args.decisions)
    if args.provider_concurrency:
        # Each run may use the provider's whole ceiling; admission shares it between runs.
        document["scheduler"] = {"enabled": True, "bindingConcurrency": args.provider_concurrency}
        for decision in document["ruleset"]["decisions"]:
            decision["binding"]["primary"]["timeoutMs"] = 600_000
    return document


def _submit_all(deployment: Deployment, args: argparse.Namespace) -> tuple[set[str], float]:
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        ids = set(
            pool.map(lambda _: deployment.submit(_document(args))["id"], range(args.evaluations))
        )
    return ids, time.monotonic() - started


def measure(
    mode: str, workers: int, args: argparse.Namespace, provider: LoopbackServer, *, backlog: bool
) -> dict[str, Any] | None:
    """Live: workers run while the evaluations are submitted. Backlog: every evaluation is
    queued first, then the workers start (what the workers do, apart from the web server)."""
    with tempfile.TemporaryDirectory(prefix=f"sluice-bench-{mode}-") as tmp:
        deployment = service_deployment(tmp, mode, provider)
        if deployment is None:
            return None
        cap = str(args.backlog_cap if backlog else args.cap)
        deployment.env["SLUICE_WORKSPACE_RUNS_IN_FLIGHT"] = cap
        try:
            deployment.setup()
            if args.limits == "wide":
                ceiling = PROVIDER_CEILING.format(
                    provider_concurrency=args.provider_concurrency or 0
                )
                deployment.django(activate_profile_script("bench-wide", WIDE_LIMITS, ceiling))
            deployment.start_web()
            if backlog:
                ids, submitted = _submit_all(deployment, args)
            before = len(provider.requests)
            for _ in range(workers):
                deployment.start_worker()
            if not backlog:
                ids, submitted = _submit_all(deployment, args)
            runs = _wait_all(deployment, ids, "/api/workspaces/demo/evaluations/", "demo-proposer")
            calls = len(provider.requests) - before
        finally:
            deployment.stop()
    start = "startedAt" if backlog else "createdAt"
    latencies = [epoch_seconds(r["finishedAt"]) - epoch_seconds(r[start]) for r in runs]
    first = min(epoch_seconds(r[start]) for r in runs)
    last = max(epoch_seconds(r["finishedAt"]) for r in runs)
    return {
        "runs": len(runs),
        "statuses": sorted({r["status"] for r in runs}),
        "submit_s": submitted,
        "per_second": len(runs) / (last - first),
        "p50_s": _percentile(latencies, 0.50),
        "p95_s": _percentile(latencies, 0.95),
        "calls": calls,
        "calls_per_second": calls / (last - first),
        "peak_in_flight": provider.max_in_flight,
        "cap": cap,
    }


def _quiet(deployment: Deployment) -> float:
    path = "/api/workspaces/quiet/evaluations/"
    response = deployment.api("POST", path, json=example_request(1), user="demo-approver")
    run_id = response.json()["id"]
    (run,) = _wait_all(deployment, {run_id}, path, "demo-approver")
    return epoch_seconds(run["finishedAt"]) - epoch_seconds(run["createdAt"])


def fairness(mode: str, args: argparse.Namespace, provider: LoopbackServer) -> None:
    with tempfile.TemporaryDirectory(prefix=f"sluice-bench-fair-{mode}-") as tmp:
        deployment = service_deployment(tmp, mode, provider)
        if deployment is None:
            return
        try:
            deployment.setup()
            deployment.django(QUIET_WORKSPACE)
            deployment.start_web()
            deployment.start_worker()
            _quiet(deployment)
            idle = [_quiet(deployment) for _ in range(3)]
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda _: deployment.submit(example_request(args.decisions)),
                        range(args.burst),
                    )
                )
            time.sleep(1)
            loaded = [_quiet(deployment) for _ in range(3)]
        finally:
            deployment.stop()
    print(
        f"{mode:<27} quiet tenant, 1 decision: idle {min(idle) * 1000:6.0f} ms (best of 3); "
        f"1 s into a {args.burst}-evaluation burst of another workspace "
        f"{', '.join(f'{v * 1000:.0f}' for v in loaded)} ms",
        flush=True,
    )


def main() -> int:
    # SIGTERM (e.g. from `timeout`) unwinds through the deployments' cleanup like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=300)
    parser.add_argument("--decisions", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--modes", default="embedded,full")
    parser.add_argument("--limits", choices=("wide", "demo"), default="wide")
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--fairness-only", action="store_true")
    parser.add_argument(
        "--provider-concurrency",
        type=int,
        default=0,
        help="limit the provider to N calls at once (runs ask for the scheduler at N) and "
        "report provider calls/s against the physical limit N / latency",
    )
    parser.add_argument("--cap", type=int, default=16, help="SLUICE_WORKSPACE_RUNS_IN_FLIGHT")
    parser.add_argument(
        "--backlog-cap", type=int, default=256, help="the same, for the queued-first runs"
    )
    args = parser.parse_args()
    print(
        f"{args.evaluations} evaluations x {args.decisions} decisions, loopback provider "
        f"{args.latency_ms:g} ms per call, {args.limits} admission limits"
    )
    with LoopbackServer() as provider:
        provider.default = Reply(delay=args.latency_ms / 1000.0)
        for mode in args.modes.split(","):
            label = "SQLite + filesystem broker" if mode == "embedded" else "PostgreSQL + Redis"
            skipped = False
            for backlog in () if args.fairness_only else (False, True):
                for workers in [int(n) for n in args.workers.split(",")]:
                    if mode == "embedded" and workers > 1:
                        continue  # admission is in-process there: one worker process only
                    provider.max_in_flight = 0
                    figures = measure(mode, workers, args, provider, backlog=backlog)
                    if figures is None:
                        skipped = True
                        break
                    how = "queued first, then" if backlog else "submitted live to"
                    since = "start" if backlog else "submit"
                    print(
                        f"{label:<27} {how} {workers} worker(s), workspace cap "
                        f"{figures['cap']}: {figures['per_second']:6.2f} evaluations/s  "
                        f"{since}→complete p50 {figures['p50_s']:6.2f} s  "
                        f"p95 {figures['p95_s']:6.2f} s  ({figures['runs']} runs "
                        f"{', '.join(figures['statuses'])}; {figures['calls']} calls, at most "
                        f"{figures['peak_in_flight']} at once; submitting took "
                        f"{figures['submit_s']:.1f} s)",
                        flush=True,
                    )
                    if args.provider_concurrency:
                        limit = args.provider_concurrency / (args.latency_ms / 1000.0)
                        print(
                            f"{'':<27} provider calls/s {figures['calls_per_second']:6.2f} "
                            f"against the physical limit {limit:.1f} "
                            f"({figures['calls_per_second'] / limit:.0%})",
                            flush=True,
                        )
                if skipped:
                    break
            if not skipped:
                fairness(mode, args, provider)
    return 0


if __name__ == "__main__":
    sys.exit(main())
