import asyncio
import gc
import logging
import weakref

import pytest

from admission.core.clock import VirtualTimeLoop
from admission.core.signal import CancelSignal


def run(coro_fn):
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro_fn())


def test_first_reason_wins_and_cancel_is_idempotent():
    signal = CancelSignal()
    assert not signal.cancelled
    assert signal.reason is None
    signal.cancel("deadline-exceeded")
    signal.cancel("caller")
    signal.cancel()
    assert signal.cancelled
    assert signal.reason == "deadline-exceeded"


def test_default_reason():
    signal = CancelSignal()
    signal.cancel()
    assert signal.reason == "cancelled"


def test_callbacks_run_once_synchronously_in_order():
    signal = CancelSignal()
    calls: list[tuple[str, str | None]] = []
    signal.add_callback(lambda s: calls.append(("a", s.reason)))
    signal.add_callback(lambda s: calls.append(("b", s.reason)))
    signal.cancel("stop")
    assert calls == [("a", "stop"), ("b", "stop")]
    signal.cancel("again")
    assert calls == [("a", "stop"), ("b", "stop")]


def test_callback_added_after_firing_runs_at_once():
    signal = CancelSignal()
    signal.cancel("late")
    seen: list[CancelSignal] = []
    unsubscribe = signal.add_callback(seen.append)
    assert seen == [signal]
    unsubscribe()
    assert seen == [signal]


def test_unsubscribe_prevents_the_call_and_is_idempotent():
    signal = CancelSignal()
    calls: list[str] = []
    unsubscribe = signal.add_callback(lambda s: calls.append("removed"))
    signal.add_callback(lambda s: calls.append("kept"))
    unsubscribe()
    unsubscribe()
    signal.cancel()
    unsubscribe()
    assert calls == ["kept"]


def test_a_failing_callback_is_logged_and_does_not_stop_the_others(caplog):
    signal = CancelSignal()
    calls: list[str] = []

    def boom(_signal: CancelSignal) -> None:
        raise ValueError("boom")

    signal.add_callback(boom)
    signal.add_callback(lambda s: calls.append("after"))
    with caplog.at_level(logging.ERROR, logger="admission.core.signal"):
        signal.cancel()
    assert calls == ["after"]
    assert any("callback" in record.getMessage() for record in caplog.records)
    assert caplog.records[0].exc_info is not None


def test_construction_and_composition_need_no_event_loop():
    a = CancelSignal()
    composed = CancelSignal.any(a, None)
    a.cancel("x")
    assert composed.reason == "x"


def test_awaiting_before_the_signal_fires_wakes_every_awaiter():
    async def main():
        signal = CancelSignal()
        loop = asyncio.get_running_loop()
        waiters = [asyncio.create_task(_await(signal)) for _ in range(3)]
        loop.call_later(2, signal.cancel, "shutdown")
        return await asyncio.gather(*waiters), loop.time()

    assert run(main) == ([("shutdown", 2.0)] * 3, 2.0)


async def _await(signal: CancelSignal) -> tuple[str, float]:
    reason = await signal
    return reason, asyncio.get_running_loop().time()


def test_awaiting_an_already_fired_signal_returns_at_once_without_a_loop():
    signal = CancelSignal()
    signal.cancel("done")

    async def wait() -> str:
        return await signal

    coro = wait()
    with pytest.raises(StopIteration) as stop:
        coro.send(None)
    assert stop.value.value == "done"


