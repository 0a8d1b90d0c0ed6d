"""Latency and query count of `GET /api/workspaces/{key}/profile-history/` over a large ledger.

Run:  DATABASE_URL=postgres://root@127.0.0.1:5432/sluice .venv/bin/python benchmarks/history_api.py

It creates a throwaway test database next to the one DATABASE_URL names (SQLite when unset),
inserts 10 000 change records, and requests history pages through Django's test client: the
first page and a page deep in the cursor chain, at several page sizes. Figures only; no bounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time

from django_setup import configure, throwaway_database

# Figures of the view itself, not of the API's throttles.
configure(SLUICE_THROTTLE_USER="off", SLUICE_THROTTLE_WORKSPACE="off")

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import (  # noqa: E402
    CaptureQueriesContext,
)

from admission.models import (  # noqa: E402
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)

URL = "/api/workspaces/bench/profile-history/"


def seed(records: int) -> None:
    users = get_user_model().objects
    proposer = users.create_user("bench-proposer", is_staff=True)
    approver = users.create_user("bench-approver", is_staff=True)
    reader = users.create_user("bench-reader")
    workspace = Workspace.objects.create(key="bench", name="Benchmark")
    workspace.members.add(reader)
    versions = [
        ProfileVersion.objects.create(
            workspace=workspace,
            profile_version=f"v{index}",
            document={"profileVersion": f"v{index}"},
            digest="sha256:" + f"{index:064x}",
            profile_digest="sha256:" + f"{index + 100:064x}",
            proposed_by=proposer,
        )
        for index in range(10)
    ]
    approvals = [
        ProfileApproval.objects.create(
            version=version, proposed_by=proposer, approver=approver, decision="approve"
        )
        for version in versions
    ]
    rollback = RollbackRequest.objects.create(
        workspace=workspace,
        target=versions[0],
        requested_by=proposer,
        status=RollbackRequest.Status.APPROVED,
        decided_by=approver,
    )
    start = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    rows = []
    for index in range(records):
        kind = "initial" if index == 0 else ("rollback" if index % 7 == 0 else "change")
        current, previous = index % 10, (index - 1) % 10
        at = start + dt.timedelta(seconds=index // 2)  # pairs share a timestamp
        rows.append(
            ProfileChangeRecord(
                workspace=workspace,
                kind=kind,
                version=versions[current],
                previous_version=None if index == 0 else versions[previous],
                previous_profile_version=None if index == 0 else f"v{previous}",
                profile_version=f"v{current}",
                digest=versions[current].digest,
                profile_digest=versions[current].profile_digest,
                at=at,
                at_epoch_ms=at.timestamp() * 1000,
                actor=approver,
                approval=approvals[current],
                rollback_request=rollback if kind == "rollback" else None,
            )
        )
    ProfileChangeRecord.objects.bulk_create(rows, batch_size=1000)
    if connection.vendor == "postgresql":
        # Fresh statistics, as autovacuum would gather them, so the planner uses the index.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def measure(client: Client, url: str, params: dict[str, object], repeat: int) -> dict[str, float]:
    client.get(url, params)  # warm caches and connections
    timings, queries = [], []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url, params)
            timings.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{url} answered {response.status_code}: {response.content[:200]!r}")
        queries.append(len(captured.captured_queries))
    timings.sort()
    return {
        "p50": statistics.median(timings),
        "p95": timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))],
        "queries": max(queries),
        "rows": len(response.json()["results"]),
    }


def deep_cursor(client: Client, page_size: int, depth: int) -> str:
    """The `next` link after `depth` pages, to time a page far from the head."""
    response = client.get(URL, {"page_size": page_size}).json()
    for _ in range(depth):
        if not response["next"]:
            break
        response = client.get(response["next"]).json()
    return response["next"] or URL


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[10, 50, 200])
    args = parser.parse_args()

    with throwaway_database() as database:
        seed(args.records)
        client = Client()
        client.force_login(get_user_model().objects.get(username="bench-reader"))
        print(
            f"history API on {connection.vendor} ({database}), {args.records} records, "
            f"{args.repeat} requests per row"
        )
        print(f"{'page':<14}{'size':>6}{'rows':>6}{'p50 ms':>10}{'p95 ms':>10}{'queries':>9}")
        for size in args.page_sizes:
            cases = [
                ("first", URL, {"page_size": size}),
                ("deep (20th)", deep_cursor(client, size, 19), {}),
                ("kind=rollback", URL, {"page_size": size, "kind": "rollback"}),
            ]
            for name, url, params in cases:
                figures = measure(client, url, params, args.repeat)
                print(
                    f"{name:<14}{size:>6}{figures['rows']:>6}{figures['p50']:>10.2f}"
                    f"{figures['p95']:>10.2f}{figures['queries']:>9}"
                )


if __name__ == "__main__":
    main()
