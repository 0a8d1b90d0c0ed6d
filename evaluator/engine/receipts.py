"""Durable receipts (v3): what an invocation has done, so a crashed run resumes without
dispatching anything twice.

A v3 receipt holds a set of pending-dispatch slots, one per attempt in flight. A slot is durable
before its adapter call starts and is cleared in the same write that records the attempt, so a
slot still present on resume means "sent, outcome unknown": that attempt becomes
``execution-uncertain`` (``dispatch-unconfirmed``) and is never dispatched again.

A store keeps the slots apart from the rest of the document: a slot write adds slots and never
waits for a document write in flight, and a document write (compare-and-set on the revision)
removes the slots of the attempts it records. Slot writes are fenced by the receipt's claim, which
every run that resumes the receipt takes anew, so a run the receipt was taken from can add no slot
afterwards. One journal per run writes its receipt; changes made while a document write is in
flight go together in the next one (group commit), and slots marked together go in one slot write.
A v2 receipt (one slot, ``pendingDispatch``) is upgraded to v3 in the first write of the run that
resumes it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    "slot_key",
    "split_slots",
    "upgraded_document",
    "with_slots",
]

SlotKey = tuple[int, int, int]

RECEIPT_SCHEMA = "decision-evaluation-receipt/v3"
RECEIPT_SCHEMA_V2 = "decision-evaluation-receipt/v2"
RUNNING = "running"
RUN_STATES = frozenset({RUNNING, "completed", "cancelled", "timeout"})
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


def slot_key(slot: Mapping[str, Any]) -> SlotKey:
    """What names a slot uniquely within its receipt: decision, target and attempt number."""
    return (int(slot["decisionIndex"]), int(slot["targetIndex"]), int(slot["number"]))


@runtime_checkable
class ReceiptStore(Protocol):
    """Where receipts live: each a document (writes are compare-and-set on ``revision``) and its
    set of pending-dispatch slots (added under the receipt's claim, removed by the document write
    that records their attempts). Documents given to and returned by the store carry the slots in
    ``pendingDispatches``."""

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """The document for ``key`` with its pending slots, or None (also when it belongs to
        another principal)."""
        ...

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """Store a new document under claim 1; raise ``ReceiptConflictError`` if the invocation
        exists."""
        ...

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        """Take the running receipt for a new run: its document with its pending slots, and a
        new claim number under which alone slots are added from now on; raise
        ``ReceiptConflictError`` if it is gone or no longer running."""
        ...

    async def add_slots(
        self, key: ReceiptKey, slots: Sequence[Mapping[str, Any]], *, claim: int
    ) -> None:
        """Add pending-dispatch slots, durable on return, without waiting for a document write in
        flight; raise ``ReceiptConflictError`` (adding none) if the receipt is no longer running
        under ``claim`` or holds a slot of the same decision, target and attempt number."""
        ...

    async def update(
        self,
        key: ReceiptKey,
        document: Mapping[str, Any],
        *,
        expected_revision: int,
        settled: Sequence[SlotKey] = (),
    ) -> None:
        """Replace the document (its ``pendingDispatches`` aside) if it is still at
        ``expected_revision`` and running, removing the ``settled`` slots in the same write;
        raise ``ReceiptConflictError`` otherwise."""
        ...


class InMemoryReceiptStore:
    """A ``ReceiptStore`` in dicts, for tests and single-process hosts. Like the database store it
    keeps a receipt's slots apart from its document."""

    def __init__(self) -> None:
        # (workspace, invocation) -> (principal, document without its slots, claim)
        self._documents: dict[tuple[str, str], tuple[str, dict[str, Any], int]] = {}
        self._slots: dict[tuple[str, str], dict[SlotKey, dict[str, Any]]] = {}
        self.writes = 0

    def _stored(self, key: ReceiptKey) -> tuple[str, dict[str, Any], int] | None:
        stored = self._documents.get((key.workspace_id, key.invocation_id))
        if stored is None or stored[0] != key.principal_id:
            return None
        return stored

    def _with_slots(self, key: ReceiptKey, document: dict[str, Any]) -> dict[str, Any]:
        return with_slots(document, self._slots.get((key.workspace_id, key.invocation_id), {}))

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """See ``ReceiptStore.load``."""
        stored = self._stored(key)
        return None if stored is None else self._with_slots(key, stored[1])

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """See ``ReceiptStore.create``."""
        where = (key.workspace_id, key.invocation_id)
        if where in self._documents:
            raise ReceiptConflictError(key.invocation_id, 0)
        body, slots = split_slots(copy.deepcopy(dict(document)))
        self._documents[where] = (key.principal_id, body, 1)
        self._slots[where] = slots
        self.writes += 1

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        """See ``ReceiptStore.claim``."""
        stored = self._stored(key)
        if stored is None or stored[1]["state"] != RUNNING:
            raise ReceiptConflictError(key.invocation_id, 0)
        principal, body, claim = stored
        self._documents[(key.workspace_id, key.invocation_id)] = (principal, body, claim + 1)
        return self._with_slots(key, body), claim + 1

    async def add_slots(
        self, key: ReceiptKey, slots: Sequence[Mapping[str, Any]], *, claim: int
    ) -> None:
        """See ``ReceiptStore.add_slots``."""
        stored = self._stored(key)
        held = self._slots.setdefault((key.workspace_id, key.invocation_id), {})
        keys = [slot_key(slot) for slot in slots]
        if (
            stored is None
            or stored[2] != claim
            or stored[1]["state"] != RUNNING
            or len(set(keys)) != len(keys)
            or any(k in held for k in keys)
        ):
            raise ReceiptConflictError(key.invocation_id, stored[1]["revision"] if stored else 0)
        for k, slot in zip(keys, slots, strict=True):
            held[k] = copy.deepcopy(dict(slot))
        self.writes += 1

    async def update(
        self,
        key: ReceiptKey,
        document: Mapping[str, Any],
        *,
        expected_revision: int,
        settled: Sequence[SlotKey] = (),
    ) -> None:
        """See ``ReceiptStore.update``."""
        where = (key.workspace_id, key.invocation_id)
        stored = self._stored(key)
        if (
            stored is None
            or stored[1]["revision"] != expected_revision
            or stored[1]["state"] != RUNNING
        ):
            raise ReceiptConflictError(key.invocation_id, expected_revision)
        body, _ = split_slots(copy.deepcopy(dict(document)))
        self._documents[where] = (key.principal_id, body, stored[2])
        held = self._slots.setdefault(where, {})
        for k in settled:
            held.pop(tuple(k), None)  # type: ignore[arg-type]
        self.writes += 1

    def document(self, key: ReceiptKey) -> dict[str, Any] | None:
        """The stored document with its slots, for inspection in tests."""
        stored = self._documents.get((key.workspace_id, key.invocation_id))
        return None if stored is None else self._with_slots(key, stored[1])


