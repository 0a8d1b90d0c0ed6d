"""A ``ReceiptStore`` in the database (``evaluator.models.Receipt``).

The ORM is synchronous; every call runs through ``sync_to_async``, which uses the loop's
executor, so a ``VirtualTimeLoop`` holds virtual time still while the database works.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from evaluator.engine.errors import ReceiptConflictError
from evaluator.engine.receipts import RUNNING, ReceiptKey
from evaluator.models import Receipt

__all__ = ["DatabaseReceiptStore"]


class DatabaseReceiptStore:
    """Receipts as ``Receipt`` rows, one per (workspace, invocation)."""

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        """See ``ReceiptStore.load``."""
        return await sync_to_async(self._load, thread_sensitive=True)(key)

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        """See ``ReceiptStore.create``."""
        await sync_to_async(self._create, thread_sensitive=True)(key, dict(document))

    async def update(
        self, key: ReceiptKey, document: Mapping[str, Any], *, expected_revision: int
    ) -> None:
        """See ``ReceiptStore.update``."""
        await sync_to_async(self._update, thread_sensitive=True)(
            key, dict(document), expected_revision
        )

    async def aclose(self) -> None:
        """Close the database connections of the thread the store worked in."""
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
                    pending_dispatch=document["pendingDispatch"] is not None,
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
            state=document["state"],
            revision=document["revision"],
            pending_dispatch=document["pendingDispatch"] is not None,
            document=document,
            updated_at=timezone.now(),
        )
        if updated != 1:
            raise ReceiptConflictError(key.invocation_id, expected_revision)
