"""Liveness and readiness for orchestrators and the launcher: `/healthz` and `/readyz`.

`/healthz` answers 200 while the process serves requests and touches nothing else. `/readyz`
checks what a request needs: the database answers, every migration is applied, the task broker
answers and, when admission is coordinated in Redis (`SLUICE_ADMISSION_REDIS_URL`), Redis answers.
It returns 200 when all pass and 503 otherwise, with each check's status in the JSON body. Both
are answered by a middleware placed first, so a probe needs no allowed host, session or CSRF.

`/readyz` is open to anyone, so it is cheap: its answer is kept for
`SLUICE_READYZ_CACHE_SECONDS` (1 s) per process, the migration graph is read from disk once per
process (after every migration was found applied, later probes only count the applied rows), and
one client address gets at most `SLUICE_READYZ_PER_SECOND` (10) answers a second per process,
then a 429 with `Retry-After: 1`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpRequest, HttpResponse, JsonResponse

__all__ = ["FAILING", "OK", "SKIPPED", "Check", "HealthCheckMiddleware", "liveness", "readiness"]

OK, FAILING, SKIPPED = "ok", "failing", "skipped"


@dataclass(frozen=True, slots=True)
class Check:
    """One dependency's verdict. `detail` names the error type, never a URL or credential."""

    name: str
    status: str
    duration_ms: float
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"status": self.status, "ms": round(self.duration_ms, 1)}
        if self.detail:
            entry["detail"] = self.detail
        return entry


def _timed(name: str, probe: Callable[[], str | None]) -> Check:
    """Run `probe`: None passes, a string skips with that reason, an exception fails."""
    started = time.perf_counter()
    try:
        skipped = probe()
    except Exception as error:
        elapsed = (time.perf_counter() - started) * 1000.0
        # Driver messages may carry hosts or users; only this module's own errors are quoted.
        reason = str(error) if isinstance(error, NotReady) else "unreachable or refused"
        return Check(name, FAILING, elapsed, f"{type(error).__name__}: {reason}")
    elapsed = (time.perf_counter() - started) * 1000.0
    return Check(name, SKIPPED if skipped else OK, elapsed, skipped or "")


def _database() -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        # A broken connection must not be reused by the next probe once the server is back.
        connection.close()
        raise


class NotReady(Exception):
    """A dependency answered, but not as a ready deployment needs."""


class MigrationsPending(NotReady):
    """Some migration on disk is not applied to the database."""


# How many migration rows the database held when every migration on disk was found applied.
_migrated_rows: int | None = None


def _migrations() -> None:
    global _migrated_rows
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        if _migrated_rows is not None:
            # Building the graph reads every migration file; once all were applied, a count of
            # the applied rows tells whether that still holds.
            rows = MigrationRecorder(connection).migration_qs.count()
            if rows >= _migrated_rows:
                return
            _migrated_rows = None
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if not plan:
            _migrated_rows = MigrationRecorder(connection).migration_qs.count()
    except Exception:
        connection.close()
        raise
    if plan:
        raise MigrationsPending(f"{len(plan)} migration(s) not applied")


def _redis_ping(url: str) -> None:
    from admission.coordination.clients import sync_client

    timeout = float(settings.SLUICE_HEALTH_TIMEOUT_SECONDS)
    # One server, or a Redis Cluster (`redis+cluster://`: every primary must answer).
    client = sync_client(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


def _broker() -> None:
    url = str(settings.CELERY_BROKER_URL)
    if url.startswith("filesystem://"):
        folder = str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        if not os.access(folder, os.W_OK):
            raise NotReady("the broker folder is not writable")
        return
    if url.startswith(("redis://", "rediss://")):
        _redis_ping(url)
        return
    from kombu import Connection

    timeout = float(settings.SLUICE_HEALTH_TIMEOUT_SECONDS)
    with Connection(url, connect_timeout=timeout) as broker:
        broker.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)


def _admission_redis() -> str | None:
    url = settings.SLUICE_ADMISSION_REDIS_URL
    if not url:
        return "admission is kept in this process (SLUICE_ADMISSION_REDIS_URL is empty)"
    _redis_ping(url)
    return None


def _migrations_after(database: Check) -> Callable[[], str | None]:
    def probe() -> str | None:
        if database.status != OK:
            raise NotReady("the database is not reachable")
        _migrations()
        return None

    return probe


def readiness(*, migrations: bool = True) -> tuple[bool, list[Check]]:
    """Run every readiness check (the migrations one unless told not to: `/metrics` leaves it
    out); returns (all passed or skipped, the checks in order)."""
    database = _timed("database", lambda: _database())
    checks = [database]
    if migrations:
        checks.append(_timed("migrations", _migrations_after(database)))
    checks += [_timed("broker", lambda: _broker()), _timed("redis", _admission_redis)]
    return all(check.status != FAILING for check in checks), checks


def liveness() -> dict[str, Any]:
    """What `/healthz` says: the process answers."""
    return {"status": "ok", "pid": os.getpid()}


class _KeptAnswer:
    """The last `/readyz` answer of this process and when it was made."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = float("-inf")
        self.body: dict[str, Any] = {}
        self.status = 503

    def clear(self) -> None:
        with self.lock:
            self.at = float("-inf")


_kept = _KeptAnswer()


def _readyz_response() -> JsonResponse:
    # One probe at a time runs the checks; the others share its answer while it is fresh.
    with _kept.lock:
        now = time.monotonic()
        if now - _kept.at >= float(settings.SLUICE_READYZ_CACHE_SECONDS):
            ready, checks = readiness()
            _kept.body = {
                "status": "ready" if ready else "unavailable",
                "checks": {check.name: check.as_dict() for check in checks},
            }
            _kept.status = 200 if ready else 503
            _kept.at = time.monotonic()
        return JsonResponse(_kept.body, status=_kept.status)


class _PerAddressRate:
    """At most `SLUICE_READYZ_PER_SECOND` answers per client address per second, per process."""

    _MOST_ADDRESSES = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.second = 0
        self.counts: dict[str, int] = {}

    def allow(self, address: str) -> bool:
        with self.lock:
            second = int(self.clock())
            if second != self.second or len(self.counts) >= self._MOST_ADDRESSES:
                self.second = second
                self.counts.clear()
            count = self.counts.get(address, 0) + 1
            self.counts[address] = count
            return count <= int(settings.SLUICE_READYZ_PER_SECOND)


_readyz_rate = _PerAddressRate()


def _throttled() -> JsonResponse:
    refused = JsonResponse(
        {"error": {"type": "throttled", "detail": "Too many readiness probes; retry shortly."}},
        status=429,
    )
    refused["Retry-After"] = "1"
    return refused


_ENDPOINTS: dict[str, Callable[[], HttpResponse]] = {
    "/healthz": lambda: JsonResponse(liveness()),
    "/readyz": _readyz_response,
}


class HealthCheckMiddleware:
    """Answers `/healthz` and `/readyz` before any other middleware; passes the rest on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        endpoint = _ENDPOINTS.get(request.path_info.rstrip("/") or "/")
        if endpoint is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            refused = JsonResponse({"error": {"type": "method_not_allowed"}}, status=405)
            refused["Allow"] = "GET, HEAD"
            return refused
        if endpoint is _readyz_response and not _readyz_rate.allow(
            str(request.META.get("REMOTE_ADDR", ""))
        ):
            response: HttpResponse = _throttled()
        else:
            response = endpoint()
        response["Cache-Control"] = "no-store"
        return response
