"""Service benchmark: evaluations per second through a real web server and Celery worker.

Run with `python benchmarks/service.py [--evaluations 40] [--latency-ms 10]`. Each evaluation has
10 decisions on the fake adapter; the worker runs as many processes as the demo profile's
workspace concurrency. Submissions go through the REST API; submit-to-complete is the run's
`finishedAt - createdAt` as the server recorded it. Runs on the embedded default (SQLite and the
filesystem broker) and, when DATABASE_URL and CELERY_BROKER_URL point at PostgreSQL and Redis,
on those too. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# A throwaway deployment on loopback: a key of its own, plain HTTP.
os.environ.setdefault("DJANGO_SECRET_KEY", "benchmark-" + secrets.token_urlsafe(48))
os.environ.setdefault("DJANGO_HTTPS", "0")

import _pytest.outcomes
import django

# The demo profile and the example request live in modules that import models.
django.setup()
# Figures only: one log line per polling request would bury them.
logging.getLogger("httpx").setLevel(logging.WARNING)

from config.demo import DEMO_PROFILE  # noqa: E402
from evaluator.forms import example_request  # noqa: E402
from tests.service.conftest import TERMINAL, Deployment  # noqa: E402

DECISIONS = 10


def _when(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def measure(mode: str, evaluations: int, latency_ms: float) -> dict[str, Any] | None:
    concurrency = DEMO_PROFILE["workspace"]["concurrency"]
    with tempfile.TemporaryDirectory(prefix=f"sluice-bench-{mode}-") as tmp:
        try:
            deployment = Deployment(Path(tmp), mode)
        except _pytest.outcomes.Skipped as skipped:
            print(f"{mode}: skipped ({skipped.msg})")
            return None
        try:
            deployment.setup()
            deployment.start_web()
            deployment.start_worker(
                {"SLUICE_ADAPTERS": deployment.adapters(latency_ms=latency_ms)},
                concurrency=concurrency,
            )
            # One run first so every pool process has its registry and connections.
            for _ in range(concurrency):
                deployment.wait_run(deployment.submit(example_request(DECISIONS))["id"])
            started = time.monotonic()
            ids = {deployment.submit(example_request(DECISIONS))["id"] for _ in range(evaluations)}
            submitted = time.monotonic() - started
            runs: dict[str, dict[str, Any]] = {}
            deadline = time.monotonic() + 600
            while len(runs) < len(ids) and time.monotonic() < deadline:
                page = deployment.api(
                    "GET", "/api/workspaces/demo/evaluations/", params={"page_size": 500}
                ).json()
                for run in page["results"]:
                    if run["id"] in ids and run["status"] in TERMINAL:
                        runs[run["id"]] = run
                time.sleep(0.1)
        finally:
            deployment.stop()
    statuses = {run["status"] for run in runs.values()}
    latencies = [_when(r["finishedAt"]) - _when(r["createdAt"]) for r in runs.values()]
    first = min(_when(r["createdAt"]) for r in runs.values())
    last = max(_when(r["finishedAt"]) for r in runs.values())
    return {
        "mode": mode,
        "evaluations": len(runs),
        "statuses": sorted(statuses),
        "submit_s": submitted,
        "per_second": len(runs) / (last - first),
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p95_ms": _percentile(latencies, 0.95) * 1000,
        "concurrency": concurrency,
    }


def main() -> int:
    # SIGTERM (e.g. from `timeout`) unwinds through the deployments' cleanup like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    parser.add_argument("--modes", default="embedded,full")
    args = parser.parse_args()
    print(
        f"{args.evaluations} evaluations x {DECISIONS} decisions, fake adapter "
        f"{args.latency_ms:g} ms per call, receipt-backed (serial within an evaluation)"
    )
    for mode in args.modes.split(","):
        figures = measure(mode, args.evaluations, args.latency_ms)
        if figures is None:
            continue
        label = "SQLite + filesystem broker" if mode == "embedded" else "PostgreSQL + Redis"
        print(
            f"{label:<28} worker x{figures['concurrency']}: "
            f"{figures['per_second']:6.2f} evaluations/s  "
            f"submit→complete p50 {figures['p50_ms']:7.0f} ms  p95 {figures['p95_ms']:7.0f} ms  "
            f"(submitting took {figures['submit_s']:.2f} s; {figures['evaluations']} runs "
            f"{', '.join(figures['statuses'])})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
