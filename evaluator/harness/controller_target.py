"""The admission-controller path: the whole load + spike + soak schedule on virtual time.

Every arrival is one invocation with its own budget id. Its attempts ask the controller for a
lease, hold it for the arrival's service time on a fake provider, and release it with the
outcome. A first-attempt failure is released as a provider failure and retried once after
``retryBackoffMs``; a cancellation fires the arrival's ``CancelSignal`` at ``cancelAtMs``, which
stops the call wherever it is (queued, in flight or in its backoff).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from functools import partial
from typing import Any

from admission.core import (
    AdmissionRejected,
    AdmissionRequest,
    CancelSignal,
    Estimate,
)
from evaluator.harness.arrivals import Arrival
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.replay import WORKSPACE_ID, TimelineDriver
from evaluator.harness.stepping import advance
from evaluator.harness.target import LoadTarget, Progress, TargetRun

__all__ = [
    "CONTROLLER_TARGET",
    "WORKSPACE_ID",
    "ControllerDriver",
    "estimate_for",
    "run_controller_target",
    "schedule_end_ms",
]

# Dollars per estimated token: the manifests pin cost ceilings but no price, so the harness
# declares one; every estimate is known, because unknown cost fails closed under maxCostUsd.
USD_PER_TOKEN = 0.000002

# Asking for a lease, waiting in the controller's queue, holding one, backing off, stopped.
_ASKING, _WAITING, _ACTIVE, _BACKOFF, _DONE = range(5)


def estimate_for(tokens: int) -> Estimate:
    """The estimate an attempt presents: its tokens, their price, one unit of retained work."""
    return Estimate(
        tokens=tokens,
        cost_usd=tokens * USD_PER_TOKEN,
        retained_work=1,
        attempts=1,
    )


def schedule_end_ms(manifest: LoadManifest) -> float:
    """load + spike + soak: the controller path's window."""
    duration = manifest.section("duration")
    seconds = duration["loadSeconds"] + duration["spikeSeconds"] + duration["soakSeconds"]
    return float(seconds) * 1000.0


class _Call:
    """One arrival's life: attempts, lease, timers and where it stands."""

    __slots__ = (
        "acquiring",
        "arrival",
        "attempt",
        "budget_id",
        "ever_admitted",
        "lease",
        "requested_ms",
        "signal",
        "state",
        "timer",
    )

    def __init__(self, arrival: Arrival) -> None:
        self.arrival = arrival
        self.acquiring: Any = None
        self.budget_id = f"arrival-{arrival.ordinal}"
        self.attempt = 0
        self.ever_admitted = False
        self.lease: Any = None
        self.requested_ms = 0.0
        self.signal: CancelSignal | None = None
        self.state = _ASKING
        self.timer: asyncio.TimerHandle | None = None


