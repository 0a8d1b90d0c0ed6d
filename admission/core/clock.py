"""Clocks for the admission core: the system clocks and an asyncio event loop on virtual time.

`VirtualTimeLoop` is the one place the core relies on asyncio below its public API (the
selector it swaps, the ready queue, timer handles' flags);
`tests/admission/core/test_clock.py::test_the_asyncio_internals_virtual_time_relies_on` names each
of them, so a Python upgrade that moves one fails there.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import selectors
import time
from asyncio import events
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from contextvars import Context
from typing import (
    TYPE_CHECKING,
    Any,
    Protocol,
    TypeVar,
    TypeVarTuple,
    Unpack,
    cast,
    runtime_checkable,
)

__all__ = ["Clock", "SystemClock", "VirtualClock", "VirtualTimeLoop"]

# 2026-01-01T00:00:00Z, so virtual records carry plausible timestamps.
DEFAULT_START_EPOCH_MS = 1_767_225_600_000.0

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_NS_PER_S = 1_000_000_000
# How long to wait for real descriptors before calling an idle loop deadlocked.
_REAL_IO_GRACE_S = 1.0
# Rebuild the timer heap once more than half of at least this many timers are cancelled.
_PURGE_MIN_TIMERS = 100


@runtime_checkable
class Clock(Protocol):
    """A source of time in milliseconds."""

    def monotonic_ms(self) -> float:
        """Milliseconds on a monotonic scale; used for scheduling and deadlines."""
        ...

    def epoch_ms(self) -> float:
        """Milliseconds since the Unix epoch; used for timestamps in records."""
        ...


class SystemClock:
    """The process's real clocks; agrees with the default asyncio loop's ``time()``."""

    __slots__ = ()

    def monotonic_ms(self) -> float:
        """``time.monotonic()`` in milliseconds."""
        return time.monotonic() * 1000.0

    def epoch_ms(self) -> float:
        """``time.time()`` in milliseconds."""
        return time.time() * 1000.0

    def __repr__(self) -> str:
        return "SystemClock()"


class VirtualClock:
    """The clock of a :class:`VirtualTimeLoop`; read it through ``loop.clock``."""

    __slots__ = ("_loop", "start_epoch_ms")

    def __init__(self, loop: VirtualTimeLoop, start_epoch_ms: float) -> None:
        self._loop = loop
        self.start_epoch_ms = start_epoch_ms

    def monotonic_ms(self) -> float:
        """Virtual milliseconds since the loop was created (``loop.time() * 1000``)."""
        return self._loop._now_ns / 1_000_000

    def epoch_ms(self) -> float:
        """``start_epoch_ms`` plus the virtual milliseconds elapsed."""
        return self.start_epoch_ms + self._loop._now_ns / 1_000_000

    def __repr__(self) -> str:
        return f"VirtualClock(monotonic_ms={self.monotonic_ms()!r})"


# Whole nanoseconds as an int, or +/-inf for an unbounded time.
def _seconds_to_ns(seconds: float) -> float:
    if seconds != seconds:
        raise ValueError("time must not be NaN")
    if math.isinf(seconds):
        return seconds
    return round(seconds * _NS_PER_S)


# Wraps the real selector: an idle select() moves virtual time instead of sleeping.
class _VirtualSelector:
    __slots__ = ("_loop", "_real", "_registered", "_signal_handlers")

    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._real = real
        self._loop = loop
        # Counted here because len(get_map()) is too slow to ask on every iteration.
        self._registered = len(real.get_map())
        # The Unix loop's handler dict, mutated in place; signals arrive through the self-pipe.
        self._signal_handlers: dict[Any, Any] = getattr(loop, "_signal_handlers", {})

    def register(self, fileobj: Any, events_mask: int, data: Any = None) -> selectors.SelectorKey:
        key = self._real.register(fileobj, events_mask, data)
        self._registered += 1
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        key = self._real.unregister(fileobj)
        self._registered -= 1
        return key

    def modify(self, fileobj: Any, events_mask: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events_mask, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # asyncio's own timeout is ignored: the loop keeps its timers in its own heap (_timers).
        loop = self._loop
        real = self._real
        timers = loop._timers
        pop = heapq.heappop
        if loop._timers_cancelled > _PURGE_MIN_TIMERS and loop._timers_cancelled * 2 > len(timers):
            loop._purge_cancelled_timers()
        while timers and timers[0][2]._cancelled:
            pop(timers)[2]._scheduled = False
            loop._timers_cancelled -= 1
        now: float = loop._now_ns
        # Only the self-pipe registered and no signal handlers: nothing real can become ready.
        poll = self._registered > 1 or bool(self._signal_handlers)
        if not loop._ready and not loop._stopping and (not timers or timers[0][0] > now):
            if loop._threads_pending:
                # Virtual time stands still while executor threads work, so they take no time.
                return real.select(None)
            event_list = real.select(0) if poll else []
            if event_list:
                return event_list
            if not timers or timers[0][0] == math.inf:
                if self._registered > 1:
                    event_list = real.select(_REAL_IO_GRACE_S)
                    if event_list:
                        return event_list
                raise RuntimeError(loop._deadlock_message())
            now = timers[0][0]
            loop._now_ns = now
            loop._now = now / _NS_PER_S
        else:
            event_list = real.select(0) if poll else []
        ready = loop._ready
        while timers and timers[0][0] <= now:
            handle = pop(timers)[2]
            handle._scheduled = False
            if handle._cancelled:
                loop._timers_cancelled -= 1
            else:
                ready.append(handle)
        return event_list


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on virtual time, for tests and the load harness.

    Time starts at 0 and, when no callback is ready, jumps straight to the next timer instead of
    sleeping. Every ready callback runs before time moves; timers due at the same instant fire in
    the order they were scheduled. Time is kept in integer nanoseconds, so ``call_later`` chains
    land exactly where expected. ``loop.clock`` is the loop's :class:`Clock`.

    Jobs started with ``run_in_executor`` (and ``asyncio.to_thread``) freeze virtual time until
    their futures complete. When the loop would otherwise wait forever (nothing ready, no timer, no
    executor job) it raises ``RuntimeError("virtual time deadlock: ...")`` instead of hanging.
    """

    if TYPE_CHECKING:
        # asyncio internals this loop relies on; typeshed does not declare them.
        _ready: deque[events.Handle]
        _stopping: bool
        _debug: bool
        _selector: Any

        def _check_closed(self) -> None: ...
        def _check_thread(self) -> None: ...
        def _check_callback(self, callback: object, method: str) -> None: ...

    def __init__(self, start_epoch_ms: float = DEFAULT_START_EPOCH_MS) -> None:
        self._now_ns: float = 0
        self._now = 0.0
        self._threads_pending = 0
        self._sequence = itertools.count()
        # (when_ns, seq, handle): compared in C, and seq keeps equal deadlines in FIFO order.
        # asyncio's own _scheduled stays empty, so its float-seconds timer pass never fires.
        self._timers: list[tuple[float, int, Any]] = []
        self._timers_cancelled = 0
        super().__init__()
        self._selector = _VirtualSelector(self._selector, self)
        self.clock: Clock = VirtualClock(self, start_epoch_ms)

    def time(self) -> float:
        """Virtual seconds since the loop was created."""
        return self._now

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        """Schedule ``callback`` at virtual time ``when`` (seconds)."""
        if when is None:
            raise TypeError("when cannot be None")
        return self._schedule(_seconds_to_ns(when), callback, args, context)

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        """Schedule ``callback`` ``delay`` virtual seconds from now."""
        if delay is None:
            raise TypeError("delay must not be None")
        # Adding the delay in integer ns keeps long call_later chains exact.
        return self._schedule(self._now_ns + _seconds_to_ns(delay), callback, args, context)

    def _schedule(
        self,
        when_ns: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: Context | None,
    ) -> asyncio.TimerHandle:
        self._check_closed()
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
        when = when_ns if math.isinf(when_ns) else when_ns / _NS_PER_S
        timer = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._timers, (when_ns, next(self._sequence), timer))
        cast(Any, timer)._scheduled = True
        return timer

    def _timer_handle_cancelled(self, handle: Any) -> None:
        if handle._scheduled:
            self._timers_cancelled += 1

    def _purge_cancelled_timers(self) -> None:
        kept = []
        for entry in self._timers:
            if entry[2]._cancelled:
                entry[2]._scheduled = False
            else:
                kept.append(entry)
        heapq.heapify(kept)
        self._timers[:] = kept
        self._timers_cancelled = 0

    def close(self) -> None:
        """As asyncio's; also drops the pending timers."""
        super().close()
        self._timers.clear()

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[_Ts]], _T], *args: *_Ts
    ) -> asyncio.Future[_T]:
        """As asyncio's, and virtual time waits for the job to finish."""
        future = super().run_in_executor(executor, func, *args)
        self._threads_pending += 1
        future.add_done_callback(self._thread_finished)
        return future

    def _thread_finished(self, _future: asyncio.Future[Any]) -> None:
        self._threads_pending -= 1

    async def shutdown_default_executor(self, *args: Any, **kwargs: Any) -> None:
        """As asyncio's; its helper thread counts as an executor job."""
        self._threads_pending += 1
        try:
            await super().shutdown_default_executor(*args, **kwargs)
        finally:
            self._threads_pending -= 1

    def _deadlock_message(self) -> str:
        pending = [task for task in asyncio.all_tasks(self) if not task.done()]
        shown = ", ".join(repr(task) for task in pending[:3])
        more = f" and {len(pending) - 3} more" if len(pending) > 3 else ""
        return (
            "virtual time deadlock: nothing is ready, no timer is scheduled and no executor job "
            f"is running, so the loop would wait forever at t={self._now!r}s; "
            f"{len(pending)} pending task(s): {shown}{more}"
        )
