"""Fair scheduler permits for the decisions of one evaluation.

Unstarted decisions wait in lanes served round-robin; a decision that gave its permit back for a
retry backoff waits in a resume queue that is served before any lane, so work already under way
finishes ahead of work that has not started.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["FairPermits"]

Item = TypeVar("Item")


class FairPermits(Generic[Item]):
    """At most ``capacity`` permits out at once, granted to resumers first, then lanes in turn.

    ``start(item)`` is called synchronously when an unstarted item gets a permit; the item owns
    that permit until it calls ``release()``. ``max_active`` is the exact high-water mark.
    """

    def __init__(self, capacity: int, start: Callable[[Item], None]) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.active = 0
        self.max_active = 0
        self._start = start
        self._lanes: dict[Hashable, deque[Item]] = {}
        self._rotation: deque[Hashable] = deque()
        self._resumers: deque[asyncio.Future[bool]] = deque()
        self._pumping = False

    @property
    def waiting(self) -> int:
        """Unstarted items still queued in lanes."""
        return sum(len(queue) for queue in self._lanes.values())

    def enqueue(self, lane: Hashable, item: Item) -> None:
        """Queue an unstarted item at the back of its lane."""
        queue = self._lanes.get(lane)
        if queue is None:
            queue = self._lanes[lane] = deque()
            self._rotation.append(lane)
        queue.append(item)

    def pump(self) -> None:
        """Hand out free permits: resumers first, then one item per lane in rotation."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while self.active < self.capacity:
                if self._resumers:
                    waiter = self._resumers.popleft()
                    if waiter.done():
                        continue
                    self._take()
                    waiter.set_result(True)
                    continue
                if not self._rotation:
                    return
                item = self._next_in_rotation()
                self._take()
                self._start(item)
        finally:
            self._pumping = False

    def release(self) -> None:
        """Give one permit back and hand it on."""
        self.active -= 1
        self.pump()

    def hand_over(self) -> tuple[bool, Item | None]:
        """Pass a held permit on as ``release()`` would, but keep it in the caller's task when
        the next grant is an unstarted item: returns ``(True, item)`` for the caller to run,
        else ``(False, None)`` once the permit went to a resumer or back to the pool."""
        while self._resumers:
            waiter = self._resumers.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return False, None
        if self._rotation:
            return True, self._next_in_rotation()
        self.release()
        return False, None

    def resume(self) -> asyncio.Future[bool]:
        """Ask for a permit back after a backoff, ahead of every unstarted item.

        The future becomes True once the permit is held, or False after ``abort_resumers()``.
        A caller that stops waiting cancels the future, or releases the permit if it was True.
        """
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.active < self.capacity and not self._resumers:
            self._take()
            waiter.set_result(True)
        else:
            self._resumers.append(waiter)
        return waiter

    def abort_resumers(self) -> None:
        """Answer every waiting resumer with False (the run was stopped)."""
        resumers, self._resumers = self._resumers, deque()
        for waiter in resumers:
            if not waiter.done():
                waiter.set_result(False)

    def drain(self) -> list[Item]:
        """Remove and return every unstarted item (the run was cancelled)."""
        items = [item for lane in self._rotation for item in self._lanes[lane]]
        self._lanes.clear()
        self._rotation.clear()
        return items

    def _next_in_rotation(self) -> Item:
        """Pop the head of the next lane in turn; a lane left empty leaves the rotation."""
        lane = self._rotation.popleft()
        queue = self._lanes[lane]
        item = queue.popleft()
        if queue:
            self._rotation.append(lane)
        else:
            del self._lanes[lane]
        return item

    def _take(self) -> None:
        self.active += 1
        if self.active > self.max_active:
            self.max_active = self.active