class ControllerDriver(TimelineDriver):
    """Releases arrivals into one ``AdmissionController`` and counts what happens."""

    def __init__(
        self,
        manifest: LoadManifest,
        arrivals: Iterable[Arrival],
        end_ms: float,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(manifest, arrivals, end_ms, progress)
        self.backoff_s = self.backoff_ms / 1000.0
        # Estimates are read, never kept, by the controller: one per token size serves every call.
        self._estimates: dict[int, Estimate] = {}
        self._open_calls = 0

    def _idle(self) -> bool:
        return self._open_calls == 0

    def _arrive(self, arrival: Arrival) -> None:
        self.tally.arrive(arrival.principal_class)
        self._open_calls += 1
        call = _Call(arrival)
        if arrival.cancel_at_ms is not None:
            delay_ms = arrival.cancel_at_ms - self.loop.clock.monotonic_ms()
            signal = CancelSignal.timeout(delay_ms, reason="cancelled")
            signal.add_callback(lambda _signal: self._on_cancel(call))
            call.signal = signal
        self._attempt(call)

    def _attempt(self, call: _Call) -> None:
        arrival = call.arrival
        call.attempt += 1
        call.state = _ASKING
        call.timer = None
        call.requested_ms = self.clock.monotonic_ms()
        self.tally.attempts += 1
        request = AdmissionRequest(
            call.budget_id,
            arrival.principal_id,
            WORKSPACE_ID,
            arrival.provider_id,
            self._estimate(arrival.tokens),
            signal=call.signal,
        )
        call.acquiring = self.controller.acquire(request)
        if not self._step(call):
            call.state = _WAITING
            self.tally.enqueue()

    def _estimate(self, tokens: int) -> Estimate:
        estimate = self._estimates.get(tokens)
        if estimate is None:
            estimate = self._estimates[tokens] = estimate_for(tokens)
        return estimate

    def _step(self, call: _Call) -> bool:
        finished = advance(call.acquiring, self.loop, partial(self._step, call))
        if finished is None:
            return False
        self._settle(call)
        if finished.error is None:
            self._admitted(call, finished.value)
        elif isinstance(finished.error, AdmissionRejected):
            self._rejected(call, finished.error)
        else:
            self._fail(finished.error)
        return True

    def _settle(self, call: _Call) -> None:
        if call.state == _WAITING:
            self.tally.dequeue()
        call.acquiring = None

    def _admitted(self, call: _Call, lease: Any) -> None:
        tally = self.tally
        now_ms = self.clock.monotonic_ms()
        tally.lane_wait(now_ms - call.requested_ms)
        if not call.ever_admitted:
            call.ever_admitted = True
            tally.admitted_once(call.arrival.principal_class)
        tally.activate()
        call.lease = lease
        call.state = _ACTIVE
        signal = call.signal
        if signal is not None and signal.cancelled:
            # Fired between the controller's grant and this callback: stop before dispatch.
            self._stop_cancelled(call)
            return
        call.timer = self.loop.call_later(call.arrival.service_ms / 1000.0, self._served, call)

    def _served(self, call: _Call) -> None:
        call.timer = None
        lease, call.lease = call.lease, None
        self.tally.deactivate()
        if call.attempt == 1 and call.arrival.fails_first_attempt:
            lease.release(success=False)
            if call.attempt <= self.max_retries:
                call.state = _BACKOFF
                call.timer = self.loop.call_later(self.backoff_s, self._attempt, call)
                return
            self.tally.failed += 1
        else:
            lease.release(success=True)
            self.tally.completed += 1
        self._finish(call)

    def _rejected(self, call: _Call, rejection: AdmissionRejected) -> None:
        if rejection.reason == "cancelled":
            self.tally.cancel(self._cancellation_latency(call))
        else:
            self.tally.shed_for(rejection.reason)
        self._finish(call)

    def _on_cancel(self, call: _Call) -> None:
        # A waiting call is stopped by the controller itself, which rejects it as cancelled.
        if call.state in (_ACTIVE, _BACKOFF):
            self._stop_cancelled(call)

    def _stop_cancelled(self, call: _Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.state == _ACTIVE:
            lease, call.lease = call.lease, None
            # No outcome: a caller's cancellation is never a provider failure.
            lease.release(success=None)
            self.tally.deactivate()
        self.tally.cancel(self._cancellation_latency(call))
        self._finish(call)

    def _cancellation_latency(self, call: _Call) -> float:
        cancel_at = call.arrival.cancel_at_ms
        assert cancel_at is not None
        return max(0.0, self.clock.monotonic_ms() - cancel_at)

    def _finish(self, call: _Call) -> None:
        call.state = _DONE
        if call.signal is not None:
            call.signal.dispose()
        self.controller.release_budget(call.budget_id)
        self._open_calls -= 1
        self._check_drained()


def run_controller_target(
    manifest: LoadManifest, arrivals: Iterable[Arrival], progress: Progress | None = None
) -> TargetRun:
    """Release ``arrivals`` into one controller over the load + spike + soak window."""
    return ControllerDriver(manifest, arrivals, schedule_end_ms(manifest), progress).run()


CONTROLLER_TARGET = LoadTarget(
    name="admission-controller", window_end_ms=schedule_end_ms, run=run_controller_target
)
