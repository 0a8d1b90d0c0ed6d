"""Durable receipts (v3): what an invocation has done, so a crashed run resumes without
dispatching anything twice.

A v3 receipt holds a set of pending-dispatch slots, one per attempt in flight. A slot is durable
before its adapter call starts and is cleared in the same write that records the attempt, so a
slot still present on resume means "sent, outcome unknown": that attempt becomes
``execution-uncertain`` (``dispatch-unconfirmed``) and is never dispatched again. One journal per
run writes its receipt; changes made while a write is in flight go together in the next one
(group commit), each write a compare-and-set on the revision. A v2 receipt (one slot,
``pendingDispatch``) is upgraded to v3 in the first write of the run that resumes it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from evaluator.engine.errors import InvalidDefinitionError, ReceiptConflictError
from evaluator.engine.outcomes import EXECUTION_UNCERTAIN, AttemptRecord, DecisionOutcome

__all__ = [
    "RECEIPT_SCHEMA",
    "RECEIPT_SCHEMA_V2",
    "RUN_STATES",
    "InMemoryReceiptStore",
    "ReceiptJournal",
    "ReceiptKey",
    "ReceiptStore",
    "pending_slots",
    "upgraded_document",
]

RECEIPT_SCHEMA = "decision-evaluation-receipt/v3"
RECEIPT_SCHEMA_V2 = "decision-evaluation-receipt/v2"
RUNNING = "running"
RUN_STATES = frozenset({RUNNING, "completed", "cancelled", "timeout"})
# How long a change nobody waits for (an attempt's record) waits for company before its write.
DEFERRED_WRITE_S = 0.005
# Reason on the attempt that a pending-dispatch slot turns into when a run resumes.
DISPATCH_UNCONFIRMED = "dispatch-unconfirmed"


@dataclass(frozen=True, slots=True)
class ReceiptKey:
    """A receipt belongs to one invocation of one trusted principal in one workspace."""

    workspace_id: str
    principal_id: str
    invocation_id: str

    def __repr__(self) -> str:
        # The trusted identities stay out of reprs that reach logs.
        return f"ReceiptKey(invocation_id={self.invocation_id!r})"


@runtime_checkable
class ReceiptStore(Protocol):
    """Where receipt documents live. Writes are compare-and-set on ``revision``."""

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """The document for ``key``, or None (also when it belongs to another principal)."""
        ...

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """Store a new document; raise ``ReceiptConflictError`` if the invocation exists."""
        ...

    async def update(
        self, key: ReceiptKey, document: Mapping[str, Any], *, expected_revision: int
    ) -> None:
        """Replace the document if it is still at ``expected_revision`` and running; raise
        ``ReceiptConflictError`` otherwise."""
        ...


class InMemoryReceiptStore:
    """A ``ReceiptStore`` in a dict, for tests and single-process hosts."""

    def __init__(self) -> None:
        self._documents: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self.writes = 0

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """See ``ReceiptStore.load``."""
        stored = self._documents.get((key.workspace_id, key.invocation_id))
        if stored is None or stored[0] != key.principal_id:
            return None
        return copy.deepcopy(stored[1])

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """See ``ReceiptStore.create``."""
        slot = (key.workspace_id, key.invocation_id)
        if slot in self._documents:
            raise ReceiptConflictError(key.invocation_id, 0)
        self._documents[slot] = (key.principal_id, copy.deepcopy(dict(document)))
        self.writes += 1

    async def update(
        self, key: ReceiptKey, document: Mapping[str, Any], *, expected_revision: int
    ) -> None:
        """See ``ReceiptStore.update``."""
        slot = (key.workspace_id, key.invocation_id)
        stored = self._documents.get(slot)
        if (
            stored is None
            or stored[0] != key.principal_id
            or stored[1]["revision"] != expected_revision
            or stored[1]["state"] != RUNNING
        ):
            raise ReceiptConflictError(key.invocation_id, expected_revision)
        self._documents[slot] = (key.principal_id, copy.deepcopy(dict(document)))
        self.writes += 1

    def document(self, key: ReceiptKey) -> dict[str, Any] | None:
        """The stored document, for inspection in tests."""
        stored = self._documents.get((key.workspace_id, key.invocation_id))
        return copy.deepcopy(stored[1]) if stored is not None else None


def pending_slots(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pending-dispatch slots of a v3 or v2 receipt document, each naming its decision."""
    if document.get("schema") == RECEIPT_SCHEMA_V2:
        slot = document.get("pendingDispatch")
        if slot is None:
            return []
        entries = document.get("decisions") or []
        index = slot.get("decisionIndex", -1)
        decision_id = entries[index]["decisionId"] if 0 <= index < len(entries) else None
        return [{"decisionId": decision_id, **slot}]
    return [dict(slot) for slot in document.get("pendingDispatches") or ()]


