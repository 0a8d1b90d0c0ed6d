"""Response time of `GET /metrics` and of the live admission dashboard with many principals
known to deployment-wide admission, or (`--embedded`) to admission kept in one worker process.

Run:  DATABASE_URL=postgres://root@127.0.0.1:5432/sluice \\
      SLUICE_ADMISSION_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python benchmarks/metrics.py

It creates a throwaway test database next to the one DATABASE_URL names (SQLite when unset)
and uses the Redis that SLUICE_ADMISSION_REDIS_URL names (default redis://127.0.0.1:6379/0)
under a key prefix of its own, deleted afterwards. The demo workspace's active profile names
`--principals` principals; each of them is admitted and released once through the coordinated
registry, so the shared state holds their scopes and the decision totals. `--workspaces` more
workspaces get the same treatment with a few principals each. Then `/metrics` is requested
through Django's test client (the whole page: Redis reads, database counts, dependency checks),
then the admin's dashboard (`/admin/admission/live/`, every workspace, five SVG charts each) by a
member of all of them, and their times reported. With `--embedded` no Redis is used: the
principals are admitted through this process's own registry, whose figures are published as
a worker's snapshot row (admission/runtime/live.py) that both pages then read. Figures only; no
bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import time
import uuid

from django_setup import configure, throwaway_database

PREFIX = f"sluice-bench-{uuid.uuid4().hex[:8]}"
os.environ["SLUICE_ADMISSION_KEY_PREFIX"] = PREFIX
TOKEN = secrets.token_urlsafe(24)
os.environ["SLUICE_METRICS_TOKEN"] = TOKEN
EMBEDDED = "--embedded" in sys.argv
if EMBEDDED:
    os.environ["SLUICE_ADMISSION_REDIS_URL"] = ""
# A profile naming 10 000 principals is above the deployment's default document caps.
configure(
    SLUICE_ADMISSION_REDIS_URL="redis://127.0.0.1:6379/0",
    SLUICE_MAX_PROFILE_BYTES="16000000",
    SLUICE_MAX_PROFILE_PRINCIPALS="100000",
)

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from admission.core import AdmissionRegistry, AdmissionRequest, Estimate  # noqa: E402
from admission.models import Workspace, WorkspaceMembership  # noqa: E402
from admission.runtime import live  # noqa: E402
from admission.runtime import registry as runtime  # noqa: E402
from admission.services import profiles as services  # noqa: E402
from config.demo import DEMO_PROFILE, demo_setup  # noqa: E402


def _profile(label: str, principals: int) -> dict[str, object]:
    document = {key: value for key, value in DEMO_PROFILE.items() if key != "principals"}
    document["profileVersion"] = label
    limits = {"concurrency": 2, "requestsPerMinute": 3000, "maxQueueLength": 16}
    document["principals"] = {f"principal-{index:05d}": dict(limits) for index in range(principals)}
    return document


def _activate(workspace: Workspace, document: dict[str, object], proposer, approver) -> None:
    version = services.profile_version_propose(
        workspace=workspace, document=document, proposed_by=proposer
    )
    services.profile_version_approve(
        version=version,
        approver=approver,
        checklist={key: True for key, _ in services.RUNBOOK_CHECKLIST},
    )
    services.profile_version_activate(version=version, actor=approver)


async def _admit_each(registry: AdmissionRegistry, workspace: str, principals: int) -> None:
    controller = registry.controller(workspace)
    assert controller is not None, workspace
    semaphore = asyncio.Semaphore(32)

    async def once(index: int) -> None:
        async with semaphore:
            lease = await controller.acquire(
                AdmissionRequest(
                    budget_id=f"inv-{index}",
                    principal_id=f"principal-{index:05d}",
                    workspace_id=workspace,
                    provider_id="fake",
                    estimate=Estimate(),
                )
            )
            lease.release(success=True)

    await asyncio.gather(*(once(index) for index in range(principals)))
    if EMBEDDED:
        return
    coordinator = controller._coordinator  # type: ignore[attr-defined]
    await coordinator.settle()
    # The heartbeat reports decisions counted without a round trip; then the process leaves.
    await coordinator._heartbeat()
    await coordinator.aclose()


def seed(principals: int, workspaces: int) -> None:
    demo = demo_setup()
    proposer = get_user_model().objects.get(username=demo.proposer.username)
    approver = get_user_model().objects.get(username=demo.approver.username)
    keys = ["demo"]
    _activate(
        Workspace.objects.get(key="demo"), _profile("bench-v2", principals), proposer, approver
    )
    for index in range(workspaces):
        workspace = Workspace.objects.create(key=f"bench-{index}", name=f"Bench {index}")
        for user in (proposer, approver):
            WorkspaceMembership.objects.create(
                workspace=workspace, user=user, role=WorkspaceMembership.Role.OPERATOR
            )
        _activate(workspace, _profile("bench-v1", 10), proposer, approver)
        keys.append(workspace.key)
    if EMBEDDED:
        # One worker's registry for every workspace, its figures published as it would.
        runtime.reset_registry()
        loop = asyncio.new_event_loop()
        publisher = live.LivePublisher("bench-worker", loop, interval=60)
        publisher.tally.attach(runtime.get_registry())
        for key in keys:
            count = principals if key == "demo" else 10
            loop.run_until_complete(_admit_each(runtime.get_registry(), key, count))
        publisher.publish()
        loop.close()
        runtime.reset_registry()
        return
    for key in keys:
        runtime.reset_registry()
        asyncio.run(_admit_each(runtime.get_registry(), key, principals if key == "demo" else 10))
    runtime.reset_registry()


def _timed(client: Client, path: str, repeat: int, **headers: str) -> tuple[list[float], str]:
    first = client.get(path, **headers)
    if first.status_code != 200:
        raise SystemExit(f"{path} answered {first.status_code}: {first.content[:200]!r}")
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path, **headers)
        timings.append((time.perf_counter() - started) * 1000)
    return sorted(timings), response.content.decode()


def _report(name: str, timings: list[float]) -> None:
    p95 = timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))]
    print(
        f"{name}: {len(timings)} requests, p50 {statistics.median(timings):.1f} ms, "
        f"p95 {p95:.1f} ms, max {timings[-1]:.1f} ms"
    )


def dashboard(repeat: int) -> None:
    client = Client()
    client.force_login(get_user_model().objects.get(username="demo-approver"))
    timings, body = _timed(client, "/admin/admission/live/", repeat)
    charts = body.count("sluice-chart")
    print(f"dashboard page: {len(body):,} bytes, {charts} charts")
    _report("GET /admin/admission/live/", timings)


def measure(repeat: int) -> list[float]:
    client = Client(REMOTE_ADDR="127.0.0.1")
    timings, body = _timed(client, "/metrics", repeat, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    admitted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("sluice_admission_decisions_total{") and 'decision="admit"' in line
    )
    print(f"page: {len(body):,} bytes, {body.count(chr(10)):,} lines, {admitted:,.0f} admissions")
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--principals", type=int, default=10_000)
    parser.add_argument("--workspaces", type=int, default=0, help="more workspaces, 10 each")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument(
        "--embedded", action="store_true", help="admission in this process, no Redis"
    )
    args = parser.parse_args()

    client = None if EMBEDDED else redis.Redis.from_url(settings.SLUICE_ADMISSION_REDIS_URL)
    with throwaway_database():
        try:
            started = time.perf_counter()
            seed(args.principals, args.workspaces)
            print(
                f"/metrics on {connection.vendor}, admission "
                f"{'in one worker process' if EMBEDDED else 'in Redis'}; {args.principals:,} "
                f"principals in the demo workspace and {args.workspaces} more workspaces "
                f"(seeded in {time.perf_counter() - started:.1f} s)"
            )
            _report("GET /metrics", measure(args.repeat))
            dashboard(args.repeat)
        finally:
            if client is not None:
                keys = list(client.scan_iter(f"{PREFIX}:*", count=1000))
                for start in range(0, len(keys), 1000):
                    client.delete(*keys[start : start + 1000])
                client.close()


if __name__ == "__main__":
    main()
