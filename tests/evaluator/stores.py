"""A receipt store for the evaluator tests that hands every call on to another store: a test's
store subclasses it and overrides only the calls it counts or breaks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evaluator.engine.receipts import ReceiptKey, ReceiptStore, SlotKey


class PassThroughStore:
    """Every `ReceiptStore` call goes to `inner` unchanged."""

    def __init__(self, inner: ReceiptStore) -> None:
        self.inner = inner

    async def load(self, key: ReceiptKey) -> dict[str, Any] | None:
        return await self.inner.load(key)

    async def create(self, key: ReceiptKey, document: Mapping[str, Any]) -> None:
        await self.inner.create(key, document)

    async def claim(self, key: ReceiptKey) -> tuple[dict[str, Any], int]:
        return await self.inner.claim(key)

    async def add_slots(
        self, key: ReceiptKey, slots: Sequence[Mapping[str, Any]], *, claim: int
    ) -> None:
        await self.inner.add_slots(key, slots, claim=claim)

    async def update(
        self,
        key: ReceiptKey,
        document: Mapping[str, Any],
        *,
        expected_revision: int,
        settled: Sequence[SlotKey] = (),
    ) -> None:
        await self.inner.update(key, document, expected_revision=expected_revision, settled=settled)

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()
