"""What a coordinated controller asks of its process's coordinator, and nothing more.

`controller.py` sees the coordinator only through `CoordinationLink`, so the coordinator can
create controllers without the two modules importing each other.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import asyncio

    from admission.coordination.protocol import Call
    from admission.coordination.settings import CoordinationSettings
    from admission.coordination.waiters import ProcessBook

__all__ = ["CoordinationLink"]

R = TypeVar("R")


class CoordinationLink(Protocol):
    """One process's link to the shared state, as its controllers use it."""

    settings: CoordinationSettings
    book: ProcessBook
    # Processes with a live lease at the last heartbeat (None before the first).
    live_processes: int | None

    async def call(self, workspace_id: str, call: Call[R]) -> R:
        """One function call, one round trip. Raises `CoordinationUnavailable`."""
        ...

    async def write(self, workspace_id: str, call: Call[R]) -> R | None:
        """A call that must land: retried until Redis answers it (None if the process closes
        first). Every function is safe to repeat."""
        ...

    def call_sync(self, workspace_id: str, call: Call[R]) -> R:
        """One function call from outside the event loop."""
        ...

    def background(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run a write on the process loop, kept referenced until it ends."""
        ...

    def count_local(self, workspace_id: str, provider_id: str, decision: str, reason: str) -> None:
        """Count a decision made without a round trip (reported with the next heartbeat)."""
        ...

    async def refresh(self, workspace_id: str) -> None:
        """Bring this process's profile of the workspace up to date from its host."""
        ...

    def is_registered(self, workspace_id: str) -> bool:
        """Redis knows this process acts in the workspace (saves a write per decision)."""
        ...

    def note_registered(self, workspace_id: str) -> None: ...

    def listen(self, workspace_id: str) -> None:
        """A waiter of this process waits in the workspace: listen for its grants there."""
        ...
