"""Why an attempt waited for admission: the reasons it was deferred for.

A deferral happens inside a controller and reaches the host only as a registry decision event
(`defer`, with a reason from the fixed vocabulary). One process-wide `DeferralLog` listens to
every registry an evaluation admits through (a canary run's two among them) and keeps, for each
attempt's request while it waits, the distinct reasons in the order they came. A request that
waited only behind earlier requests of its own lane (same workspace, provider and principal)
is never checked while it waits: it is given the reason its lane was last deferred for, or
`queued` when none was seen.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from admission.core import AdmissionRequest

__all__ = ["QUEUED", "DeferralLog", "deferral_log"]

# An attempt that waited without a reason of its own or of its lane.
QUEUED = "queued"

_LaneKey = tuple[str, str, str]


def _lane(request: AdmissionRequest) -> _LaneKey:
    return request.workspace_id, request.provider_id, request.principal_id


class DeferralLog:
    """Deferral reasons of the requests being followed; listens to each registry once."""

    def __init__(self) -> None:
        self._followed: dict[int, tuple[AdmissionRequest, list[str]]] = {}
        # lane -> [its last deferral reason or "", how many followed requests are on it]
        self._lanes: dict[_LaneKey, list[Any]] = {}
        self._registries: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def listen(self, registry: Any) -> None:
        """Follow `registry`'s decision events (idempotent). A canary run's registry names
        the registries it reports to (`decision_registries`)."""
        sources = getattr(registry, "decision_registries", None)
        for source in sources() if sources is not None else (registry,):
            with self._lock:
                if source in self._registries:
                    continue
                self._registries.add(source)
            source.on_decision(self._on_decision)

    def follow(self, request: AdmissionRequest) -> None:
        """Start noting the deferrals of `request` (before it asks for admission)."""
        self._followed[id(request)] = (request, [])
        lane = self._lanes.setdefault(_lane(request), ["", 0])
        lane[1] += 1

    def reasons(self, request: AdmissionRequest, queue_delay_ms: float | None) -> list[str]:
        """Stop following `request`; the reasons it was deferred for. A request that waited
        (`queue_delay_ms` > 0) without one gets its lane's."""
        entry = self._followed.pop(id(request), None)
        found = list(entry[1]) if entry is not None and entry[0] is request else []
        key = _lane(request)
        lane = self._lanes.get(key)
        if lane is not None:
            if not found and queue_delay_ms:
                found = [lane[0] or QUEUED]
            lane[1] -= 1
            if lane[1] <= 0:
                del self._lanes[key]
        elif not found and queue_delay_ms:
            found = [QUEUED]
        return found

    def _on_decision(self, event: Any) -> None:
        if event.decision != "defer":
            return
        request = event.request
        entry = self._followed.get(id(request))
        if entry is None or entry[0] is not request:
            return
        if event.reason not in entry[1]:
            entry[1].append(event.reason)
        lane = self._lanes.get(_lane(request))
        if lane is not None:
            lane[0] = event.reason


_log = DeferralLog()


def deferral_log() -> DeferralLog:
    """The process's log."""
    return _log
