"""CancelSignal beyond the basics: its repr, what a failing callback logs, timeouts shorter than
a millisecond, and awaiters that give up."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import weakref

import pytest

from admission.core.clock import VirtualTimeLoop
from admission.core.signal import CancelSignal


def run(coro_fn):
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro_fn())


def test_repr_shows_the_state_and_the_reason():
    signal = CancelSignal()
    assert repr(signal) == "<CancelSignal pending>"
    signal.cancel("caller gave up")
    assert repr(signal) == "<CancelSignal cancelled reason='caller gave up'>"


def test_a_failing_callback_is_logged_by_name(caplog):
    signal = CancelSignal()

    def release_slot(_signal: CancelSignal) -> None:
        raise KeyError("slot")

    signal.add_callback(release_slot)
    with caplog.at_level(logging.ERROR, logger="admission.core.signal"):
        signal.cancel("stop")
    [record] = caplog.records
    assert record.name == "admission.core.signal"
    assert record.getMessage() == f"CancelSignal callback {release_slot!r} failed"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_a_callback_added_after_firing_that_fails_is_logged_too(caplog):
    signal = CancelSignal()
    signal.cancel()

    def late(_signal: CancelSignal) -> None:
        raise ValueError("late")

    with caplog.at_level(logging.ERROR, logger="admission.core.signal"):
        unsubscribe = signal.add_callback(late)
    unsubscribe()
    assert [r.getMessage() for r in caplog.records] == [f"CancelSignal callback {late!r} failed"]


def test_a_nan_timeout_is_refused_with_a_message():
    with pytest.raises(ValueError) as raised:
        CancelSignal.timeout(math.nan)
    assert str(raised.value) == "delay_ms must not be NaN"


@pytest.mark.parametrize("delay_ms", [0.5, 1, 1.5])
def test_timeouts_of_about_a_millisecond_wait_their_delay(delay_ms):
    async def main():
        clock = asyncio.get_running_loop().clock
        signal = CancelSignal.timeout(delay_ms, reason="short")
        pending = not signal.cancelled
        reason = await signal
        return pending, reason, clock.monotonic_ms()

    assert run(main) == (True, "short", delay_ms)


def test_an_awaiter_that_gives_up_leaves_nothing_behind_on_a_long_lived_signal():
    # A process-wide signal outlives the loops that await it; an awaiter timing out must not
    # leave its future (and so its loop) attached to the signal.
    shutdown = CancelSignal()

    async def main() -> float:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(shutdown, 1)
        return asyncio.get_running_loop().time()

    loop = VirtualTimeLoop()
    try:
        assert loop.run_until_complete(main()) == 3.0
    finally:
        loop.close()
    loop_ref = weakref.ref(loop)
    del loop
    gc.collect()
    assert loop_ref() is None
    assert not shutdown.cancelled
    shutdown.cancel("bye")
    assert shutdown.reason == "bye"


def test_an_awaiter_that_gives_up_does_not_hold_back_the_others():
    async def main():
        signal = CancelSignal()
        quitter = asyncio.ensure_future(asyncio.wait_for(signal, 1))
        stayer = asyncio.ensure_future(signal)
        with pytest.raises(TimeoutError):
            await quitter
        asyncio.get_running_loop().call_later(1, signal.cancel, "now")
        return await stayer, asyncio.get_running_loop().time()

    assert run(main) == ("now", 2.0)
