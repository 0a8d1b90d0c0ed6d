"""One process's waiters and permits in the shared state: who owns what, and who hears what.

The coordinator (heartbeat, listener, recovery) and the controllers (decisions) both act on the
same waiters and leases; `ProcessBook` is the one owner of those two tables, and each side
changes them only through its methods.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from admission.coordination.protocol import LeaseRecord, Message
    from admission.core.ticket import Ticket

__all__ = [
    "DONE",
    "LEAVING",
    "PENDING",
    "QUEUED",
    "TAKING",
    "HeldLease",
    "ProcessBook",
    "Waiter",
    "WaiterOwner",
]

# A waiter is pending until the acquire call's answer is read (a grant may arrive before it),
# queued while Redis holds it in a lane, taking while it takes a grant made for it, leaving
# while it withdraws, done once answered.
PENDING, QUEUED, TAKING, LEAVING, DONE = "pending", "queued", "taking", "leaving", "done"


class WaiterOwner(Protocol):
    """The controller a waiter belongs to, as the coordinator sees it."""

    workspace_id: str

    def on_message(self, waiter: Waiter, message: Message) -> None:
        """A grant or a refusal for the waiter arrived."""
        ...

    def requeue(self, waiter: Waiter) -> None:
        """Redis no longer holds the waiter in its lane: queue it again."""
        ...


class HeldLease(Protocol):
    """A permit this process holds, as the coordinator sees it."""

    id: str
    workspace_id: str

    def record(self) -> LeaseRecord:
        """The permit as it is put back after the shared state was lost."""
        ...

    def doubt(self) -> None:
        """This process can no longer vouch for the permit: stop the call it covers."""
        ...


class Waiter:
    """A request of this process that waits in a lane in Redis."""

    __slots__ = (
        "early",
        "future",
        "id",
        "leaving",
        "owner",
        "queued_at",
        "requeueing",
        "state",
        "ticket",
        "timer",
        "unsubscribe",
    )

    def __init__(
        self,
        owner: WaiterOwner,
        waiter_id: str,
        ticket: Ticket,
        future: asyncio.Future[Any],
    ) -> None:
        self.owner = owner
        self.id = waiter_id
        self.ticket = ticket
        self.future = future
        self.state = PENDING
        self.early: Message | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.unsubscribe: Any = None
        self.queued_at = math.inf
        self.requeueing = False
        # Set when the waiter gives up while it takes a grant: (reason, tell the caller).
        self.leaving: tuple[str, bool] | None = None

    def auditable(self, settled_before: float) -> bool:
        """Queued for a while and not being queued again: Redis should know it."""
        return self.state == QUEUED and not self.requeueing and self.queued_at < settled_before


class ProcessBook:
    """The waiters and the leases of one process, across its workspaces."""

    __slots__ = ("_leases", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[str, Waiter] = {}
        self._leases: dict[str, HeldLease] = {}

    # ------------------------------------------------------------------- waiters

    def add_waiter(self, waiter: Waiter) -> None:
        self._waiters[waiter.id] = waiter

    def drop_waiter(self, waiter_id: str) -> None:
        self._waiters.pop(waiter_id, None)

    def waiter(self, waiter_id: str) -> Waiter | None:
        return self._waiters.get(waiter_id)

    def waiters(self) -> Iterator[Waiter]:
        return iter(list(self._waiters.values()))

    @property
    def waiter_count(self) -> int:
        return len(self._waiters)

    def auditable(self, settled_before: float) -> dict[str, list[str]]:
        """Ids of waiters queued before `settled_before` (monotonic s), by workspace."""
        audit: dict[str, list[str]] = {}
        for waiter in self._waiters.values():
            if waiter.auditable(settled_before):
                audit.setdefault(waiter.owner.workspace_id, []).append(waiter.id)
        return audit

    def deliver(self, message: Message) -> bool:
        """Hand a message to its waiter's owner; False when no such waiter is here."""
        waiter = self._waiters.get(message.waiter_id)
        if waiter is None:
            return False
        waiter.owner.on_message(waiter, message)
        return True

    def requeue_all(self) -> None:
        for waiter in list(self._waiters.values()):
            waiter.owner.requeue(waiter)

    # -------------------------------------------------------------------- leases

    def add_lease(self, lease: HeldLease) -> None:
        self._leases[lease.id] = lease

    def drop_lease(self, lease_id: str) -> None:
        self._leases.pop(lease_id, None)

    def holds_lease(self, lease_id: str) -> bool:
        return lease_id in self._leases

    def lease_ids(self) -> set[str]:
        return set(self._leases)

    @property
    def lease_count(self) -> int:
        return len(self._leases)

    def lease_records(self) -> dict[str, list[LeaseRecord]]:
        """Every lease held, as records to put back, by workspace."""
        by_workspace: dict[str, list[LeaseRecord]] = {}
        for lease in self._leases.values():
            by_workspace.setdefault(lease.workspace_id, []).append(lease.record())
        return by_workspace

    def doubt_leases(self, workspaces: set[str] | None = None) -> None:
        """Stop the calls of the permits held (in the given workspaces, or everywhere)."""
        for lease in list(self._leases.values()):
            if workspaces is None or lease.workspace_id in workspaces:
                lease.doubt()
