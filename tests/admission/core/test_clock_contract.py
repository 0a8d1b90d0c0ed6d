"""VirtualTimeLoop beyond the basics: argument errors, callback contexts, the deadlock message,
executor jobs, cancelled-timer purges and real descriptors.

Every test runs its loop under a watchdog: a background timer that stops the loop after ten real
seconds, so a regression that keeps virtual time from moving fails instead of hanging. A passing
test never waits for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import itertools
import math
import os
import signal
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

from admission.core.clock import SystemClock, VirtualTimeLoop

DEADLOCK_PREFIX = (
    "virtual time deadlock: nothing is ready, no timer is scheduled and no executor job is "
    "running, so the loop would wait forever at t="
)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


def run(coro_fn, watchdog_s: float = 10.0):
    loop = VirtualTimeLoop()
    watchdog = threading.Timer(watchdog_s, loop.call_soon_threadsafe, args=(loop.stop,))
    watchdog.start()
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        watchdog.cancel()
        loop.close()


def test_system_clock_repr():
    assert repr(SystemClock()) == "SystemClock()"


# ------------------------------------------------------------------ arguments and contexts


def test_call_at_and_call_later_refuse_none_with_a_type_error():
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(TypeError) as at:
            loop.call_at(None, lambda: None)  # type: ignore[arg-type]
        assert str(at.value) == "when cannot be None"
        with pytest.raises(TypeError) as later:
            loop.call_later(None, lambda: None)  # type: ignore[arg-type]
        assert str(later.value) == "delay must not be None"
        for schedule in (loop.call_at, loop.call_later):
            with pytest.raises(ValueError) as nan:
                schedule(math.nan, lambda: None)
            assert str(nan.value) == "time must not be NaN"
    finally:
        loop.close()


def test_in_debug_mode_coroutines_are_refused_as_timer_callbacks():
    async def not_a_callback() -> None:
        return None

    loop = VirtualTimeLoop()
    loop.set_debug(True)
    try:
        for schedule in (loop.call_at, loop.call_later):
            with pytest.raises(TypeError) as raised:
                schedule(1.0, not_a_callback)
            # The message asyncio's own loop gives, for either method.
            assert str(raised.value) == "coroutines cannot be used with call_at()"
    finally:
        loop.close()


def test_timers_run_in_the_context_they_were_given():
    seen: list[tuple[str, str, float]] = []

    async def main():
        loop = asyncio.get_running_loop()
        request_id.set("caller")
        given = contextvars.copy_context()
        given.run(request_id.set, "given")
        record = lambda kind: seen.append((kind, request_id.get(), loop.time()))  # noqa: E731
        loop.call_at(1.0, record, "at", context=given)
        loop.call_later(2.0, record, "later", context=given)
        loop.call_later(3.0, record, "default")
        await asyncio.sleep(5)

    run(main)
    assert seen == [("at", "given", 1.0), ("later", "given", 2.0), ("default", "caller", 3.0)]


def test_call_at_and_call_later_agree_on_virtual_instants():
    fired: list[tuple[str, float]] = []

    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.25)
        loop.call_later(0.5, lambda: fired.append(("later", loop.time())))
        loop.call_at(0.75, lambda: fired.append(("at", loop.time())))
        handle = loop.call_later(math.inf, lambda: fired.append(("never", loop.time())))
        # Handles report their deadline in virtual seconds, as asyncio's do.
        assert handle.when() == math.inf
        assert loop.call_later(0.5, lambda: None).when() == 0.75
        assert loop.call_at(1e-9, lambda: None).when() == 1e-9
        assert loop.call_at(-math.inf, lambda: None).when() == -math.inf
        await asyncio.sleep(1)
        handle.cancel()

    run(main)
    assert fired == [("later", 0.75), ("at", 0.75)]


# ------------------------------------------------------------------ the deadlock message


async def _stuck(never: asyncio.Future[None]) -> None:
    await asyncio.sleep(2.5)
    await never


def _deadlock(task_count: int) -> tuple[str, list[str], float]:
    """The deadlock message with `task_count` pending tasks, and the reprs of those tasks."""
    loop = VirtualTimeLoop()
    never = loop.create_future()
    for i in range(task_count):
        loop.create_task(_stuck(never), name=f"stuck-{i}")
    try:
        with pytest.raises(RuntimeError) as raised:
            loop.run_until_complete(loop.create_future())
        pending = asyncio.all_tasks(loop)
        reprs = [repr(task) for task in pending]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        return str(raised.value), reprs, loop.time()
    finally:
        loop.close()


def _assert_deadlock_message(message: str, reprs: list[str], at: float, suffix: str) -> None:
    head = f"{DEADLOCK_PREFIX}{at!r}s; {len(reprs)} pending task(s): "
    assert message.startswith(head)
    assert message.endswith(suffix)
    shown = message[len(head) : len(message) - len(suffix)]
    choices = {", ".join(chosen) for chosen in itertools.permutations(reprs, min(3, len(reprs)))}
    assert shown in choices


def test_a_deadlock_without_tasks_says_so():
    message, reprs, at = _deadlock(0)
    assert reprs == [] and at == 0.0
    assert message == f"{DEADLOCK_PREFIX}0.0s; 0 pending task(s): "


@pytest.mark.parametrize(
    ("task_count", "suffix"), [(1, ""), (2, ""), (3, ""), (4, " and 1 more"), (5, " and 2 more")]
)
def test_a_deadlock_message_names_up_to_three_pending_tasks(task_count, suffix):
    message, reprs, at = _deadlock(task_count)
    assert len(reprs) == task_count and at == 2.5
    _assert_deadlock_message(message, reprs, 2.5, suffix)
    named = sum(message.count(f"name='stuck-{i}'") for i in range(task_count))
    assert named == min(3, task_count)


# ------------------------------------------------------------------ executor jobs


def test_jobs_run_on_the_executor_they_were_given():
    async def main():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-io") as pool:
            name = await loop.run_in_executor(pool, lambda: threading.current_thread().name)
        return name, loop.time()

    name, at = run(main)
    assert name.startswith("sluice-io") and at == 0.0


def test_virtual_time_moves_again_once_concurrent_executor_jobs_are_done():
    async def main():
        loop = asyncio.get_running_loop()
        started = threading.Barrier(2)
        jobs = [loop.run_in_executor(None, started.wait, 10) for _ in range(2)]
        loop.call_later(60, lambda: None)
        await asyncio.gather(*jobs)
        frozen = loop.time()
        await asyncio.sleep(5)
        return frozen, loop.time()

    assert run(main) == (0.0, 5.0)


def test_a_job_holds_virtual_time_until_its_result_is_taken():
    async def main():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        job = loop.run_in_executor(None, release.wait, 10)
        # A timer due while the job runs fires only once the job is done.
        fired: list[bool] = []
        loop.call_later(1, lambda: fired.append(job.done()))
        release.set()
        assert await job is True
        await asyncio.sleep(2)
        return fired, loop.time()

    assert run(main) == ([True], 2.0)


def test_a_timer_due_now_fires_while_an_executor_job_runs():
    async def main():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        job = loop.run_in_executor(None, release.wait, 10)
        # The job waits for this timer: time stands still for the job, but what is due runs.
        loop.call_later(0, release.set)
        assert await job is True
        return loop.time()

    assert run(main) == 0.0


def test_the_default_executor_can_be_shut_down_mid_run_and_time_moves_on():
    async def main():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        job = loop.run_in_executor(None, release.wait, 10)
        shutdown = asyncio.ensure_future(loop.shutdown_default_executor())
        # Runs after the shutdown has started: the job ends while the shutdown waits for it.
        loop.call_soon(release.set)
        await shutdown
        assert await job is True
        at_shutdown = loop.time()
        await asyncio.sleep(5)
        return at_shutdown, loop.time()

    assert run(main) == (0.0, 5.0)


def test_shutting_down_an_unused_default_executor_takes_no_time():
    async def main():
        loop = asyncio.get_running_loop()
        await loop.shutdown_default_executor()
        await asyncio.sleep(1)
        return loop.time()

    assert run(main) == 1.0


# ------------------------------------------------------------------ cancelled timers


def test_cancelled_far_future_timers_do_not_accumulate():
    async def main():
        loop = asyncio.get_running_loop()
        # First, cancelled timers that are dropped as they come due, at the head of the heap...
        for handle in [loop.call_later(0.25, lambda: None) for _ in range(100)]:
            handle.cancel()
        await asyncio.sleep(1)
        # ...and behind a live timer due at the same instant: neither skews the bookkeeping.
        loop.call_later(0.5, lambda: None)
        for handle in [loop.call_later(0.5, lambda: None) for _ in range(100)]:
            handle.cancel()
        await asyncio.sleep(1)
        # A live timer ahead of them: the cancelled ones never reach the head of the heap.
        loop.call_later(1800, lambda: None)
        handles = [loop.call_later(3600 + i, lambda: None) for i in range(75)]
        handles += [loop.call_later(math.inf, lambda: None) for _ in range(75)]
        for handle in handles:
            handle.cancel()
        refs = [weakref.ref(handle) for handle in handles]
        del handles, handle
        await asyncio.sleep(1)
        gc.collect()
        return sum(ref() is not None for ref in refs), loop.time()

    assert run(main) == (0, 3.0)


def test_purging_many_cancelled_timers_keeps_the_others_in_order():
    order: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()
        handles = [loop.call_later(5, order.append, i) for i in range(300)]
        for i, handle in enumerate(handles):
            if i % 3:
                handle.cancel()
        # Time moves: two thirds of the heap are cancelled, so it is rebuilt here.
        await asyncio.sleep(1)
        for i in range(300, 310):
            loop.call_later(4, order.append, i)
        handles[0].cancel()  # a survivor of the purge can still be cancelled
        await asyncio.sleep(10)

    run(main)
    assert order == [i for i in range(3, 300, 3)] + list(range(300, 310))


# ------------------------------------------------------------------ real descriptors


def test_a_registered_reader_is_served_before_time_jumps_to_a_timer():
    async def main():
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            right.setblocking(False)
            got: asyncio.Future[bytes] = loop.create_future()

            def on_readable() -> None:
                if not got.done():
                    got.set_result(right.recv(16))

            loop.add_reader(right.fileno(), on_readable)
            loop.call_later(30, lambda: None)
            left.send(b"ping")
            data = await got
            loop.remove_reader(right.fileno())
        return data, loop.time()

    assert run(main) == (b"ping", 0.0)


def test_a_writer_added_to_a_read_descriptor_is_served_too():
    async def main():
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            right.setblocking(False)
            events: list[str] = []
            done: asyncio.Future[None] = loop.create_future()

            def on_readable() -> None:
                events.append(right.recv(16).decode())
                loop.remove_reader(right.fileno())
                done.set_result(None)

            def on_writable() -> None:
                events.append("writable")
                loop.remove_writer(right.fileno())
                left.send(b"pong")

            loop.add_reader(right.fileno(), on_readable)
            loop.add_writer(right.fileno(), on_writable)
            loop.call_later(30, lambda: None)
            await done
        return events, loop.time()

    assert run(main) == (["writable", "pong"], 0.0)


def test_a_deadlock_is_reported_at_once_after_the_last_descriptor_is_removed():
    async def main():
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            loop.add_reader(right.fileno(), lambda: None)
            loop.add_writer(right.fileno(), lambda: None)
            loop.remove_writer(right.fileno())
            loop.remove_reader(right.fileno())
        await asyncio.sleep(1)
        await loop.create_future()

    started = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"^virtual time deadlock: .* t=1\.0s"):
        run(main)
    # No descriptor is left, so there is no real I/O to wait a grace period for.
    assert time.perf_counter() - started < 0.5


def test_a_reader_left_registered_is_still_served_after_another_is_removed():
    async def main():
        loop = asyncio.get_running_loop()
        first, second = socket.socketpair(), socket.socketpair()
        try:
            got: asyncio.Future[bytes] = loop.create_future()
            loop.add_reader(first[1].fileno(), lambda: None)
            second[1].setblocking(False)
            loop.add_reader(second[1].fileno(), lambda: got.set_result(second[1].recv(16)))
            loop.remove_reader(first[1].fileno())
            loop.call_later(30, lambda: None)
            second[0].send(b"still here")
            data = await got
            loop.remove_reader(second[1].fileno())
        finally:
            for sock in (*first, *second):
                sock.close()
        return data, loop.time()

    assert run(main) == (b"still here", 0.0)


def test_a_descriptor_number_reused_after_close_can_be_watched_again():
    async def main():
        loop = asyncio.get_running_loop()
        numbers = []
        for payload in (b"one", b"two"):
            left, right = socket.socketpair()
            with left, right:
                right.setblocking(False)
                # Closing frees the number, so the second pair usually gets the same one.
                numbers.append(right.fileno())
                got: asyncio.Future[bytes] = loop.create_future()
                loop.add_reader(right.fileno(), lambda r=right, g=got: g.set_result(r.recv(16)))
                loop.call_later(30, lambda: None)
                left.send(payload)
                assert await got == payload
                loop.remove_reader(right.fileno())
        return numbers, loop.time()

    numbers, at = run(main)
    assert at == 0.0
    assert numbers[0] == numbers[1]  # the case this test is about


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")
def test_a_signal_handled_by_the_loop_is_served_before_time_jumps():
    async def main():
        loop = asyncio.get_running_loop()
        got: asyncio.Future[float] = loop.create_future()
        loop.add_signal_handler(signal.SIGUSR1, lambda: got.set_result(loop.time()))
        try:
            loop.call_later(30, lambda: None)
            os.kill(os.getpid(), signal.SIGUSR1)
            return await got
        finally:
            loop.remove_signal_handler(signal.SIGUSR1)

    assert run(main) == 0.0


def test_an_idle_registered_reader_costs_no_real_time_and_does_not_hold_time_back():
    async def main():
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            loop.add_reader(right.fileno(), lambda: None)
            for _ in range(3):
                await asyncio.sleep(5)
            for _ in range(200):
                await asyncio.sleep(0)
            loop.remove_reader(right.fileno())
        return loop.time()

    started = time.perf_counter()
    assert run(main) == 15.0
    assert time.perf_counter() - started < 0.5


def test_real_io_is_served_while_the_loop_stays_busy():
    async def main():
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        with left, right:
            right.setblocking(False)
            got: asyncio.Future[bytes] = loop.create_future()
            loop.add_reader(right.fileno(), lambda: got.done() or got.set_result(right.recv(16)))
            left.send(b"busy")
            # Something is always ready, so the loop never idles; the data must still arrive.
            spins = 0
            while not got.done() and spins < 100:
                await asyncio.sleep(0)
                spins += 1
            loop.remove_reader(right.fileno())
        return got.result() if got.done() else None, spins, loop.time()

    data, spins, at = run(main)
    assert (data, at) == (b"busy", 0.0)
    assert spins <= 2


def test_a_reader_waiting_for_data_gets_a_grace_period_before_a_deadlock():
    # The one test that takes real time: an idle loop with a registered descriptor waits one
    # real second for I/O that another thread or process may still send, then calls deadlock.
    left, right = socket.socketpair()

    async def main():
        asyncio.get_running_loop().add_reader(right.fileno(), lambda: None)
        await asyncio.get_running_loop().create_future()

    started = time.perf_counter()
    with left, right, pytest.raises(RuntimeError, match=r"^virtual time deadlock: .* t=0\.0s"):
        run(main)
    assert 0.9 <= time.perf_counter() - started < 5.0