def test_cancelling_one_awaiter_leaves_the_others_waiting():
    async def main():
        signal = CancelSignal()
        first = asyncio.create_task(_await(signal))
        second = asyncio.create_task(_await(signal))
        await asyncio.sleep(1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(1)
        assert not second.done()
        signal.cancel("later")
        return await second

    assert run(main) == ("later", 2.0)


def test_any_fires_with_the_reason_of_the_input_that_fired():
    a, b, c = CancelSignal(), CancelSignal(), CancelSignal()
    composed = CancelSignal.any(a, None, b, c)
    assert not composed.cancelled
    b.cancel("caller")
    a.cancel("deadline-exceeded")
    assert composed.reason == "caller"
    assert not c.cancelled


def test_any_with_an_already_fired_input_is_fired_at_once():
    a, b, c = CancelSignal(), CancelSignal(), CancelSignal()
    c.cancel("third")
    b.cancel("second")
    composed = CancelSignal.any(a, b, c)
    assert composed.reason == "second"
    # Nothing was attached to the inputs, so nothing keeps the composed signal alive.
    ref = weakref.ref(CancelSignal.any(a, b, c))
    gc.collect()
    assert ref() is None


def test_any_of_nothing_never_fires_by_itself():
    composed = CancelSignal.any(None, None)
    assert not composed.cancelled
    composed.cancel("manual")
    assert composed.reason == "manual"


def test_cancelling_the_composed_signal_leaves_its_inputs_alone():
    a, b = CancelSignal(), CancelSignal()
    composed = CancelSignal.any(a, b)
    composed.cancel("child done")
    assert not a.cancelled
    assert not b.cancelled
    a.cancel("late")
    assert composed.reason == "child done"


def test_any_composes_with_itself():
    a, b, c = CancelSignal(), CancelSignal(), CancelSignal()
    outer = CancelSignal.any(CancelSignal.any(a, b), c)
    a.cancel("deep")
    assert outer.reason == "deep"


def test_composed_signal_is_referenced_by_live_inputs_until_it_fires():
    a, b = CancelSignal(), CancelSignal()
    ref = weakref.ref(CancelSignal.any(a, b))
    gc.collect()
    assert ref() is not None
    a.cancel("fired")
    gc.collect()
    # b is still live, yet no longer holds the composed signal.
    assert ref() is None
    assert not b.cancelled


def test_dispose_detaches_the_composed_signal_from_its_inputs():
    a, b = CancelSignal(), CancelSignal()
    composed = CancelSignal.any(a, b)
    composed.dispose()
    composed.dispose()
    a.cancel("too late")
    assert not composed.cancelled
    ref = weakref.ref(composed)
    del composed
    gc.collect()
    assert ref() is None


def test_many_short_lived_compositions_do_not_accumulate_on_a_long_lived_input():
    caller = CancelSignal()
    for _ in range(1000):
        attempt = CancelSignal()
        composed = CancelSignal.any(caller, attempt)
        attempt.cancel("attempt over")
        assert composed.reason == "attempt over"
    ref = weakref.ref(composed)
    del composed
    gc.collect()
    assert ref() is None
    fired: list[str | None] = []
    caller.add_callback(lambda s: fired.append(s.reason))
    caller.cancel("end")
    assert fired == ["end"]


def test_timeout_fires_at_exactly_the_virtual_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1)
        signal = CancelSignal.timeout(250)
        assert not signal.cancelled
        reason = await signal
        return reason, loop.time(), loop.clock.monotonic_ms()

    assert run(main) == ("deadline-exceeded", 1.25, 1250.0)


def test_timeout_with_a_custom_reason_and_awkward_delay():
    async def main():
        loop = asyncio.get_running_loop()
        signal = CancelSignal.timeout(7.3, reason="target-deadline")
        fired_at: list[float] = []
        signal.add_callback(lambda s: fired_at.append(loop.clock.monotonic_ms()))
        await asyncio.sleep(1)
        return signal.reason, fired_at

    assert run(main) == ("target-deadline", [7.3])


def test_disposing_a_timeout_cancels_its_timer():
    async def main():
        signal = CancelSignal.timeout(500)
        signal.dispose()
        await asyncio.sleep(1)
        assert not signal.cancelled
        # With the timer gone, waiting on the signal can only deadlock.
        await signal

    with pytest.raises(RuntimeError, match=r"virtual time deadlock: .* t=1\.0s"):
        run(main)


def test_firing_a_timeout_by_hand_cancels_its_timer():
    async def main():
        signal = CancelSignal.timeout(500)
        signal.cancel("caller")
        assert signal.reason == "caller"
        # No timer is left, so the loop cannot jump to t=0.5 while waiting.
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match=r"virtual time deadlock: .* t=0\.0s"):
        run(main)


def test_timeout_of_zero_or_less_fires_at_once_and_infinity_never():
    assert CancelSignal.timeout(0).reason == "deadline-exceeded"
    assert CancelSignal.timeout(-5, reason="late").reason == "late"
    assert not CancelSignal.timeout(float("inf")).cancelled
    with pytest.raises(ValueError):
        CancelSignal.timeout(float("nan"))


def test_timeout_needs_a_running_loop():
    with pytest.raises(RuntimeError):
        CancelSignal.timeout(10)


def test_composed_caller_and_deadline_signals():
    async def main():
        loop = asyncio.get_running_loop()
        caller = CancelSignal()
        total = CancelSignal.timeout(3000)
        target = CancelSignal.timeout(1000, reason="target-deadline")
        composed = CancelSignal.any(caller, total, target)
        reason = await composed
        at = loop.time()
        total.dispose()
        target.dispose()
        return reason, at

    assert run(main) == ("target-deadline", 1.0)
