"""The seam where the harness steps coroutines itself (`evaluator.harness.stepping`).

These tests pin down the parts of asyncio's Task protocol the stepper relies on, and that
stepping `acquire` decides exactly as running it in Tasks does.
"""

from __future__ import annotations

import asyncio
import random

from admission.core import AdmissionRegistry, AdmissionRejected, VirtualTimeLoop
from evaluator.harness.stepping import Finished, advance
from tests.admission.core.conftest import make_profile, request


def _drive(loop: asyncio.AbstractEventLoop, coroutine) -> list[Finished]:
    ended: list[Finished] = []

    def step() -> None:
        finished = advance(coroutine, loop, step)
        if finished is not None:
            ended.append(finished)

    step()
    return ended


def test_a_coroutine_that_never_waits_finishes_in_the_first_step():
    async def quick() -> int:
        return 7

    loop = VirtualTimeLoop()
    try:
        ended = _drive(loop, quick())
        assert len(ended) == 1 and ended[0].value == 7 and ended[0].error is None
    finally:
        loop.close()


def test_waiting_on_a_future_a_bare_yield_and_a_timer_then_an_error():
    loop = VirtualTimeLoop()
    future: asyncio.Future[str] = loop.create_future()

    async def slow() -> str:
        got = await future  # hands the future up with _asyncio_future_blocking raised
        await asyncio.sleep(0)  # a bare yield: resumed on the next iteration
        await asyncio.sleep(0.5)  # a timer on virtual time
        raise ValueError(got)

    try:
        ended = _drive(loop, slow())
        assert ended == [] and not future._asyncio_future_blocking
        loop.call_soon(future.set_result, "late")
        loop.run_until_complete(asyncio.sleep(1))
        assert len(ended) == 1 and isinstance(ended[0].error, ValueError)
        assert str(ended[0].error) == "late"
    finally:
        loop.close()


def test_the_task_protocol_the_stepper_relies_on():
    loop = VirtualTimeLoop()
    try:
        future = loop.create_future()
        handed_up = future.__await__().send(None)
        assert handed_up is future and future._asyncio_future_blocking is True
        assert asyncio.sleep(0).__await__().send(None) is None
    finally:
        loop.close()


def test_stepping_acquire_decides_as_tasks_do():
    profile = make_profile(
        workspace={"concurrency": 2, "maxQueueLength": 6, "maxQueueWaitMs": 40},
        principals={p: {"concurrency": 2} for p in ("a", "b", "c")},
    )
    plan = [(random.Random(5).choice("abc"), i * 3.0, 10.0 + i % 7) for i in range(60)]

    def run(stepped: bool) -> list[tuple[int, str, float]]:
        loop = VirtualTimeLoop()
        controller = AdmissionRegistry(clock=loop.clock, rng=random.Random(1)).register(profile)
        seen: list[tuple[int, str, float]] = []

        def settle(index: int, finished: Finished) -> None:
            now = loop.time() * 1000
            if finished.error is None:
                seen.append((index, "admitted", now))
                loop.call_later(plan[index][2] / 1000, finished.value.release)
            else:
                assert isinstance(finished.error, AdmissionRejected)
                seen.append((index, finished.error.reason, now))

        def start(index: int) -> None:
            principal = plan[index][0]
            acquiring = controller.acquire(request(principal, budget=f"b{index}"))
            if stepped:

                def step() -> None:
                    finished = advance(acquiring, loop, step)
                    if finished is not None:
                        settle(index, finished)

                # A Task takes its first step on the next iteration; start the same way here.
                loop.call_soon(step)
            else:

                def done(task: asyncio.Task) -> None:
                    error = task.exception()
                    settle(index, Finished(None if error else task.result(), error))

                loop.create_task(acquiring).add_done_callback(done)

        for index, (_, at_ms, _) in enumerate(plan):
            loop.call_at(at_ms / 1000, start, index)
        try:
            loop.run_until_complete(asyncio.sleep(2))
        finally:
            loop.close()
        return seen

    stepped = run(stepped=True)
    assert {outcome for _, outcome, _ in stepped} >= {"admitted", "queue-full", "queue-timeout"}
    assert stepped == run(stepped=False)
