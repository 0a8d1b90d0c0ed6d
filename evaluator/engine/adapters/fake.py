"""A deterministic adapter for tests and the load harness: scripted latency, failures, usage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evaluator.engine.adapters.base import AdapterCall, AdapterError, AdapterResponse

__all__ = ["FakeAdapter", "FakeCall", "FakeStep"]


@dataclass(frozen=True, slots=True)
class FakeStep:
    """What one call does: wait ``latency_ms`` on the running loop's clock, then answer or fail.

    ``error`` is an adapter error kind (``rate-limited``, ``server-error``, ``client-error``,
    ``connect-error``, ``bad-response``, ``uncertain``); ``hang`` never answers until the
    evaluator cancels the call. ``answer`` defaults to the decision's first allowed output.
    """

    latency_ms: float = 0.0
    answer: Any = None
    error: str | None = None
    retry_after_ms: float | None = None
    tokens: int | None = None
    hang: bool = False


@dataclass(slots=True)
class FakeCall:
    """One call the fake adapter received, with virtual start and end times in milliseconds."""

    decision_id: str
    model: str
    attempt: int
    started_ms: float
    ended_ms: float | None = None
    result: str = "pending"


class FakeAdapter:
    """Answers from a script: per decision id, a list of steps consumed call by call.

    ``responder`` (a function of the ``AdapterCall``) takes precedence over the script; when
    neither says anything, ``default`` applies. The adapter records every call in ``calls`` and
    the highest number of calls it ever had in flight in ``max_active``.
    """

    # Its "provider" is this coroutine: it stops working on a call the moment the call is
    # aborted, so an aborted call's permit is released at once (evaluator/engine/holds.py).
    abort_cutoff_ms = 0.0

    def __init__(
        self,
        script: Mapping[str, Sequence[FakeStep]] | None = None,
        *,
        default: FakeStep | None = None,
        responder: Callable[[AdapterCall], FakeStep] | None = None,
        idempotent: bool = False,
    ) -> None:
        self._script = {key: list(steps) for key, steps in (script or {}).items()}
        self._default = default or FakeStep()
        self._responder = responder
        self.idempotent = idempotent
        self.calls: list[FakeCall] = []
        self.active = 0
        self.max_active = 0

    def _step_for(self, call: AdapterCall) -> FakeStep:
        if self._responder is not None:
            return self._responder(call)
        steps = self._script.get(call.decision_id)
        if steps:
            return steps.pop(0)
        return self._default

    async def invoke(self, call: AdapterCall) -> AdapterResponse:
        """Play the next step for ``call.decision_id``."""
        step = self._step_for(call)
        loop = asyncio.get_running_loop()
        record = FakeCall(call.decision_id, call.target.model, call.attempt, loop.time() * 1000.0)
        self.calls.append(record)
        self.active += 1
        if self.active > self.max_active:
            self.max_active = self.active
        try:
            if step.hang:
                await loop.create_future()
            elif step.latency_ms > 0:
                await asyncio.sleep(step.latency_ms / 1000.0)
            response = self._finish(step, call)
            record.result = "answered"
            return response
        except AdapterError as error:
            record.result = error.kind
            raise
        except asyncio.CancelledError:
            record.result = "cancelled"
            raise
        finally:
            self.active -= 1
            record.ended_ms = loop.time() * 1000.0

    @staticmethod
    def _finish(step: FakeStep, call: AdapterCall) -> AdapterResponse:
        if step.error is not None:
            raise _error_for(step)
        answer = step.answer
        if answer is None and call.output.allowed_outputs:
            answer = call.output.allowed_outputs[0]
        return AdapterResponse(answer=answer, total_tokens=step.tokens)

    def __repr__(self) -> str:
        return f"FakeAdapter(calls={len(self.calls)}, idempotent={self.idempotent!r})"


def _error_for(step: FakeStep) -> AdapterError:
    kind = step.error
    if kind == "rate-limited":
        return AdapterError.rate_limited(retry_after_ms=step.retry_after_ms)
    if kind == "server-error":
        return AdapterError.server_error(status_code=503, retry_after_ms=step.retry_after_ms)
    if kind == "client-error":
        return AdapterError.client_error()
    if kind == "connect-error":
        return AdapterError.connect_error()
    if kind == "bad-response":
        return AdapterError.bad_response()
    if kind == "uncertain":
        return AdapterError.uncertain()
    if kind == "misconfigured":
        return AdapterError.misconfigured()
    raise ValueError(f"unknown fake error kind {kind!r}")
