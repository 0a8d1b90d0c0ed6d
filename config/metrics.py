"""`/metrics`: the deployment's state in the Prometheus text format, for a scraper.

Every figure is the deployment's, not the answering process's: admission comes from the shared
state in Redis (`admission.runtime.operations`, one read per workspace with an active profile), or,
with admission kept in one worker process, from the figures that worker publishes; runs
from the database, dependencies from the same checks `/readyz` makes. Labels come from fixed
vocabularies plus provider (adapter) ids: no principal, workspace, run or invocation id appears
in any series. Admission figures are summed over workspaces.

Access (docs/deploying.md): a request with `Authorization: Bearer <SLUICE_METRICS_TOKEN>`, or
from an address in `SLUICE_METRICS_ALLOW_FROM`; anything else gets 403. The endpoint is
answered by a middleware placed right after the health one, so a scraper needs no allowed host.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from admission.coordination import CoordinationUnavailable
from admission.runtime import operations
from admission.runtime import registry as runtime
from config import health
from evaluator.models import EvaluationRun, LoadRun, WorkerProcess

__all__ = ["MetricsMiddleware", "SluiceCollector", "allowed", "render"]

# The compact limit records' keys that are figures a dashboard compares with a count.
_LIMITS = {
    "c": "concurrency",
    "ql": "queue_length",
    "rpm": "requests_per_minute",
    "tps": "tokens_per_second",
}
_BREAKER_STATES = ("closed", "open", "half-open")
# The text format every Prometheus version reads (what `generate_latest` writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_RUN_MODELS: dict[str, Any] = {"evaluation": EvaluationRun, "load": LoadRun}


def _admission(views: list[operations.WorkspaceView]) -> Iterator[Metric]:
    live = [view for view in views if view.live]
    decisions = CounterMetricFamily(
        "sluice_admission_decisions",
        "Admission decisions since the shared state began, by provider, decision and reason",
        labels=["provider", "decision", "reason"],
    )
    throttles = CounterMetricFamily(
        "sluice_admission_throttles",
        "Deferred or rejected admission requests, by provider, decision and reason",
        labels=["provider", "decision", "reason"],
    )
    transitions = CounterMetricFamily(
        "sluice_admission_breaker_transitions",
        "Circuit breaker transitions, by provider and states",
        labels=["provider", "from", "to"],
    )
    delay = HistogramMetricFamily(
        "sluice_admission_queue_delay_seconds",
        "Time admitted requests waited in the admission queue",
        labels=["provider"],
    )
    totals: dict[tuple[str, str, str], int] = defaultdict(int)
    for view in live:
        for key, count in view.totals.items():
            totals[key] += count
    buckets: dict[str, dict[str, int]] = defaultdict(dict)
    for (provider, kind, reason), count in sorted(totals.items()):
        if kind in operations.DECISIONS:
            decisions.add_metric([provider, kind, reason], count)
            if kind != "admit":
                throttles.add_metric([provider, kind, reason], count)
        elif kind == "transition" and ">" in reason:
            source, _, target = reason.partition(">")
            transitions.add_metric([provider, source, target], count)
        elif kind == "delay":
            buckets[provider][reason] = count
    for provider, stored in sorted(buckets.items()):
        cumulative = 0
        rows: list[tuple[str, float]] = []
        for bound in operations.DELAY_BOUNDS_MS:
            cumulative += stored.get(str(bound), 0)
            rows.append((repr(bound / 1000.0), float(cumulative)))
        rows.append(("+Inf", float(cumulative + stored.get("inf", 0))))
        delay.add_metric([provider], rows, stored.get("sum", 0) / 1000.0)
    yield from (decisions, throttles, transitions, delay)
    yield from _admission_gauges(live)


def _admission_gauges(live: list[operations.WorkspaceView]) -> Iterator[Metric]:
    active = GaugeMetricFamily(
        "sluice_admission_active_calls", "Calls holding a permit now", labels=["provider"]
    )
    queued = GaugeMetricFamily(
        "sluice_admission_queued_calls", "Calls waiting for a permit now", labels=["provider"]
    )
    limits = GaugeMetricFamily(
        "sluice_admission_limit",
        "Provider limits of the active profiles, summed over workspaces",
        labels=["provider", "limit"],
    )
    breakers = GaugeMetricFamily(
        "sluice_admission_breakers",
        "Workspaces whose breaker for the provider is in each state",
        labels=["provider", "state"],
    )
    figures: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    limit_sums: dict[tuple[str, str], float] = defaultdict(float)
    states: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_BREAKER_STATES, 0))
    for view in live:
        for lane in view.providers.values():
            figures[lane.provider_id][0] += lane.active or 0
            figures[lane.provider_id][1] += lane.queued or 0
            for key, name in _LIMITS.items():
                value = lane.limits.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    limit_sums[(lane.provider_id, name)] += value
            state = lane.breaker or "closed"
            if state in _BREAKER_STATES:
                states[lane.provider_id][state] += 1
    for provider, (now_active, now_queued) in sorted(figures.items()):
        active.add_metric([provider], now_active)
        queued.add_metric([provider], now_queued)
        for state, count in states[provider].items():
            breakers.add_metric([provider, state], count)
    for (provider, name), value in sorted(limit_sums.items()):
        limits.add_metric([provider, name], value)
    yield from (active, queued, limits, breakers)
    yield GaugeMetricFamily(
        "sluice_admission_principals",
        "Principals the active profiles name, summed over workspaces",
        value=sum(view.principals or 0 for view in live),
    )
    yield GaugeMetricFamily(
        "sluice_admission_waiters",
        "Admission requests queued deployment-wide",
        value=sum(view.waiters or 0 for view in live),
    )


def _workspaces(views: list[operations.WorkspaceView]) -> Iterator[Metric]:
    coordinated = runtime.coordination_settings() is not None
    yield GaugeMetricFamily(
        "sluice_admission_coordinated",
        "1 when admission is shared in Redis (the admission figures are the deployment's)",
        value=1 if coordinated else 0,
    )
    yield GaugeMetricFamily(
        "sluice_admission_workspaces", "Workspaces with an active profile", value=len(views)
    )
    yield GaugeMetricFamily(
        "sluice_admission_state_unreadable",
        "Workspaces whose shared admission state could not be read for this scrape",
        value=sum(1 for view in views if view.unavailable),
    )
    observer = runtime.shared_state_observer()
    if observer is not None:
        try:
            processes = observer.live_processes_sync()
        except CoordinationUnavailable:
            return
    else:
        processes = max((view.publishers for view in views), default=0)
    yield GaugeMetricFamily(
        "sluice_admission_processes",
        "Worker processes that admit: holding a live lease on the shared state in Redis, or "
        "(admission in one process) publishing its figures",
        value=processes,
    )


def _runs() -> Iterator[Metric]:
    runs = GaugeMetricFamily(
        "sluice_runs", "Runs in the database by kind and status", labels=["kind", "status"]
    )
    oldest = GaugeMetricFamily(
        "sluice_runs_oldest_queued_seconds",
        "Age of the oldest run still queued (0 when none is)",
        labels=["kind"],
    )
    now = timezone.now()
    for kind, model in _RUN_MODELS.items():
        grouped = model.objects.order_by().values("status").annotate(n=Count("id"))
        counted = {row["status"]: row["n"] for row in grouped}
        for status in model.Status.values:
            runs.add_metric([kind, status], counted.get(status, 0))
        first = model.objects.filter(status="queued").aggregate(at=Min("created_at"))["at"]
        oldest.add_metric([kind], (now - first).total_seconds() if first is not None else 0.0)
    yield from (runs, oldest)


def _workers() -> Iterator[Metric]:
    """Worker processes and the sweeper they run. Every worker's dispatcher sweeps, so the
    sweeper is up while one worker heartbeats; running runs whose heartbeat is older than the
    stale window are what a working sweeper gives back within a poll."""
    now = timezone.now()
    fresh_after = now - timedelta(seconds=float(settings.SLUICE_RUN_STALE_SECONDS))
    workers = GaugeMetricFamily(
        "sluice_worker_processes",
        "Worker processes that have not stopped, by whether their heartbeat is fresh",
        labels=["state"],
    )
    fresh = Q(heartbeat_at__gte=fresh_after)
    counted = WorkerProcess.objects.filter(stopped_at__isnull=True).aggregate(
        running=Count("id"), live=Count("id", filter=fresh), slots=Sum("slots", filter=fresh)
    )
    live_count = counted["live"]
    workers.add_metric(["live"], live_count)
    workers.add_metric(["stale"], counted["running"] - live_count)
    slots = GaugeMetricFamily(
        "sluice_worker_slots", "Evaluations the live worker processes may run at once"
    )
    slots.add_metric([], counted["slots"] or 0)
    sweeper = GaugeMetricFamily(
        "sluice_sweeper_up", "1 while at least one live worker process sweeps the backlog"
    )
    sweeper.add_metric([], 1 if live_count else 0)
    overdue = GaugeMetricFamily(
        "sluice_runs_stale_running",
        "Running evaluation runs whose worker stopped heartbeating past the stale window",
    )
    overdue.add_metric(
        [],
        EvaluationRun.objects.filter(status="running", heartbeat_at__lt=fresh_after).count(),
    )
    yield from (workers, slots, sweeper, overdue)


def _dependencies() -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "sluice_dependency_up",
        "1 when the dependency answered the check /readyz makes, 0 when it did not",
        labels=["dependency"],
    )
    took = GaugeMetricFamily(
        "sluice_dependency_check_seconds", "How long the check took", labels=["dependency"]
    )
    _, checks = health.readiness(migrations=False)
    for check in checks:
        if check.status == health.SKIPPED:
            continue
        up.add_metric([check.name], 1 if check.status == health.OK else 0)
        took.add_metric([check.name], check.duration_ms / 1000.0)
    yield from (up, took)


class SluiceCollector:
    """Collects the whole page at each scrape; nothing is kept between scrapes."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        yield from _dependencies()
        try:
            views = operations.deployment_views()
        except Exception:
            # The database is down: the dependency gauges above already say so.
            views = None
        if views is not None:
            yield from _workspaces(views)
            yield from _admission(views)
            yield from _runs()
            yield from _workers()
        yield GaugeMetricFamily(
            "sluice_metrics_scrape_seconds",
            "How long this page took to collect",
            value=time.perf_counter() - started,
        )


