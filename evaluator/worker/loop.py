"""The event loop a worker process runs evaluations on, and the lock that keeps it single-owner.

The process registry's controllers bind to one running loop and are not thread-safe: every
evaluation runs on this loop's thread, and anything else that changes the registry (a profile
refresh) does it while the loop is frozen, so the two never touch the registry at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["EvaluationLoop", "evaluation_loop", "reset_evaluation_loop"]

T = TypeVar("T")


class EvaluationLoop:
    """An asyncio loop running forever in a daemon thread of this process."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._freeze_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._serve, name="sluice-evaluation-loop", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result in the calling thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("EvaluationLoop.run() called from the loop's own thread")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Hold the loop still inside a callback while the caller changes what it works on."""
        if threading.current_thread() is self._thread or not self._loop.is_running():
            yield
            return
        with self._freeze_lock:
            held = threading.Event()
            release = threading.Event()

            def hold() -> None:
                held.set()
                release.wait()

            self._loop.call_soon_threadsafe(hold)
            held.wait()
            try:
                yield
            finally:
                release.set()

    def close(self) -> None:
        """Stop the loop and its thread; used by tests and at process shutdown."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()


_lock = threading.Lock()
_current: EvaluationLoop | None = None


def evaluation_loop() -> EvaluationLoop:
    """This process's loop, started on first use (so a forked child starts its own)."""
    global _current
    with _lock:
        if _current is None:
            _current = EvaluationLoop()
        return _current


def reset_evaluation_loop() -> None:
    """Forget the loop; after a fork the parent's thread does not exist in the child."""
    global _current, _lock
    # A lock copied by fork may be held by a thread that does not exist here.
    _lock = threading.Lock()
    _current = None
