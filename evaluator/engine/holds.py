"""Permits of aborted calls that the provider may still be working on.

Aborting a call that was already sent (a cancel, a lost admission lease, a run taken away from
its worker, a shutdown) ends it on our side only: the provider may go on working on it until the
call's own timeout would have ended it. Its admission permit is therefore held until then and
released afterwards, so no abort lets the provider see more calls than its ceiling. A hold is a
timer on the event loop that runs the attempt's release; this module keeps them per loop so a
stopping worker knows how long its permits must live.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

__all__ = ["hold_release", "holds_pending", "last_hold_end"]

_holds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.TimerHandle]] = (
    weakref.WeakKeyDictionary()
)


def hold_release(delay_s: float, release: Callable[[], None]) -> None:
    """Run ``release`` on the running loop after ``delay_s`` seconds (at once when not positive)."""
    if delay_s <= 0:
        release()
        return
    loop = asyncio.get_running_loop()
    pending = _holds.setdefault(loop, set())
    handle: asyncio.TimerHandle

    def fire() -> None:
        pending.discard(handle)
        release()

    handle = loop.call_later(delay_s, fire)
    pending.add(handle)


def holds_pending(loop: asyncio.AbstractEventLoop) -> int:
    """How many permits of aborted calls ``loop`` still holds."""
    return len(_holds.get(loop, ()))


def last_hold_end(loop: asyncio.AbstractEventLoop) -> float | None:
    """The loop time at which the last held permit is released, None when none is held."""
    pending = _holds.get(loop)
    if not pending:
        return None
    return max(handle.when() for handle in pending)