def render() -> bytes:
    """The page, in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SluiceCollector())  # type: ignore[arg-type]
    return generate_latest(registry)


def allowed(request: HttpRequest) -> bool:
    """The bearer token matches, or the peer address is in an allowed network."""
    token = settings.SLUICE_METRICS_TOKEN
    if token:
        scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        # Bytes: a header may carry any character, and comparing such text would raise.
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8")
        ):
            return True
    networks = settings.SLUICE_METRICS_ALLOW_FROM
    if networks:
        try:
            peer = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        return any(peer in network for network in networks)
    return False


class MetricsMiddleware:
    """Answers `/metrics` to allowed callers; passes every other request on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.rstrip("/") != "/metrics":
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            refused = JsonResponse({"error": {"type": "method_not_allowed"}}, status=405)
            refused["Allow"] = "GET, HEAD"
            return refused
        if not allowed(request):
            return JsonResponse(
                {
                    "error": {
                        "type": "forbidden",
                        "detail": "metrics need the bearer token (SLUICE_METRICS_TOKEN) or an "
                        "address in SLUICE_METRICS_ALLOW_FROM",
                    }
                },
                status=403,
            )
        response = HttpResponse(render(), content_type=CONTENT_TYPE)
        response["Cache-Control"] = "no-store"
        return response
