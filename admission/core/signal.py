"""CancelSignal: an awaitable, composable cancellation token."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["CancelSignal"]

logger = logging.getLogger(__name__)

# Subscription tokens; unique across signals, so a stale unsubscribe can never remove a newer one.
_tokens = itertools.count()


def _already_fired() -> None:
    return None


class CancelSignal:
    """A one-shot cancellation token.

    ``cancel(reason)`` fires it; the first reason wins and later calls do nothing. Callbacks
    registered with ``add_callback`` run synchronously, once, when it fires; ``await signal``
    returns the reason. ``CancelSignal.any(...)`` composes signals and ``CancelSignal.timeout(...)``
    fires on the running loop after a delay. Nothing touches an event loop unless the signal is
    awaited or timed. Not thread-safe: use it from the thread of the loop that awaits it.
    """

    __slots__ = ("__weakref__", "_callbacks", "_detach", "_reason", "_timer", "_waiters")

    def __init__(self) -> None:
        self._reason: str | None = None
        self._callbacks: dict[int, Callable[[CancelSignal], object]] | None = None
        self._waiters: set[asyncio.Future[None]] | None = None
        # Unsubscribe functions from the parents of a composed signal.
        self._detach: list[Callable[[], None]] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def cancelled(self) -> bool:
        """Whether the signal has fired."""
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        """The reason it fired with, or None while it has not fired."""
        return self._reason

    def cancel(self, reason: str = "cancelled") -> None:
        """Fire the signal with ``reason``; does nothing if it has already fired."""
        if self._reason is not None:
            return
        self._reason = reason
        self.dispose()
        waiters, self._waiters = self._waiters, None
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for callback in callbacks.values():
                self._run_callback(callback)

    def add_callback(self, callback: Callable[[CancelSignal], object]) -> Callable[[], None]:
        """Call ``callback(signal)`` once when it fires (now, if it has fired already).

        Returns a function that unsubscribes the callback; calling it again does nothing. An
        exception raised by a callback is logged and does not stop the other callbacks.
        """
        if self._reason is not None:
            self._run_callback(callback)
            return _already_fired
        if self._callbacks is None:
            self._callbacks = {}
        token = next(_tokens)
        self._callbacks[token] = callback

        def unsubscribe() -> None:
            if self._callbacks is not None:
                self._callbacks.pop(token, None)

        return unsubscribe

    def dispose(self) -> None:
        """Detach from parent signals and cancel the timer, without firing; idempotent."""
        detach, self._detach = self._detach, None
        if detach:
            for unsubscribe in detach:
                unsubscribe()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def __await__(self) -> Generator[Any, None, str]:
        if self._reason is None:
            # One future per awaiter: cancelling one awaiting task must not cancel the others.
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = set()
            self._waiters.add(waiter)
            try:
                yield from waiter
            finally:
                if self._waiters is not None:
                    self._waiters.discard(waiter)
        assert self._reason is not None
        return self._reason

    @classmethod
    def any(cls, *signals: CancelSignal | None) -> CancelSignal:
        """A signal that fires, with that signal's reason, as soon as any of ``signals`` fires.

        ``None`` entries are ignored; if an input has already fired, the result is fired at once
        with the reason of the first such input. The result detaches from every input when it
        fires, or earlier on ``dispose()``; cancelling it does not cancel its inputs.
        """
        composed = cls()
        parents: dict[int, CancelSignal] = {}
        for signal in signals:
            if signal is None:
                continue
            if signal._reason is not None:
                composed.cancel(signal._reason)
                return composed
            parents[id(signal)] = signal
        if parents:
            on_fire = composed._parent_fired
            composed._detach = [parent.add_callback(on_fire) for parent in parents.values()]
        return composed

    @classmethod
    def timeout(cls, delay_ms: float, reason: str = "deadline-exceeded") -> CancelSignal:
        """A signal that fires with ``reason`` after ``delay_ms`` on the running loop.

        A delay of zero or less fires it at once; an infinite delay never does. ``dispose()``, or
        firing it by other means, cancels the timer.
        """
        if math.isnan(delay_ms):
            raise ValueError("delay_ms must not be NaN")
        signal = cls()
        if delay_ms <= 0:
            signal.cancel(reason)
        elif not math.isinf(delay_ms):
            loop = asyncio.get_running_loop()
            signal._timer = loop.call_later(delay_ms / 1000, signal.cancel, reason)
        return signal

    def _parent_fired(self, parent: CancelSignal) -> None:
        assert parent._reason is not None
        self.cancel(parent._reason)

    def _run_callback(self, callback: Callable[[CancelSignal], object]) -> None:
        try:
            callback(self)
        except Exception:
            logger.exception("CancelSignal callback %r failed", callback)

    def __repr__(self) -> str:
        state = f"cancelled reason={self._reason!r}" if self._reason is not None else "pending"
        return f"<CancelSignal {state}>"
