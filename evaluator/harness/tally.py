"""Exact counters and high-water marks of a load run, updated at every transition."""

from __future__ import annotations

from typing import Any

__all__ = ["LoadTally"]


class LoadTally:
    """What a driver observes; every maximum is taken when its count changes, never sampled."""

    __slots__ = (
        "active",
        "admitted_by_class",
        "arrivals",
        "arrivals_by_class",
        "attempts",
        "cancelled",
        "completed",
        "failed",
        "max_active",
        "max_cancellation_latency_ms",
        "max_lane_wait_ms",
        "max_queued",
        "peak_active",
        "peak_queued",
        "queued",
        "shed",
        "shed_reasons",
    )

    def __init__(self) -> None:
        self.arrivals = 0
        self.attempts = 0
        self.completed = 0
        self.failed = 0
        self.shed = 0
        self.cancelled = 0
        self.shed_reasons: dict[str, int] = {}
        self.active = 0
        self.queued = 0
        self.max_active = 0
        self.max_queued = 0
        # Highs since the timeline's last sample; the sampler resets them (a run without one
        # leaves them equal to the maxima).
        self.peak_active = 0
        self.peak_queued = 0
        self.max_lane_wait_ms = 0.0
        self.max_cancellation_latency_ms = 0.0
        self.arrivals_by_class: dict[str, int] = {}
        self.admitted_by_class: dict[str, int] = {}

    def arrive(self, principal_class: str) -> None:
        self.arrivals += 1
        self.arrivals_by_class[principal_class] = self.arrivals_by_class.get(principal_class, 0) + 1

    def admitted_once(self, principal_class: str) -> None:
        """The first admitted attempt of an arrival; later attempts do not count again."""
        self.admitted_by_class[principal_class] = self.admitted_by_class.get(principal_class, 0) + 1

    def activate(self) -> None:
        self.active += 1
        if self.active > self.peak_active:
            self.peak_active = self.active
            if self.active > self.max_active:
                self.max_active = self.active

    def deactivate(self) -> None:
        self.active -= 1

    def enqueue(self) -> None:
        self.queued += 1
        if self.queued > self.peak_queued:
            self.peak_queued = self.queued
            if self.queued > self.max_queued:
                self.max_queued = self.queued

    def dequeue(self) -> None:
        self.queued -= 1

    def lane_wait(self, waited_ms: float) -> None:
        if waited_ms > self.max_lane_wait_ms:
            self.max_lane_wait_ms = waited_ms

    def shed_for(self, reason: str) -> None:
        self.shed += 1
        self.shed_reasons[reason] = self.shed_reasons.get(reason, 0) + 1

    def cancel(self, latency_ms: float) -> None:
        self.cancelled += 1
        if latency_ms > self.max_cancellation_latency_ms:
            self.max_cancellation_latency_ms = latency_ms

    def admission_ratio(self, principal_class: str) -> float | None:
        arrivals = self.arrivals_by_class.get(principal_class, 0)
        if not arrivals:
            return None
        return self.admitted_by_class.get(principal_class, 0) / arrivals

    def observations(self, virtual_duration_ms: float) -> dict[str, Any]:
        """The ``observations`` object of a load result record."""
        return {
            "arrivals": self.arrivals,
            "attempts": self.attempts,
            "completed": self.completed,
            "failed": self.failed,
            "shed": self.shed,
            "cancelled": self.cancelled,
            "shedReasons": dict(sorted(self.shed_reasons.items())),
            "maximumActiveCalls": self.max_active,
            "maximumQueuedCalls": self.max_queued,
            "maximumEligibleLaneWaitMs": _exact(self.max_lane_wait_ms),
            "retryAmplificationRatio": (self.attempts / self.arrivals if self.arrivals else None),
            "maximumCancellationLatencyMs": _exact(self.max_cancellation_latency_ms),
            "quietPrincipalAdmissionRatio": self.admission_ratio("quiet"),
            "noisyPrincipalAdmissionRatio": self.admission_ratio("noisy"),
            "virtualDurationMs": _exact(virtual_duration_ms),
        }


def _exact(value: float) -> float | int:
    # Virtual milliseconds are usually whole; write them as integers so records read cleanly.
    return int(value) if float(value).is_integer() else value