def upgraded_document(document: Mapping[str, Any]) -> dict[str, Any]:
    """A v2 receipt document as v3 (the same revision): its one slot becomes the slot set."""
    if document.get("schema") != RECEIPT_SCHEMA_V2:
        return copy.deepcopy(dict(document))
    upgraded = copy.deepcopy(dict(document))
    slots = pending_slots(upgraded)
    del upgraded["pendingDispatch"]
    upgraded["schema"] = RECEIPT_SCHEMA
    upgraded["pendingDispatches"] = slots
    # A v2 run had at most one call in flight.
    sent = slots or any(
        attempt.get("sent") for entry in upgraded["decisions"] for attempt in entry["attempts"]
    )
    upgraded["maxPendingDispatches"] = 1 if sent else 0
    return upgraded


def unconfirmed_attempt(slot: Mapping[str, Any]) -> AttemptRecord:
    """The attempt a slot still pending on resume stands for: sent, outcome unknown."""
    started = slot.get("startedMs", 0.0)
    return AttemptRecord(
        target_index=slot["targetIndex"],
        adapter_id=slot["adapterId"],
        model=slot["model"],
        number=slot["number"],
        sent=True,
        outcome=EXECUTION_UNCERTAIN,
        reason=DISPATCH_UNCONFIRMED,
        evidence=slot.get("evidence"),
        started_ms=started,
        ended_ms=started,
    )


