"""A ``ReceiptStore`` in the database (``evaluator.models.Receipt``).

The ORM is synchronous; every call runs through ``sync_to_async``, which uses the loop's
executor, so a ``VirtualTimeLoop`` holds virtual time still while the database works. By default
calls run in asgiref's one thread-sensitive thread; a worker running many evaluations at once
passes a thread pool of its own, so their writes do not queue behind each other. Either way a
connection the server dropped is closed when a call fails, and the next call reconnects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import IntegrityError, InterfaceError, OperationalError, connections, transaction

from evaluator.engine.errors import ReceiptConflictError
from evaluator.engine.receipts import RUNNING, ReceiptKey, pending_slots
from evaluator.models import Receipt
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

    def __init__(self, executor: ThreadPoolExecutor | None = None) -> None:
        self._executor = executor

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """See ``ReceiptStore.load``."""
        return await in_database_thread(self._load, self._executor)(key)

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """See ``ReceiptStore.create``."""
        await in_database_thread(self._create, self._executor)(key, dict(document))

    async def update(
        self, key: ReceiptKey, document: Mapping[str, Any], *, expected_revision: int
    ) -> None:
        """See ``ReceiptStore.update``."""
        await in_database_thread(self._update, self._executor)(
            key, dict(document), expected_revision
        )

    async def aclose(self) -> None:
        """Close the database connections of the thread the store worked in (the default
        thread; a pool's threads belong to its owner)."""
        if self._executor is None:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    @staticmethod
    def _load(key: ReceiptKey) -> dict[str, Any] | None:
        row = (
            Receipt.objects.filter(
                workspace_id=key.workspace_id,
                invocation_id=key.invocation_id,
                principal_id=key.principal_id,
            )
            .only("document")
            .first()
        )
        return row.document if row is not None else None

    @staticmethod
    def _create(key: ReceiptKey, document: dict[str, Any]) -> None:
        try:
            with transaction.atomic():
                Receipt.objects.create(
                    workspace_id=key.workspace_id,
                    principal_id=key.principal_id,
                    invocation_id=key.invocation_id,
                    schema=document["schema"],
                    ruleset_id=document["rulesetId"],
                    ruleset_digest=document["rulesetDigest"],
                    state=document["state"],
                    revision=document["revision"],
                    pending_dispatch=bool(pending_slots(document)),
                    document=document,
                )
        except IntegrityError:
            raise ReceiptConflictError(key.invocation_id, 0) from None

    @staticmethod
    def _update(key: ReceiptKey, document: dict[str, Any], expected_revision: int) -> None:
        updated = Receipt.objects.filter(
            workspace_id=key.workspace_id,
            invocation_id=key.invocation_id,
            principal_id=key.principal_id,
            revision=expected_revision,
            state=RUNNING,
        ).update(
            schema=document["schema"],
            state=document["state"],
            revision=document["revision"],
            pending_dispatch=bool(pending_slots(document)),
            document=document,
            updated_at=server_clock.now(),
        )
        if updated != 1:
            raise ReceiptConflictError(key.invocation_id, expected_revision)
