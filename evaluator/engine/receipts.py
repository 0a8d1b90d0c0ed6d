"""Durable receipts (v2): what an invocation has done, so a crashed run resumes without
dispatching anything twice.

A v2 receipt has exactly one pending-dispatch slot. It is written before an adapter call and
cleared with the attempt's record, so a receipt that still holds it on resume means "sent, outcome
unknown", which resolves to ``execution-uncertain`` and is never dispatched again. One slot means
one dispatch in flight, which is why receipt-backed runs execute at concurrency 1.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from evaluator.engine.errors import InvalidDefinitionError, ReceiptConflictError
from evaluator.engine.outcomes import EXECUTION_UNCERTAIN, AttemptRecord, DecisionOutcome

__all__ = [
    "RECEIPT_SCHEMA",
    "RUN_STATES",
    "InMemoryReceiptStore",
    "ReceiptJournal",
    "ReceiptKey",
    "ReceiptStore",
]

RECEIPT_SCHEMA = "decision-evaluation-receipt/v2"
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


class ReceiptJournal:
    """The evaluator's writer for one receipt: every change is one compare-and-set update."""

    def __init__(
        self, store: ReceiptStore, key: ReceiptKey, document: dict[str, Any], clock: Any
    ) -> None:
        self._store = store
        self._key = key
        self._doc = document
        self._clock = clock

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
        an ``InvalidDefinitionError``: an invocation id names one evaluation only."""
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
                "pendingDispatch": None,
                "decisions": [
                    {"decisionId": decision_id, "status": None, "output": None, "attempts": []}
                    for decision_id in decision_ids
                ],
                "createdAtEpochMs": now,
                "updatedAtEpochMs": now,
            }
            await store.create(key, document)
            return cls(store, key, document, clock)
        if document.get("schema") != RECEIPT_SCHEMA:
            raise InvalidDefinitionError("invocationId", "names a receipt of another schema")
        if document.get("rulesetDigest") != ruleset_digest:
            raise InvalidDefinitionError("invocationId", "names a receipt of another ruleset")
        return cls(store, key, document, clock)

    @property
    def document(self) -> dict[str, Any]:
        """A copy of the current document."""
        return copy.deepcopy(self._doc)

    @property
    def state(self) -> str:
        return self._doc["state"]

    @property
    def resumed(self) -> bool:
        """Whether the receipt existed before this run opened it."""
        return self._doc["revision"] > 1 or self._doc["state"] != RUNNING

    def outcome(self, index: int) -> DecisionOutcome | None:
        """The recorded outcome of decision ``index``, or None while it is unfinished."""
        entry = self._doc["decisions"][index]
        if entry["status"] is None:
            return None
        return DecisionOutcome.from_dict(entry)

    def attempts(self, index: int) -> list[AttemptRecord]:
        """Attempts recorded for decision ``index`` so far."""
        return [AttemptRecord.from_dict(item) for item in self._doc["decisions"][index]["attempts"]]

    async def resolve_pending(self) -> int | None:
        """Turn a pending-dispatch slot left by a crash into an ``execution-uncertain`` attempt
        and outcome; returns the decision index it belonged to."""
        slot = self._doc["pendingDispatch"]
        if slot is None:
            return None
        index = slot["decisionIndex"]
        attempt = AttemptRecord(
            target_index=slot["targetIndex"],
            adapter_id=slot["adapterId"],
            model=slot["model"],
            number=slot["number"],
            sent=True,
            outcome=EXECUTION_UNCERTAIN,
            reason=DISPATCH_UNCONFIRMED,
            evidence=slot.get("evidence"),
            started_ms=slot.get("startedMs", 0.0),
            ended_ms=slot.get("startedMs", 0.0),
        )
        entry = self._doc["decisions"][index]
        entry["attempts"].append(attempt.to_dict())
        entry["status"] = EXECUTION_UNCERTAIN
        self._doc["pendingDispatch"] = None
        await self._write()
        return index

    async def mark_dispatch(self, index: int, attempt: AttemptRecord) -> None:
        """Fill the pending-dispatch slot; must be durable before the adapter is called."""
        if self._doc["pendingDispatch"] is not None:
            raise RuntimeError("receipt v2 holds one pending dispatch; another is already pending")
        self._doc["pendingDispatch"] = {
            "decisionIndex": index,
            "targetIndex": attempt.target_index,
            "adapterId": attempt.adapter_id,
            "model": attempt.model,
            "number": attempt.number,
            "startedMs": attempt.started_ms,
            "evidence": dict(attempt.evidence) if attempt.evidence is not None else None,
            "atEpochMs": self._clock.epoch_ms(),
        }
        await self._write()

    async def record_attempt(
        self, index: int, attempt: AttemptRecord, *, outcome: DecisionOutcome | None = None
    ) -> None:
        """Append an attempt (clearing the slot if it was the dispatched one) and, when it
        ended the decision, the decision's outcome, in one write."""
        entry = self._doc["decisions"][index]
        entry["attempts"].append(attempt.to_dict())
        slot = self._doc["pendingDispatch"]
        # The attempt that follows a dispatch mark settles it, whatever its outcome.
        if slot is not None and slot["decisionIndex"] == index:
            self._doc["pendingDispatch"] = None
        if outcome is not None:
            entry["status"] = outcome.status
            entry["output"] = outcome.output
        await self._write()

    async def finish_decision(self, index: int, outcome: DecisionOutcome) -> None:
        """Record a decision that ended without a new attempt (cancelled while waiting)."""
        entry = self._doc["decisions"][index]
        if entry["status"] is not None:
            return
        entry["status"] = outcome.status
        entry["output"] = outcome.output
        await self._write()

    async def finish(self, state: str) -> None:
        """Close the receipt with its terminal run state; no write is accepted afterwards."""
        if state not in RUN_STATES or state == RUNNING:
            raise ValueError(f"not a terminal run state: {state!r}")
        self._doc["state"] = state
        await self._write()

    async def _write(self) -> None:
        expected = self._doc["revision"]
        self._doc["revision"] = expected + 1
        self._doc["updatedAtEpochMs"] = self._clock.epoch_ms()
        try:
            await self._store.update(self._key, self._doc, expected_revision=expected)
        except BaseException:
            self._doc["revision"] = expected
            raise
