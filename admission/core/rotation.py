"""Lanes in rotation order: the least recently served first, ties first come, first served.

The controller keeps every set of lanes that can be woken together in a `Rotation`: the lanes
ready to be served, and the lanes parked on one scope's permits, one pair's share or one token
bucket's reservation. Whatever wakes a lane, it is then served by its *turn*, an integer that
grows each time the lane's (provider, principal) pair is admitted, so a noisy lane that was just
served queues behind a quiet one that was not.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

__all__ = ["Rotation", "Turned"]

# Entries older than this many live members are rebuilt away, so removal can stay lazy.
_COMPACT_SLACK = 32

# One sequence for every rotation: among equal turns, whoever came first goes first.
_arrivals = itertools.count()


class Turned(Hashable, Protocol):
    """Something with a place in the rotation."""

    turn: int


_L = TypeVar("_L", bound=Turned)


class Rotation(dict[_L, int]):
    """A set of lanes ordered by (turn, arrival); adding is O(log n), removal is lazy.

    The rotation is a dict of its members (lane -> the arrival number of its one live heap
    entry), so asking whether a scope has parked lanes costs what asking a dict does; the heap
    exists only while there are members.
    """

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, int, _L]] | None = None

    def add(self, lane: _L) -> None:
        """Take `lane` in at its current turn; a member is moved to that turn."""
        heap = self._heap
        if heap is None:
            heap = self._heap = []
        arrival = next(_arrivals)
        self[lane] = arrival
        heapq.heappush(heap, (lane.turn, arrival, lane))
        if len(heap) > 2 * len(self) + _COMPACT_SLACK:
            self._heap = [entry for entry in heap if self.get(entry[2]) == entry[1]]
            heapq.heapify(self._heap)

    def discard(self, lane: _L) -> None:
        if dict.pop(self, lane, None) is not None and not self:
            self._heap = None

    def first(self, skip: Callable[[_L], bool] | None = None) -> _L | None:
        """The member that goes next, leaving it in; with `skip`, the first one it does not skip."""
        heap = self._heap
        if not self or heap is None:
            return None
        held = []
        found = None
        while heap:
            entry = heap[0]
            if self.get(entry[2]) != entry[1]:
                heapq.heappop(heap)  # left or moved: a stale entry
            elif skip is not None and skip(entry[2]):
                held.append(heapq.heappop(heap))
            else:
                found = entry[2]
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return found

    def take(self) -> _L | None:
        """Take out and return the member that goes next, or None when there is none."""
        lane = self.first()
        if lane is not None:
            self.discard(lane)
        return lane
