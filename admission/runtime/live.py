"""Live admission figures of a worker whose admission is kept in its own process.

With admission coordinated in Redis, operators' views read the deployment's shared state. With
admission kept inside the one worker process (the embedded default) there is no such state: the
worker's `LivePublisher` counts its registry's decisions (by provider, decision and reason, per
minute and in running totals, with the admitted queue delay as a histogram) and breaker
transitions, and the decisions of a running canary's own registry (its deferrals and refusals;
a canary attempt it admits is counted once, where it then takes the shared pools); every
`SLUICE_ADMISSION_SNAPSHOT_SECONDS` it writes them, with each workspace's active and queued
calls, breakers, leases and waiters, to its `AdmissionSnapshot` row. The web
process reads those rows (`published_states`) in the same shape as the Redis state, so the Live
admission page and `/metrics` show the same figures in both modes. Nothing here carries a
principal id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

from admission.core import AdmissionController, AdmissionRegistry
from admission.core.registry import DecisionEvent
from admission.models import AdmissionSnapshot
from admission.runtime import registry as runtime

__all__ = [
    "DELAY_BOUNDS_MS",
    "LivePublisher",
    "LiveTally",
    "published_states",
    "start_publisher",
    "stop_publisher",
]

logger = logging.getLogger(__name__)

# The admitted queue delay's histogram buckets (upper bounds, ms), as the shared state's.
DELAY_BOUNDS_MS = (0, 5, 25, 100, 250, 1000, 2500, 10000, 30000)
# Per-minute counts are kept this long, as in the shared state.
COUNT_MINUTES = 120
TRANSITION_HISTORY = 64
# Rows of processes that stopped publishing this long ago are removed (their counts with them).
SNAPSHOT_RETENTION = timedelta(days=1)


def _field(provider: str, kind: str, reason: str) -> str:
    return f"{provider}|{kind}|{reason}"


class _Counts:
    """One workspace's counts: running totals and the last COUNT_MINUTES minutes."""

    __slots__ = ("minutes", "seen", "totals", "transitions")

    def __init__(self) -> None:
        self.totals: dict[str, int] = defaultdict(int)
        self.minutes: dict[int, dict[str, int]] = {}
        self.transitions: deque[dict[str, Any]] = deque(maxlen=TRANSITION_HISTORY)
        # The newest breaker transition already counted (held, so `is` stays meaningful).
        self.seen: Any = None

    def add(self, field: str, at_ms: float, n: int = 1) -> None:
        self.totals[field] += n
        minute = int(at_ms // 60_000) * 60_000
        counts = self.minutes.get(minute)
        if counts is None:
            counts = self.minutes[minute] = defaultdict(int)
            oldest = minute - COUNT_MINUTES * 60_000
            for stale in [m for m in self.minutes if m <= oldest]:
                del self.minutes[stale]
        counts[field] += n


class LiveTally:
    """Counts a registry's decisions and breaker transitions per workspace. Its listener runs
    on the thread that admits (the evaluation loop), and so must `figures`."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._epoch_ms = lambda: clock() * 1000.0
        self._workspaces: dict[str, _Counts] = defaultdict(_Counts)
        self._unsubscribe: Callable[[], None] | None = None
        self._registry: AdmissionRegistry | None = None
        self._canaries: weakref.WeakKeyDictionary[AdmissionRegistry, Callable[[], None]] = (
            weakref.WeakKeyDictionary()
        )

    def attach(self, registry: AdmissionRegistry) -> None:
        """Count this registry's decisions from now on (and no longer an earlier one's)."""
        if registry is self._registry:
            return
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._registry = registry
        self._unsubscribe = registry.on_decision(self._on_decision)

    def attach_canary(self, registry: AdmissionRegistry) -> None:
        """Count a canary version's own registry's decisions too (idempotent). A canary
        attempt takes the canary's lease, then the shared pools' from the process registry:
        its deferrals and refusals on either side count, and its admission once, on the
        pools' side, like any other attempt's."""
        if registry not in self._canaries:
            self._canaries[registry] = registry.on_decision(self._on_canary_decision)

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._unsubscribe = None
        self._registry = None
        for unsubscribe in list(self._canaries.values()):
            unsubscribe()
        self._canaries.clear()

    def _on_canary_decision(self, event: DecisionEvent) -> None:
        if event.decision != "admit":
            self._on_decision(event)

    def _on_decision(self, event: DecisionEvent) -> None:
        request = event.request
        counts = self._workspaces[request.workspace_id]
        now = self._epoch_ms()
        provider = request.provider_id
        counts.add(_field(provider, event.decision, event.reason), now)
        if event.decision == "admit" and event.evidence is not None:
            delay = max(0.0, float(event.evidence.queue_delay_ms))
            bucket = next((str(b) for b in DELAY_BOUNDS_MS if delay <= b), "inf")
            counts.add(_field(provider, "delay", bucket), now)
            if delay >= 1:
                counts.add(_field(provider, "delay", "sum"), now, int(delay))

    def _note_transitions(self, workspace: str, controller: AdmissionController) -> None:
        counts = self._workspaces[workspace]
        history = controller.breaker_transitions()
        fresh = history
        for index in range(len(history) - 1, -1, -1):
            if history[index] is counts.seen:
                fresh = history[index + 1 :]
                break
        for transition in fresh:
            record = transition.to_dict()
            counts.add(
                _field(transition.provider_id, "transition", f"{record['from']}>{record['to']}"),
                float(transition.at_epoch_ms),
            )
            counts.transitions.appendleft(record)
        if history:
            counts.seen = history[-1]

    def figures(self, registry: AdmissionRegistry, workspaces: list[str]) -> dict[str, Any]:
        """workspace key -> its figures now, in the shape of the shared state's `state`."""
        now = self._epoch_ms()
        out: dict[str, Any] = {}
        for workspace in sorted(set(workspaces) | set(self._workspaces)):
            controller = registry.controller(workspace)
            profile = registry.current_profile(workspace)
            entry: dict[str, Any] = {"rev": profile.profile_version if profile else None}
            if isinstance(controller, AdmissionController):
                self._note_transitions(workspace, controller)
                entry.update(controller.live_figures())
            counts = self._workspaces.get(workspace)
            if counts is not None:
                entry["totals"] = dict(counts.totals)
                entry["counts"] = {str(m): dict(c) for m, c in sorted(counts.minutes.items())}
                entry["transitions"] = list(counts.transitions)
            entry["now"] = now
            out[workspace] = entry
        return out