def split_slots(
    document: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[SlotKey, dict[str, Any]]]:
    """A v3 document without its slots, and the slots by key (a v2 document keeps its one slot
    where it is, and has none apart). Shallow: the parts are the document's own."""
    if document.get("schema") == RECEIPT_SCHEMA_V2:
        return dict(document), {}
    body = {name: value for name, value in document.items() if name != "pendingDispatches"}
    slots = document.get("pendingDispatches") or []
    return body, {slot_key(slot): slot for slot in slots}


def with_slots(
    document: Mapping[str, Any], slots: Mapping[SlotKey, Mapping[str, Any]]
) -> dict[str, Any]:
    """A stored document as receipts read: a v3 one with its slots, in the order of their
    decisions, in ``pendingDispatches`` (a v2 one as it is)."""
    whole = copy.deepcopy(dict(document))
    if whole.get("schema") == RECEIPT_SCHEMA_V2:
        return whole
    held = {slot_key(slot): dict(slot) for slot in whole.get("pendingDispatches") or ()}
    held.update({k: copy.deepcopy(dict(slot)) for k, slot in slots.items()})
    whole["pendingDispatches"] = [held[k] for k in sorted(held)]
    return whole


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


@dataclass(slots=True)
class _SlotWrite:
    """Slots marked together, written together; ``landed`` resolves once they are durable."""

    landed: asyncio.Future[None]
    slots: list[dict[str, Any]] = field(default_factory=list)


