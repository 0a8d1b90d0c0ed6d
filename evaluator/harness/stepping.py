"""Drive an awaitable step by step without a Task: the one place the harness does so.

The controller path starts about 21 000 acquires, and most finish without ever suspending; a
`Task` per acquire would cost a loop iteration each. `advance` runs a coroutine as a Task's step
does: until it finishes or waits on a future, and then resumes it when that future is done. It
relies on two parts of asyncio's Task protocol: a future handed up by `await` has
`_asyncio_future_blocking` set, which the stepper clears as `Task.__step` does; and a bare
`yield` (``asyncio.sleep(0)``) hands up None and is resumed on the next loop iteration.
`tests/evaluator/harness/test_stepping.py` checks both, and that stepping decides exactly as
Tasks do, so a Python upgrade that changes the protocol fails there and not in a load result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["Finished", "advance"]


class Finished:
    """How a stepped coroutine ended: its value, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error


def advance(
    coroutine: Coroutine[Any, Any, Any],
    loop: asyncio.AbstractEventLoop,
    resume: Callable[[], object],
) -> Finished | None:
    """Run `coroutine` until it finishes (returns `Finished`) or waits (returns None).

    When it waits, `resume` is called once what it waits for is done; call `advance` again then.
    """
    try:
        awaited = coroutine.send(None)
    except StopIteration as finished:
        return Finished(finished.value)
    except BaseException as error:
        return Finished(error=error)
    if awaited is None:
        loop.call_soon(resume)
    else:
        # Taken in hand, as Task.__step does; `await` raised the flag to hand the future up.
        awaited._asyncio_future_blocking = False
        awaited.add_done_callback(lambda _future: resume())
    return None