class LivePublisher:
    """Writes this process's figures to its snapshot row every `interval` seconds, from a
    thread of its own; the figures are collected on the evaluation loop."""

    def __init__(
        self, process_id: str, loop: asyncio.AbstractEventLoop, interval: float | None = None
    ) -> None:
        self.process_id = process_id
        self.loop = loop
        self.interval = float(
            settings.SLUICE_ADMISSION_SNAPSHOT_SECONDS if interval is None else interval
        )
        self.tally = LiveTally()
        self.published = 0
        self._halt = threading.Event()
        self._forget_hook: Callable[[], None] | None = None
        self._forget_canaries: Callable[[], None] | None = None
        self._thread = threading.Thread(
            target=self._serve, name="sluice-admission-snapshot", daemon=True
        )

    def start(self) -> None:
        self._forget_hook = runtime.on_registry_built(self._attach_on_loop)
        self._call_on_loop(lambda: self.tally.attach(runtime.get_registry()))
        # Canary registries are built with the loop frozen, like the process registry.
        self._forget_canaries = runtime.on_canary_registry(self.tally.attach_canary)
        self._thread.start()

    def _attach_on_loop(self, registry: AdmissionRegistry) -> None:
        # Registries are built with the loop frozen or on it: attaching is safe either way.
        self.tally.attach(registry)

    def _call_on_loop(self, function: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return function()

        if not self.loop.is_running():
            return function()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def collect(self) -> dict[str, Any]:
        def figures() -> dict[str, Any]:
            registry = runtime.get_registry()
            self.tally.attach(registry)
            return self.tally.figures(registry, runtime.applied_workspaces())

        result: dict[str, Any] = self._call_on_loop(figures)
        return result

    def publish(self) -> None:
        """Write the figures now (and drop rows of processes gone for a day)."""
        state = self.collect()
        now = timezone.now()
        AdmissionSnapshot.objects.update_or_create(
            process_id=self.process_id, defaults={"written_at": now, "state": state}
        )
        AdmissionSnapshot.objects.filter(written_at__lt=now - SNAPSHOT_RETENTION).delete()
        self.published += 1

    def _serve(self) -> None:
        while not self._halt.wait(self.interval):
            self._publish_quietly()
        connections.close_all()

    def _publish_quietly(self) -> None:
        try:
            self.publish()
        except DatabaseError as error:
            logger.warning("admission snapshot not written: %s", type(error).__name__)
            connections.close_all()
        except Exception:
            logger.exception("admission snapshot not written")

    def stop(self) -> None:
        """Stop the thread and write the last figures (the counts outlive the process)."""
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._forget_hook is not None:
            self._forget_hook()
        if self._forget_canaries is not None:
            self._forget_canaries()
        self._publish_quietly()
        connections.close_all()


_publisher: LivePublisher | None = None
_lock = threading.Lock()


def start_publisher(process_id: str, loop: asyncio.AbstractEventLoop) -> LivePublisher:
    """Start this process's publisher (the worker does, when admission is in-process)."""
    global _publisher
    with _lock:
        if _publisher is not None:
            _publisher.stop()
        _publisher = LivePublisher(process_id, loop)
        _publisher.start()
        return _publisher


def stop_publisher() -> None:
    global _publisher
    with _lock:
        if _publisher is not None:
            _publisher.stop()
        _publisher = None


_LIVE_FIELDS = ("rev", "principals", "leases", "waiters", "workspace", "providers")


def _merge_counts(into: dict[str, int], counts: dict[str, Any]) -> None:
    for field, n in counts.items():
        into[field] = into.get(field, 0) + int(n)


def published_states(*, minutes: int = 0, fresh_seconds: float | None = None) -> dict[str, Any]:
    """workspace key -> the published figures of every worker process, merged, in the shape
    of the shared state's `state` (plus `"processes"`: how many published fresh figures).
    Counts add up over processes, live ones and those gone within the retention (a restarted
    worker's counts do not vanish); active and queued figures come from fresh rows only."""
    interval = float(settings.SLUICE_ADMISSION_SNAPSHOT_SECONDS)
    fresh_for = fresh_seconds if fresh_seconds is not None else 3 * interval + 5
    now = timezone.now()
    fresh_after = now - timedelta(seconds=fresh_for)
    rows = AdmissionSnapshot.objects.filter(written_at__gte=now - SNAPSHOT_RETENTION).values_list(
        "written_at", "state"
    )
    now_ms = now.timestamp() * 1000.0
    first_minute = (int(now_ms // 60_000) - minutes + 1) * 60_000
    merged: dict[str, dict[str, Any]] = {}
    newest: dict[str, Any] = {}
    for written_at, state in rows:
        fresh = written_at >= fresh_after
        for workspace, figures in (state or {}).items():
            entry = merged.setdefault(
                workspace,
                {"totals": {}, "counts": {}, "transitions": [], "now": now_ms, "processes": 0},
            )
            _merge_counts(entry["totals"], figures.get("totals") or {})
            if minutes > 0:
                for minute, counts in (figures.get("counts") or {}).items():
                    if int(minute) >= first_minute:
                        _merge_counts(entry["counts"].setdefault(minute, {}), counts)
            entry["transitions"].extend(figures.get("transitions") or [])
            if fresh:
                entry["processes"] += 1
                # One process enforces; across a restart the newest row says what is now.
                if workspace not in newest or written_at > newest[workspace]:
                    newest[workspace] = written_at
                    for name in _LIVE_FIELDS:
                        if name in figures:
                            entry[name] = figures[name]
    for entry in merged.values():
        entry["transitions"].sort(key=lambda t: -float(t.get("atEpochMs") or 0))
        del entry["transitions"][TRANSITION_HISTORY:]
    return merged
