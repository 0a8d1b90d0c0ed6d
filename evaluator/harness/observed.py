"""Thin observers around the real registry, controller and adapters of the evaluator path.

The evaluator is run as it is; these wrappers only count, at every transition, how many
attempts wait in admission and how many adapter calls are in flight.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

from admission.core import AdmissionController, AdmissionRegistry
from evaluator.harness.tally import LoadTally

__all__ = ["ObservedAdapter", "ObservedController", "ObservedRegistry"]


class _ObservedAcquire:
    """Awaits ``controller.acquire`` step by step, so a suspension is seen as a queued call."""

    __slots__ = ("_acquiring", "_clock", "_tally")

    def __init__(self, acquiring: Coroutine[Any, Any, Any], tally: LoadTally, clock: Any) -> None:
        self._acquiring = acquiring
        self._tally = tally
        self._clock = clock

    def __await__(self) -> Generator[Any, Any, Any]:
        acquiring = self._acquiring
        tally = self._tally
        requested_ms = self._clock.monotonic_ms()
        queued = False
        try:
            try:
                awaited = acquiring.send(None)
            except StopIteration as granted:
                tally.lane_wait(0.0)
                return granted.value
            queued = True
            tally.enqueue()
            while True:
                # As ``yield from`` does: pass the future up, and anything thrown in back down.
                try:
                    yield awaited
                except GeneratorExit:
                    acquiring.close()
                    raise
                except BaseException as thrown:
                    try:
                        awaited = acquiring.throw(thrown)
                    except StopIteration as granted:
                        lease = granted.value
                        break
                else:
                    try:
                        awaited = acquiring.send(None)
                    except StopIteration as granted:
                        lease = granted.value
                        break
        finally:
            if queued:
                tally.dequeue()
        tally.lane_wait(self._clock.monotonic_ms() - requested_ms)
        return lease


class ObservedController:
    """The real controller, with ``acquire`` observed; everything else passes through."""

    def __init__(self, controller: AdmissionController, tally: LoadTally, clock: Any) -> None:
        self._controller = controller
        self._tally = tally
        self._clock = clock

    def acquire(self, request: Any) -> _ObservedAcquire:
        self._tally.attempts += 1
        return _ObservedAcquire(self._controller.acquire(request), self._tally, self._clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


class ObservedRegistry:
    """The real registry, handing out the observed controller of its workspace."""

    def __init__(self, registry: AdmissionRegistry, tally: LoadTally) -> None:
        self._registry = registry
        self._tally = tally
        self._controllers: dict[str, ObservedController] = {}

    def controller(self, workspace_id: str) -> ObservedController | None:
        observed = self._controllers.get(workspace_id)
        if observed is None:
            real = self._registry.controller(workspace_id)
            if real is None:
                return None
            observed = ObservedController(real, self._tally, self._registry.clock)
            self._controllers[workspace_id] = observed
        return observed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)


class ObservedAdapter:
    """An adapter whose calls in flight are counted."""

    def __init__(self, adapter: Any, tally: LoadTally) -> None:
        self._adapter = adapter
        self._tally = tally
        self.idempotent = bool(getattr(adapter, "idempotent", False))
        self.abort_cutoff_ms = getattr(adapter, "abort_cutoff_ms", None)

    async def invoke(self, call: Any) -> Any:
        self._tally.activate()
        try:
            return await self._adapter.invoke(call)
        finally:
            self._tally.deactivate()