class ReceiptJournal:
    """The one writer of a run's receipt.

    Every change is applied to the journal's copy at once and made durable by a compare-and-set
    ``update``; changes made while an update is in flight go together in the next one, so eight
    calls starting at once cost one write, not eight. ``mark_dispatch``, ``resolve_pending`` and
    ``finish`` return once a write that holds their change has landed; an attempt's record is
    written a moment later, or sooner with the next change someone waits for. A failed write
    fails every change waiting on it and every later one: the run stops, and its next claimant
    resumes from what is durable.
    """

    def __init__(
        self, store: ReceiptStore, key: ReceiptKey, document: dict[str, Any], clock: Any
    ) -> None:
        self._store = store
        self._key = key
        self._doc = document
        self._clock = clock
        self._upgraded = False
        self._changes = 0  # changes applied to the copy
        self._durable = 0  # changes a landed write holds
        self._flight: asyncio.Task[None] | None = None
        self._deferred: asyncio.TimerHandle | None = None
        self._failure: BaseException | None = None

    @classmethod
    async def open(
        cls,
        store: ReceiptStore,
        key: ReceiptKey,
        *,
        ruleset_id: str,
        ruleset_digest: str,
        decision_ids: list[str],
        clock: Any,
    ) -> ReceiptJournal:
        """Load the invocation's receipt, or create it. A stored receipt for another ruleset is
        an ``InvalidDefinitionError``: an invocation id names one evaluation only. A running v2
        receipt is upgraded to v3 by the run's first write (``resolve_pending``)."""
        document = await store.load(key)
        if document is None:
            now = clock.epoch_ms()
            document = {
                "schema": RECEIPT_SCHEMA,
                "invocationId": key.invocation_id,
                "rulesetId": ruleset_id,
                "rulesetDigest": ruleset_digest,
                "state": RUNNING,
                "revision": 1,
                "pendingDispatches": [],
                "maxPendingDispatches": 0,
                "decisions": [
                    {"decisionId": decision_id, "status": None, "output": None, "attempts": []}
                    for decision_id in decision_ids
                ],
                "createdAtEpochMs": now,
                "updatedAtEpochMs": now,
            }
            await store.create(key, document)
            return cls(store, key, document, clock)
        schema = document.get("schema")
        if schema not in (RECEIPT_SCHEMA, RECEIPT_SCHEMA_V2):
            raise InvalidDefinitionError("invocationId", "names a receipt of another schema")
        if document.get("rulesetDigest") != ruleset_digest:
            raise InvalidDefinitionError("invocationId", "names a receipt of another ruleset")
        if schema == RECEIPT_SCHEMA_V2 and document.get("state") == RUNNING:
            journal = cls(store, key, upgraded_document(document), clock)
            journal._upgraded = True
            return journal
        return cls(store, key, document, clock)

    @property
    def document(self) -> dict[str, Any]:
        """A copy of the current document (changes not yet durable included)."""
        return copy.deepcopy(self._doc)

    @property
    def state(self) -> str:
        return self._doc["state"]

    @property
    def resumed(self) -> bool:
        """Whether the receipt existed before this run opened it."""
        return self._doc["revision"] > 1 or self._doc["state"] != RUNNING

    @property
    def pending(self) -> int:
        """Slots pending now."""
        return len(self._doc.get("pendingDispatches") or ())

    @property
    def max_pending(self) -> int:
        """The most slots this receipt ever held at once."""
        return int(self._doc.get("maxPendingDispatches") or 0)

    def outcome(self, index: int) -> DecisionOutcome | None:
        """The recorded outcome of decision ``index``, or None while it is unfinished."""
        entry = self._doc["decisions"][index]
        if entry["status"] is None:
            return None
        return DecisionOutcome.from_dict(entry)

    def attempts(self, index: int) -> list[AttemptRecord]:
        """Attempts recorded for decision ``index`` so far."""
        return [AttemptRecord.from_dict(item) for item in self._doc["decisions"][index]["attempts"]]

    async def resolve_pending(self) -> list[int]:
        """Turn every slot left pending by a crash into its attempt's ``execution-uncertain``
        record and the decision's outcome, in one write (which also upgrades a v2 receipt);
        returns the decision indexes they belonged to."""
        slots = self._doc["pendingDispatches"]
        if not slots and not self._upgraded:
            return []
        indexes = []
        for slot in slots:
            index = slot["decisionIndex"]
            entry = self._doc["decisions"][index]
            entry["attempts"].append(unconfirmed_attempt(slot).to_dict())
            entry["status"] = EXECUTION_UNCERTAIN
            indexes.append(index)
        self._doc["pendingDispatches"] = []
        await self._commit()
        self._upgraded = False
        return indexes

    async def mark_dispatch(self, index: int, attempt: AttemptRecord) -> None:
        """Add the attempt's pending-dispatch slot; returns once it is durable, and the adapter
        must not be called before."""
        slots = self._doc["pendingDispatches"]
        if any(slot["decisionIndex"] == index for slot in slots):
            raise RuntimeError(f"decision {index} already has a dispatch pending")
        slots.append(
            {
                "decisionId": self._doc["decisions"][index]["decisionId"],
                "decisionIndex": index,
                "targetIndex": attempt.target_index,
                "adapterId": attempt.adapter_id,
                "model": attempt.model,
                "number": attempt.number,
                "startedMs": attempt.started_ms,
                "evidence": dict(attempt.evidence) if attempt.evidence is not None else None,
                "atEpochMs": self._clock.epoch_ms(),
            }
        )
        if len(slots) > self._doc["maxPendingDispatches"]:
            self._doc["maxPendingDispatches"] = len(slots)
        await self._commit()

    async def record_attempt(
        self, index: int, attempt: AttemptRecord, *, outcome: DecisionOutcome | None = None
    ) -> None:
        """Append an attempt (clearing its slot if it was dispatched) and, when it ended the
        decision, the decision's outcome, in one write; returns once that write has started."""
        entry = self._doc["decisions"][index]
        entry["attempts"].append(attempt.to_dict())
        # The record of a dispatched attempt settles its slot, whatever its outcome.
        self._doc["pendingDispatches"] = [
            slot
            for slot in self._doc["pendingDispatches"]
            if not (
                slot["decisionIndex"] == index
                and slot["targetIndex"] == attempt.target_index
                and slot["number"] == attempt.number
            )
        ]
        if outcome is not None:
            entry["status"] = outcome.status
            entry["output"] = outcome.output
        # Not waited for: until this write lands the slot stands for the attempt, and the next
        # call waits for its own slot (written after this) anyway.
        await self._commit(wait=False)

    async def finish_decision(self, index: int, outcome: DecisionOutcome) -> None:
        """Record a decision that ended without a new attempt (cancelled while waiting)."""
        entry = self._doc["decisions"][index]
        if entry["status"] is not None:
            return
        entry["status"] = outcome.status
        entry["output"] = outcome.output
        await self._commit(wait=False)

    async def finish(
        self, state: str, unfinished: Iterable[tuple[int, DecisionOutcome]] = ()
    ) -> None:
        """Close the receipt with its terminal run state, recording the outcomes of decisions
        that ended without an attempt in the same write; no write is accepted afterwards."""
        if state not in RUN_STATES or state == RUNNING:
            raise ValueError(f"not a terminal run state: {state!r}")
        for index, outcome in unfinished:
            entry = self._doc["decisions"][index]
            if entry["status"] is None:
                entry["status"] = outcome.status
                entry["output"] = outcome.output
        self._doc["state"] = state
        await self._commit()

    async def settle(self) -> None:
        """Write what waits for company now, then wait until no write is in flight, whatever
        the writes end with."""
        if self._deferred is not None and self._flight is None and self._failure is None:
            self._start_write()
        while self._flight is not None:
            await asyncio.wait([self._flight])

    async def _commit(self, *, wait: bool = True) -> None:
        """Have the changes made so far written; with ``wait``, return once they are durable.

        Without ``wait`` (a change that need not be durable before the run goes on: an
        attempt's record, for which its slot stands until it lands) the write waits
        ``DEFERRED_WRITE_S`` for company. A failed write is raised by every later commit."""
        self._changes += 1
        wanted = self._changes
        if self._failure is not None:
            raise self._failure
        if not wait:
            if self._flight is None and self._deferred is None:
                # Wait a moment: the next call's slot usually follows and takes this along.
                self._deferred = asyncio.get_running_loop().call_later(
                    DEFERRED_WRITE_S, self._write_deferred
                )
            return
        if self._flight is None:
            self._start_write()
        while self._durable < wanted:
            flight = self._flight
            if flight is not None and flight.done():
                # Landed, its callback not run yet: awaiting it again would not yield.
                self._landed(flight)
                flight = self._flight
            if self._failure is not None:
                raise self._failure
            assert flight is not None
            # A waiter that is cancelled leaves the write to land for the others.
            await asyncio.shield(flight)

    def _write_deferred(self) -> None:
        self._deferred = None
        if self._flight is None and self._failure is None and self._durable < self._changes:
            self._start_write()

    def _start_write(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        flight = self._flight = asyncio.get_running_loop().create_task(self._write())
        flight.add_done_callback(self._landed)

    async def _write(self) -> None:
        # Every change applied until this task runs goes in this write.
        changes = self._changes
        expected = self._doc["revision"]
        now = self._clock.epoch_ms()
        snapshot = {
            **self._doc,
            "revision": expected + 1,
            "updatedAtEpochMs": now,
            "pendingDispatches": list(self._doc["pendingDispatches"]),
            # Attempt dicts are never changed once appended, so a shallow copy is a snapshot.
            "decisions": [
                {**entry, "attempts": list(entry["attempts"])} for entry in self._doc["decisions"]
            ],
        }
        await self._store.update(self._key, snapshot, expected_revision=expected)
        self._doc["revision"] = expected + 1
        self._doc["updatedAtEpochMs"] = now
        self._durable = changes

    def _landed(self, flight: asyncio.Task[None]) -> None:
        # Idempotent: called by the task's callback and, when it has not run yet, by a waiter.
        if self._flight is not flight:
            return
        self._flight = None
        if self._failure is None:
            if flight.cancelled():
                self._failure = asyncio.CancelledError()
            else:
                self._failure = flight.exception()
        if self._failure is None and self._durable < self._changes:
            # Changes made while this write was in flight go in the next one at once.
            self._start_write()