class ReceiptJournal:
    """The one writer of a run's receipt.

    Every change is applied to the journal's copy at once. Slots go to the store by themselves:
    the slots marked in one turn of the loop are added in one slot write, started at once even
    while other writes are in flight, and each ``mark_dispatch`` returns once its slot is durable.
    Everything else goes in document writes, each a compare-and-set ``update``; changes made while
    one is in flight go together in the next one. ``resolve_pending`` and ``finish`` return once a
    document write that holds their change has landed. A document write lets the run's slot
    writes under way land first (calls wait on those; nobody waits on a document write it holds,
    and the two would contend for the same database and process). An attempt's record (which
    removes its slot) is not waited for, but its write starts in the next turn of the loop with
    the other changes of that turn (after the slot writes under way, if any), or as soon as the
    write in flight lands: it is durable one write (and any write already in flight) after its
    call ended, whatever the run does meanwhile. A failed
    write fails every change waiting on it and every later one: the run stops, and its next
    claimant resumes from what is durable.
    """

    def __init__(
        self,
        store: ReceiptStore,
        key: ReceiptKey,
        document: dict[str, Any],
        clock: Any,
        *,
        claim: int = 1,
    ) -> None:
        self._store = store
        self._key = key
        self._doc = document
        self._clock = clock
        self._claim = claim
        self._upgraded = False
        self._changes = 0  # document changes applied to the copy
        self._durable = 0  # document changes a landed write holds
        self._flight: asyncio.Task[None] | None = None
        self._deferred: asyncio.Handle | None = None
        self._failure: BaseException | None = None
        # Slots whose attempts were recorded, for the next document write to remove.
        self._settled: list[SlotKey] = []
        # The slot write being gathered this turn of the loop, and those in flight by slot.
        self._gathering: _SlotWrite | None = None
        self._slot_flights: dict[SlotKey, _SlotWrite] = {}
        self._slot_tasks: set[asyncio.Task[None]] = set()

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
        an ``InvalidDefinitionError``: an invocation id names one evaluation only. A running
        receipt is claimed for this run (a run it was taken from can add no slot afterwards); a
        running v2 one is upgraded to v3 by the run's first write (``resolve_pending``)."""
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
        if document.get("state") != RUNNING:
            return cls(store, key, document, clock)
        document, claim = await store.claim(key)
        journal = cls(store, key, upgraded_document(document), clock, claim=claim)
        journal._upgraded = document.get("schema") == RECEIPT_SCHEMA_V2
        return journal

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
        return self._doc["revision"] > 1 or self._doc["state"] != RUNNING or self._claim > 1

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
        record and the decision's outcome, in one write (which also upgrades a v2 receipt and
        removes the slots); returns the decision indexes they belonged to."""
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
            self._settled.append(slot_key(slot))
        self._doc["pendingDispatches"] = []
        await self._commit()
        self._upgraded = False
        return indexes

    async def mark_dispatch(self, index: int, attempt: AttemptRecord) -> None:
        """Add the attempt's pending-dispatch slot; returns once it is durable, and the adapter
        must not be called before."""
        if self._failure is not None:
            raise self._failure
        slots = self._doc["pendingDispatches"]
        if any(slot["decisionIndex"] == index for slot in slots):
            raise RuntimeError(f"decision {index} already has a dispatch pending")
        slot = {
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
        slots.append(slot)
        if len(slots) > self._doc["maxPendingDispatches"]:
            self._doc["maxPendingDispatches"] = len(slots)
        gathering = self._gathering
        if gathering is None:
            loop = asyncio.get_running_loop()
            gathering = self._gathering = _SlotWrite(loop.create_future())
            # Slots marked in this turn of the loop (a wave of calls) go in one write.
            loop.call_soon(self._start_slot_write)
        gathering.slots.append(slot)
        self._slot_flights[slot_key(slot)] = gathering
        # A waiter that is cancelled leaves the write to land.
        await asyncio.shield(gathering.landed)
        if self._failure is not None:
            # Another write failed meanwhile: the run stops, and its slot stands for a call
            # that was never made (resumed as uncertain, never sent twice).
            raise self._failure

    async def record_attempt(
        self, index: int, attempt: AttemptRecord, *, outcome: DecisionOutcome | None = None
    ) -> None:
        """Append an attempt (removing its slot if it was dispatched) and, when it ended the
        decision, the decision's outcome, in one write; returns at once (the write starts in the
        next turn of the loop, or once the write in flight lands)."""
        entry = self._doc["decisions"][index]
        entry["attempts"].append(attempt.to_dict())
        # The record of a dispatched attempt settles its slot, whatever its outcome.
        settled = (index, attempt.target_index, attempt.number)
        kept = [slot for slot in self._doc["pendingDispatches"] if slot_key(slot) != settled]
        if len(kept) != len(self._doc["pendingDispatches"]):
            self._doc["pendingDispatches"] = kept
            self._settled.append(settled)
        if outcome is not None:
            entry["status"] = outcome.status
            entry["output"] = outcome.output
        # Not waited for: until this write lands the slot stands for the attempt.
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
        # A slot write still in flight lands before the receipt closes (or fails the close).
        await self._slots_landed()
        self._doc["state"] = state
        await self._commit()

    async def settle(self) -> None:
        """Write what waits for company now, then wait until no write is in flight, whatever
        the writes end with."""
        if self._slot_tasks:
            await asyncio.wait(list(self._slot_tasks))
        if self._deferred is not None and self._flight is None and self._failure is None:
            self._start_write()
        while self._flight is not None:
            await asyncio.wait([self._flight])

    async def _slots_landed(self, keys: Iterable[SlotKey] | None = None) -> None:
        """Wait for the slot writes in flight (those holding ``keys`` only, when given)."""
        if keys is None:
            writes = {id(w): w for w in self._slot_flights.values()}
        else:
            writes = {id(w): w for k in keys if (w := self._slot_flights.get(k)) is not None}
        if self._gathering is not None and (keys is None or id(self._gathering) in writes):
            self._start_slot_write()
        for write in writes.values():
            await asyncio.shield(write.landed)

    def _start_slot_write(self) -> None:
        write, self._gathering = self._gathering, None
        if write is None:
            return  # already started by someone that could not wait for the next turn
        task = asyncio.get_running_loop().create_task(self._write_slots(write))
        self._slot_tasks.add(task)
        task.add_done_callback(self._slot_tasks.discard)

    async def _write_slots(self, write: _SlotWrite) -> None:
        try:
            if self._failure is not None:
                raise self._failure
            await self._store.add_slots(self._key, write.slots, claim=self._claim)
        except BaseException as error:
            if self._failure is None:
                self._failure = error
            write.landed.set_exception(self._failure)
            # Nobody may be waiting any more (every waiter cancelled): the failure stays known.
            write.landed.exception()
        else:
            write.landed.set_result(None)
        finally:
            for slot in write.slots:
                key = slot_key(slot)
                if self._slot_flights.get(key) is write:
                    del self._slot_flights[key]

    async def _commit(self, *, wait: bool = True) -> None:
        """Have the document changes made so far written; with ``wait``, return once they are
        durable.

        Without ``wait`` (a change that need not be durable before the run goes on: an
        attempt's record, for which its slot stands until it lands) the write starts in the next
        turn of the loop, or once the write in flight lands. A failed write is raised by every
        later commit."""
        self._changes += 1
        wanted = self._changes
        if self._failure is not None:
            raise self._failure
        if not wait:
            if self._flight is None and self._deferred is None:
                # The next turn of the loop, not later: calls ending in this turn go in the same
                # write, and nothing the run does next (a slot write, a call) holds it back.
                self._deferred = asyncio.get_running_loop().call_soon(self._write_deferred)
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
        # The slot writes under way (and those gathered this turn) go first: each holds a call
        # back until it lands, while nobody waits on a record. Once, not in a loop: slots marked
        # from now on go beside this write, which waits for one slot write at most.
        # The slots gathered this turn are written at its end, as usual, and waited for too.
        for write in {id(w): w for w in self._slot_flights.values()}.values():
            await asyncio.shield(write.landed)
        # A slot is removed only once it is durable (else its late write would outlive it).
        while any(k in self._slot_flights for k in self._settled):
            await self._slots_landed(list(self._settled))
        # Every change applied until now goes in this write: the document and the slots it
        # settles are one snapshot, taken without a pause.
        changes = self._changes
        settled = list(self._settled)
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
        await self._store.update(self._key, snapshot, expected_revision=expected, settled=settled)
        self._doc["revision"] = expected + 1
        self._doc["updatedAtEpochMs"] = now
        self._durable = changes
        del self._settled[: len(settled)]

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
