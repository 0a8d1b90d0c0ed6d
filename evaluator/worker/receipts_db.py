"""A ``ReceiptStore`` in the database (``evaluator.models.Receipt``).

The ORM is synchronous; every call runs through ``sync_to_async``, which uses the loop's
executor, so a ``VirtualTimeLoop`` holds virtual time still while the database works. By default
calls run in asgiref's one thread-sensitive thread; a worker running many evaluations at once
passes a thread pool of its own, so their writes do not queue behind each other. Either way a
connection the server dropped is closed when a call fails, and the next call reconnects.

Slots are ``ReceiptSlot`` rows. On PostgreSQL a slot write is one statement in autocommit: an
``INSERT ... SELECT`` that finds the receipt row under its claim and state and locks it ``FOR KEY
SHARE``. That lock does not conflict with a document write (an ``UPDATE`` of non-key columns), so
a slot never waits for the document write in flight; it does conflict with the ``FOR UPDATE`` a
claim takes, so a run the receipt was taken from adds no slot once the claim is under way, and the
claim sees every slot added before it. Other databases (SQLite serialises every write anyway)
check and insert in one transaction.

A store made with ``direct_slots`` sends slot writes from the event loop itself, on autocommit
connections of that loop (at most ``direct_slots`` at once, kept for the next writes; ``warm``
opens some ahead of the first write, and a spare is opened in the background whenever a write
takes the last idle one, so an opening is seldom paid before a call): a slot write is then one
round trip between the loop and the server, with no thread in between, and never waits behind
the pool's document writes. ``aclose`` on that loop closes them. A loop on virtual time keeps
the pool (its time stands still only for executor jobs).

A document write is one statement in autocommit on PostgreSQL too: an ``UPDATE`` (compare-and-set
on the revision, only while running) with a ``DELETE`` of the slots it settles in the same
statement, removing them only if the update matched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import psycopg
from asgiref.sync import sync_to_async
from django.db import IntegrityError, InterfaceError, OperationalError, connections, transaction
from django.db import utils as db_errors
from django.db.models import Q

from admission.core import VirtualTimeLoop
from evaluator.engine.errors import ReceiptConflictError
from evaluator.engine.receipts import (
    RUNNING,
    ReceiptKey,
    SlotKey,
    slot_key,
    split_slots,
)
from evaluator.models import Receipt, ReceiptSlot
from evaluator.services import server_clock

__all__ = ["DatabaseReceiptStore", "in_database_thread"]

P = ParamSpec("P")
R = TypeVar("R")


def _reconnecting(function: Callable[P, R]) -> Callable[P, R]:
    @wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except (OperationalError, InterfaceError):
            # The server went away: this thread's next call opens a fresh connection.
            connections["default"].close()
            raise

    return call


def in_database_thread(
    function: Callable[P, R], executor: ThreadPoolExecutor | None = None
) -> Callable[P, Awaitable[R]]:
    """`function` as a coroutine function run in `executor` (asgiref's thread-sensitive thread
    when None), closing the thread's connection when the database is unreachable."""
    if executor is None:
        return sync_to_async(_reconnecting(function), thread_sensitive=True)
    return sync_to_async(_reconnecting(function), thread_sensitive=False, executor=executor)


class DatabaseReceiptStore:
    """Receipts as ``Receipt`` rows, one per (workspace, invocation)."""

    def __init__(
        self, executor: ThreadPoolExecutor | None = None, *, direct_slots: int = 0
    ) -> None:
        self._executor = executor
        # Slot writes from the loop (PostgreSQL only): per loop, at most this many connections.
        self._direct_slots = direct_slots if connections["default"].vendor == "postgresql" else 0
        self._loop_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopConnections] = (
            weakref.WeakKeyDictionary()
        )

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """See ``ReceiptStore.load``."""
        return await in_database_thread(self._load, self._executor)(key)

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """See ``ReceiptStore.create``."""
        await in_database_thread(self._create, self._executor)(key, dict(document))

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        """See ``ReceiptStore.claim``."""
        return await in_database_thread(self._claim, self._executor)(key)

    async def add_slots(
        self, key: ReceiptKey, slots: Sequence[Mapping[str, Any]], *, claim: int
    ) -> None:
        """See ``ReceiptStore.add_slots``."""
        direct = self._loop_connections()
        if direct is not None:
            sql, params = _slot_insert(key, slots, claim)
            async with direct.connection() as connection:
                try:
                    cursor = await connection.execute(sql, params)
                except psycopg.IntegrityError:
                    raise ReceiptConflictError(key.invocation_id, 0) from None
                except psycopg.Error as error:
                    raise _django_error(error) from error
            if cursor.rowcount != len(slots):
                raise ReceiptConflictError(key.invocation_id, 0)
            return
        await in_database_thread(self._add_slots, self._executor)(
            key, [dict(slot) for slot in slots], claim
        )

    async def warm(self, count: int = 2) -> None:
        """Start opening ``count`` of the running loop's slot connections (at most
        ``direct_slots``) in the background, so the first slot writes find them open; returns at
        once. Nothing when slot writes do not go from this loop."""
        direct = self._loop_connections()
        if direct is not None:
            direct.warm(count)

    def _loop_connections(self) -> _LoopConnections | None:
        """The running loop's slot connections, when slot writes go from the loop."""
        if not self._direct_slots:
            return None
        loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualTimeLoop):
            return None
        found = self._loop_slots.get(loop)
        if found is None:
            found = self._loop_slots[loop] = _LoopConnections(self._direct_slots)
        return found

    async def update(
        self,
        key: ReceiptKey,
        document: Mapping[str, Any],
        *,
        expected_revision: int,
        settled: Sequence[SlotKey] = (),
    ) -> None:
        """See ``ReceiptStore.update``."""
        await in_database_thread(self._update, self._executor)(
            key, dict(document), expected_revision, list(settled)
        )

    async def aclose(self) -> None:
        """Close the database connections of the thread the store worked in (the default
        thread; a pool's threads belong to its owner) and the running loop's slot connections."""
        direct = self._loop_slots.pop(asyncio.get_running_loop(), None)
        if direct is not None:
            await direct.aclose()
        if self._executor is None:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    @staticmethod
    def _receipt(key: ReceiptKey) -> Any:
        return Receipt.objects.filter(
            workspace_id=key.workspace_id,
            invocation_id=key.invocation_id,
            principal_id=key.principal_id,
        )

    @classmethod
    def _load(cls, key: ReceiptKey) -> dict[str, Any] | None:
        row = cls._receipt(key).only("document").first()
        return row.full_document() if row is not None else None

    @staticmethod
    def _create(key: ReceiptKey, document: dict[str, Any]) -> None:
        body, slots = split_slots(document)
        try:
            with transaction.atomic():
                receipt = Receipt.objects.create(
                    workspace_id=key.workspace_id,
                    principal_id=key.principal_id,
                    invocation_id=key.invocation_id,
                    schema=document["schema"],
                    ruleset_id=document["rulesetId"],
                    ruleset_digest=document["rulesetDigest"],
                    state=document["state"],
                    revision=document["revision"],
                    document=body,
                )
                ReceiptSlot.objects.bulk_create(_rows(receipt.pk, slots.values()))
        except IntegrityError:
            raise ReceiptConflictError(key.invocation_id, 0) from None

    @classmethod
    def _claim(cls, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        with transaction.atomic():
            # FOR UPDATE: waits for slot writes under way and keeps new ones out until the new
            # claim is committed; they then find the claim changed and add nothing.
            row = cls._receipt(key).select_for_update().filter(state=RUNNING).first()
            if row is None:
                raise ReceiptConflictError(key.invocation_id, 0)
            row.claim += 1
            Receipt.objects.filter(pk=row.pk).update(claim=row.claim)
            return row.full_document(), row.claim

    @classmethod
    def _add_slots(cls, key: ReceiptKey, slots: list[dict[str, Any]], claim: int) -> None:
        connection = connections["default"]
        if connection.vendor != "postgresql":
            cls._add_slots_in_transaction(key, slots, claim)
            return
        sql, params = _slot_insert(key, slots, claim)
        try:
            # Autocommit: the statement is its own transaction, one round trip.
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                added = cursor.rowcount
        except IntegrityError:
            raise ReceiptConflictError(key.invocation_id, 0) from None
        if added != len(slots):
            raise ReceiptConflictError(key.invocation_id, 0)

    @classmethod
    def _add_slots_in_transaction(
        cls, key: ReceiptKey, slots: list[dict[str, Any]], claim: int
    ) -> None:
        try:
            with transaction.atomic():
                receipt = (
                    cls._receipt(key)
                    .filter(claim=claim, state=RUNNING)
                    .values_list("pk", flat=True)
                    .first()
                )
                if receipt is None:
                    raise ReceiptConflictError(key.invocation_id, 0)
                ReceiptSlot.objects.bulk_create(_rows(receipt, slots))
        except IntegrityError:
            raise ReceiptConflictError(key.invocation_id, 0) from None

    @classmethod
    def _update(
        cls,
        key: ReceiptKey,
        document: dict[str, Any],
        expected_revision: int,
        settled: list[SlotKey],
    ) -> None:
        body, _ = split_slots(document)
        connection = connections["default"]
        if connection.vendor != "postgresql":
            cls._update_in_transaction(key, document, body, expected_revision, settled)
            return
        receipt_table = Receipt._meta.db_table
        slot_table = ReceiptSlot._meta.db_table
        params: list[Any] = [
            document["schema"],
            document["state"],
            document["revision"],
            json.dumps(body),
            key.workspace_id,
            key.invocation_id,
            key.principal_id,
            expected_revision,
            RUNNING,
        ]
        # The settled slots go in the same statement, removed only if the update matched.
        removal = ""
        if settled:
            removal = (
                f", removed AS (DELETE FROM {slot_table} s USING updated "
                "WHERE s.receipt_id = updated.id "
                "AND (s.decision_index, s.target_index, s.number) IN "
                f"(VALUES {', '.join(['(%s, %s, %s)'] * len(settled))}))"
            )
            for decision, target, number in settled:
                params.extend([decision, target, number])
        sql = (
            f"WITH updated AS (UPDATE {receipt_table} SET schema = %s, state = %s, "
            "revision = %s, document = %s::jsonb, updated_at = clock_timestamp() "
            "WHERE workspace_id = %s AND invocation_id = %s AND principal_id = %s "
            f"AND revision = %s AND state = %s RETURNING id){removal} "
            "SELECT count(*) FROM updated"
        )
        # Autocommit: one statement, one round trip, the update and the removal atomic.
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            (updated,) = cursor.fetchone()
        if updated != 1:
            raise ReceiptConflictError(key.invocation_id, expected_revision)

    @classmethod
    def _update_in_transaction(
        cls,
        key: ReceiptKey,
        document: dict[str, Any],
        body: dict[str, Any],
        expected_revision: int,
        settled: list[SlotKey],
    ) -> None:
        with transaction.atomic():
            updated = (
                cls._receipt(key)
                .filter(revision=expected_revision, state=RUNNING)
                .update(
                    schema=document["schema"],
                    state=document["state"],
                    revision=document["revision"],
                    document=body,
                    updated_at=server_clock.now(),
                )
            )
            if updated != 1:
                raise ReceiptConflictError(key.invocation_id, expected_revision)
            if settled:
                settles = Q()
                for decision, target, number in settled:
                    settles |= Q(decision_index=decision, target_index=target, number=number)
                ReceiptSlot.objects.filter(
                    settles,
                    receipt__workspace_id=key.workspace_id,
                    receipt__invocation_id=key.invocation_id,
                ).delete()


def _rows(receipt_id: int, slots: Any) -> list[ReceiptSlot]:
    return [
        ReceiptSlot(
            receipt_id=receipt_id,
            decision_index=slot["decisionIndex"],
            target_index=slot["targetIndex"],
            number=slot["number"],
            slot=slot,
        )
        for slot in slots
    ]


def _slot_insert(
    key: ReceiptKey, slots: Sequence[Mapping[str, Any]], claim: int
) -> tuple[str, list[Any]]:
    """The one statement that adds ``slots`` (PostgreSQL): it finds the receipt row under its
    claim and state, locked ``FOR KEY SHARE``, and inserts nothing otherwise."""
    values = ", ".join(["(%s, %s, %s, %s::jsonb)"] * len(slots))
    params: list[Any] = []
    for slot in slots:
        params.extend([*slot_key(slot), json.dumps(slot)])
    slot_table = ReceiptSlot._meta.db_table
    receipt_table = Receipt._meta.db_table
    sql = (
        f"INSERT INTO {slot_table} (receipt_id, decision_index, target_index, number, slot) "
        f"SELECT r.id, v.d, v.t, v.n, v.s FROM {receipt_table} r, "
        f"(VALUES {values}) AS v (d, t, n, s) "
        "WHERE r.workspace_id = %s AND r.invocation_id = %s AND r.principal_id = %s "
        "AND r.claim = %s AND r.state = %s FOR KEY SHARE OF r"
    )
    params.extend([key.workspace_id, key.invocation_id, key.principal_id, claim, RUNNING])
    return sql, params


# What psycopg raises, as Django raises it (the runner tells a database that went away by these).
_DJANGO_ERRORS = (
    db_errors.DataError,
    db_errors.OperationalError,
    db_errors.IntegrityError,
    db_errors.InternalError,
    db_errors.ProgrammingError,
    db_errors.NotSupportedError,
    db_errors.InterfaceError,
    db_errors.DatabaseError,
)


def _django_error(error: psycopg.Error) -> db_errors.Error:
    for django_type in _DJANGO_ERRORS:
        if isinstance(error, getattr(psycopg, django_type.__name__)):
            return django_type(*error.args)
    return db_errors.Error(*error.args)


class _LoopConnections:
    """The autocommit connections one event loop writes slots on, at most ``size`` in use at
    once (a write that finds them all busy waits for one). A connection whose write failed other
    than by a constraint, or was cancelled, is closed, and the next write opens a fresh one.

    Opening a connection takes a few milliseconds (tens on a loaded machine), too long to pay
    before a call: ``warm`` opens some ahead of the first write, and whenever a write takes the
    last idle one, a spare is opened in the background (while fewer than ``size`` are held or
    being opened), so slot writes that overlap find one ready. A spare that cannot be opened is
    no error: the write that needs one opens it."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._free = asyncio.Semaphore(size)
        self._in_use = 0
        self._opening: set[asyncio.Task[None]] = set()

    def warm(self, count: int) -> None:
        """Open connections in the background until ``count`` (at most ``size``) are idle or
        being opened."""
        while len(self._idle) + len(self._opening) < min(count, self._size) and self._room():
            self._open_spare()

    def _room(self) -> bool:
        return self._in_use + len(self._idle) + len(self._opening) < self._size

    def _open_spare(self) -> None:
        task = asyncio.get_running_loop().create_task(self._spare())
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    @staticmethod
    async def _connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(**_connection_params(), autocommit=True)

    async def _spare(self) -> None:
        try:
            connection = await self._connect()
        except psycopg.Error:
            return
        if self._in_use + len(self._idle) >= self._size:
            await connection.close()
        else:
            self._idle.append(connection)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._free:
            self._in_use += 1
            try:
                if self._idle:
                    connection = self._idle.pop()
                else:
                    try:
                        connection = await self._connect()
                    except psycopg.Error as error:
                        raise _django_error(error) from error
                if not self._idle and not self._opening and self._room():
                    # The next write that overlaps this one finds a connection ready.
                    self._open_spare()
                try:
                    yield connection
                except (psycopg.IntegrityError, ReceiptConflictError):
                    self._keep(connection)
                    raise
                except BaseException:
                    # The server went away, or the write was cancelled mid-statement.
                    await connection.close()
                    raise
                else:
                    self._keep(connection)
            finally:
                self._in_use -= 1

    def _keep(self, connection: psycopg.AsyncConnection[Any]) -> None:
        if connection.closed or connection.broken:
            return
        self._idle.append(connection)

    async def aclose(self) -> None:
        opening, self._opening = list(self._opening), set()
        for task in opening:
            task.cancel()
        if opening:
            await asyncio.wait(opening)
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()


def _connection_params() -> dict[str, Any]:
    """What the default database's connections are opened with, less Django's own parts."""
    params = connections["default"].get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    return dict(params)
