"""CNC-RECEIPT-V3 on PostgreSQL: many slots of one run written at once are all kept, a second
writer of the same run overwrites nothing, a slot never waits for its run's document write in
flight, and one run's writes never wait for another's; each with slot writes on the pool's
threads and sent from the event loop on its own connections (as a worker sends them)."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import OperationalError, connections, transaction

from admission.core import SystemClock
from evaluator.engine.errors import ReceiptConflictError
from evaluator.engine.outcomes import SUCCEEDED, AttemptRecord, DecisionOutcome
from evaluator.engine.receipts import ReceiptJournal, ReceiptKey
from evaluator.models import Receipt, ReceiptSlot
from evaluator.services import server_clock
from evaluator.worker.receipts_db import DatabaseReceiptStore
from tests.evaluator.stores import PassThroughStore

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SLOTS = 64


def attempt(index: int, *, outcome: str = "execution-uncertain") -> AttemptRecord:
    return AttemptRecord(
        target_index=0,
        adapter_id="fake",
        model="model-a",
        number=1,
        sent=True,
        outcome=outcome,
        reason="dispatched" if outcome != SUCCEEDED else "answered",
        evidence={"decision": "admit", "active": index + 1},
        started_ms=float(index),
    )


async def open_journal(store, invocation_id: str, decisions: int) -> ReceiptJournal:
    return await ReceiptJournal.open(
        store,
        ReceiptKey("ws-pg", "principal-pg", invocation_id),
        ruleset_id="stress",
        ruleset_digest="sha256:" + "0" * 64,
        decision_ids=[f"d{i}" for i in range(decisions)],
        clock=SystemClock(),
    )


def stored(invocation_id: str) -> dict:
    try:
        return Receipt.objects.get(
            workspace_id="ws-pg", invocation_id=invocation_id
        ).full_document()
    finally:
        connections.close_all()


def run_closing(store, coroutine):
    """Run `coroutine` on a new loop, closing the store's connections of that loop at its end."""

    async def closing():
        try:
            return await coroutine
        finally:
            await store.aclose()

    return asyncio.run(closing())


class CountingStore(PassThroughStore):
    """Passes everything through to the database store and counts slot writes."""

    def __init__(self, inner: DatabaseReceiptStore) -> None:
        super().__init__(inner)
        self.slot_writes = 0

    async def add_slots(self, key, slots, *, claim):
        await super().add_slots(key, slots, claim=claim)
        self.slot_writes += 1


@pytest.fixture(params=[0, 8], ids=["pool-threads", "from-the-loop"])
def direct(request):
    """How many connections of its own the loop sends slot writes on (0: the pool's threads)."""
    return request.param


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="test-db")
    yield executor

    # Each pool thread closes its own connection before the test database goes away (the
    # barrier puts one task on each thread).
    barrier = threading.Barrier(8)

    def close() -> None:
        barrier.wait(10)
        connections.close_all()

    for future in [executor.submit(close) for _ in range(8)]:
        future.result()
    executor.shutdown(wait=True)


def test_CNC_RECEIPT_V3_007_sixty_four_slots_of_one_run_filled_at_once_are_all_kept(pool, direct):
    store = CountingStore(DatabaseReceiptStore(pool, direct_slots=direct))
    rng = random.Random(7)

    async def dispatch(journal: ReceiptJournal, index: int) -> None:
        # Spread over several writes: some slots join a write in flight, some start the next.
        await asyncio.sleep(rng.random() * 0.02)
        await journal.mark_dispatch(index, attempt(index))

    async def settle(journal: ReceiptJournal, index: int) -> None:
        await asyncio.sleep(rng.random() * 0.02)
        record = attempt(index, outcome=SUCCEEDED)
        await journal.record_attempt(
            index, record, outcome=DecisionOutcome(f"d{index}", SUCCEEDED, "yes", (record,))
        )

    async def main():
        journal = await open_journal(store, "inv-stress", SLOTS)
        await asyncio.gather(*(dispatch(journal, i) for i in range(SLOTS)))
        filled = await asyncio.to_thread(stored, "inv-stress")
        await asyncio.gather(*(settle(journal, i) for i in range(SLOTS)))
        await journal.finish("completed")
        return filled, await asyncio.to_thread(stored, "inv-stress")

    filled, done = run_closing(store, main())
    # Fewer slot writes than slots: slots marked together went in one write.
    assert store.slot_writes < SLOTS
    assert sorted(slot["decisionIndex"] for slot in filled["pendingDispatches"]) == list(
        range(SLOTS)
    )
    assert done["maxPendingDispatches"] == SLOTS
    assert done["pendingDispatches"] == [] and done["state"] == "completed"
    assert [entry["status"] for entry in done["decisions"]] == [SUCCEEDED] * SLOTS
    assert all(len(entry["attempts"]) == 1 for entry in done["decisions"])
    row = Receipt.objects.get(workspace_id="ws-pg", invocation_id="inv-stress")
    assert row.pending_dispatches == 0 and row.revision == done["revision"]
    assert not ReceiptSlot.objects.filter(receipt=row).exists()


def test_a_second_writer_of_the_same_run_overwrites_no_slot(pool, direct):
    store = DatabaseReceiptStore(pool, direct_slots=direct)

    async def main():
        first = await open_journal(store, "inv-two-writers", 4)
        await first.mark_dispatch(0, attempt(0))
        # Another claimant opens the same receipt and writes first.
        second = await open_journal(store, "inv-two-writers", 4)
        await second.mark_dispatch(1, attempt(1))
        with pytest.raises(ReceiptConflictError):
            await first.mark_dispatch(2, attempt(2))
        # The journal that lost stays failed: nothing of it is written afterwards.
        with pytest.raises(ReceiptConflictError):
            await first.record_attempt(0, attempt(0, outcome=SUCCEEDED))
        return await asyncio.to_thread(stored, "inv-two-writers")

    document = run_closing(store, main())
    assert sorted(slot["decisionIndex"] for slot in document["pendingDispatches"]) == [0, 1]


def test_one_runs_writes_never_wait_for_another_runs(pool, direct):
    """A transaction holding run A's row locked does not delay run B's slots and records."""
    store = DatabaseReceiptStore(pool, direct_slots=direct)
    locked = threading.Event()
    release = threading.Event()

    def hold_row() -> None:
        try:
            with transaction.atomic():
                Receipt.objects.select_for_update().get(workspace_id="ws-pg", invocation_id="inv-a")
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    async def main():
        run_a = await open_journal(store, "inv-a", 2)
        run_b = await open_journal(store, "inv-b", 8)
        holder = threading.Thread(target=hold_row)
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        blocked = asyncio.ensure_future(run_a.mark_dispatch(0, attempt(0)))
        try:
            # B's eight dispatches and records all land while A's write waits for the lock.
            async with asyncio.timeout(10):
                await asyncio.gather(*(run_b.mark_dispatch(i, attempt(i)) for i in range(8)))
                for i in range(8):
                    await run_b.record_attempt(i, attempt(i, outcome=SUCCEEDED))
                # Closing the receipt waits for every write of B, records included.
                await run_b.finish("completed")
            a_waiting = not blocked.done()
        finally:
            release.set()
            await asyncio.to_thread(holder.join, 10)
        await blocked
        return a_waiting, await asyncio.to_thread(stored, "inv-b")

    a_waiting, document_b = run_closing(store, main())
    assert a_waiting, "run A's write should have waited for its own row's lock"
    assert document_b["state"] == "completed" and document_b["pendingDispatches"] == []
    assert all(len(entry["attempts"]) == 1 for entry in document_b["decisions"])


def test_a_slot_never_waits_for_its_runs_document_write_in_flight(pool, direct):
    """While a document write of the run holds its row (an update not yet committed), the run's
    next slots become durable; the document write behind it waits, and loses nothing."""
    store = DatabaseReceiptStore(pool, direct_slots=direct)
    locked = threading.Event()
    release = threading.Event()

    def document_write_in_flight() -> None:
        # What a document write holds until it commits: the row, locked by an UPDATE.
        try:
            with transaction.atomic():
                Receipt.objects.filter(workspace_id="ws-pg", invocation_id="inv-flight").update(
                    updated_at=server_clock.now()
                )
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    async def main():
        journal = await open_journal(store, "inv-flight", 8)
        await journal.mark_dispatch(0, attempt(0))
        holder = threading.Thread(target=document_write_in_flight)
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        record = attempt(0, outcome=SUCCEEDED)
        await journal.record_attempt(
            0, record, outcome=DecisionOutcome("d0", SUCCEEDED, "yes", (record,))
        )
        # The record's write starts and waits for the row.
        blocked = asyncio.ensure_future(journal.settle())
        try:
            async with asyncio.timeout(10):
                await asyncio.gather(*(journal.mark_dispatch(i, attempt(i)) for i in range(1, 8)))
            during = await asyncio.to_thread(stored, "inv-flight")
            document_waiting = not blocked.done()
        finally:
            release.set()
            await asyncio.to_thread(holder.join, 10)
        await blocked
        return during, document_waiting, await asyncio.to_thread(stored, "inv-flight")

    during, document_waiting, after = run_closing(store, main())
    assert document_waiting, "the document write should have waited for the row"
    # All eight slots were durable while the document write waited (d0's not yet settled).
    assert sorted(slot["decisionIndex"] for slot in during["pendingDispatches"]) == list(range(8))
    # Then the record landed with d0's slot removed, and no other slot was lost.
    assert sorted(slot["decisionIndex"] for slot in after["pendingDispatches"]) == list(range(1, 8))
    assert after["decisions"][0]["status"] == SUCCEEDED


class WatchedStore(CountingStore):
    """Notes, in order, when slot writes land and document writes start."""

    def __init__(self, inner: DatabaseReceiptStore) -> None:
        super().__init__(inner)
        self.events: list[str] = []
        self.updated = asyncio.Event()

    async def add_slots(self, key, slots, *, claim):
        await super().add_slots(key, slots, claim=claim)
        self.events.append("slots " + ",".join(str(slot["decisionIndex"]) for slot in slots))

    async def update(self, key, document, *, expected_revision, settled=()):
        self.events.append("update")
        await super().update(key, document, expected_revision=expected_revision, settled=settled)
        self.updated.set()


def test_an_attempts_record_is_written_once_the_next_slot_lands_and_needs_nothing_more(
    pool, direct
):
    """The record of an attempt whose call ended is written as soon as the next call's slot
    write, under way in the same turn, has landed (the call waits on that one, nobody on the
    record), and lands with nothing more from the run: a worker killed while its next call is
    out loses only that call's outcome."""
    store = WatchedStore(DatabaseReceiptStore(pool, direct_slots=direct))

    async def main():
        journal = await open_journal(store, "inv-prompt", 2)
        await journal.mark_dispatch(0, attempt(0))
        record = attempt(0, outcome=SUCCEEDED)
        await journal.record_attempt(
            0, record, outcome=DecisionOutcome("d0", SUCCEEDED, "yes", (record,))
        )
        # The next decision's call is admitted at once: its slot is written.
        await journal.mark_dispatch(1, attempt(1))
        # The run does nothing more (its next call is out): the record lands by itself.
        async with asyncio.timeout(10):
            await store.updated.wait()
        durable = await asyncio.to_thread(stored, "inv-prompt")
        await journal.settle()
        return durable

    durable = run_closing(store, main())
    # The slot write went first; the record's write started right after it, and only once.
    assert store.events == ["slots 0", "slots 1", "update"]
    assert durable["decisions"][0]["status"] == SUCCEEDED
    assert [a["outcome"] for a in durable["decisions"][0]["attempts"]] == [SUCCEEDED]
    # Only the call still out has its slot: resumed now, d0 would not turn uncertain.
    assert [slot["decisionIndex"] for slot in durable["pendingDispatches"]] == [1]


def test_a_slot_connection_the_server_dropped_is_replaced_at_the_next_write(pool):
    """A slot write on a loop connection the server closed fails as Django's database errors
    do (the run stops and is resumed elsewhere); the loop's next slot write opens a fresh one."""
    store = DatabaseReceiptStore(pool, direct_slots=1)

    def drop_slot_connections() -> int:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query LIKE 'INSERT INTO evaluator_receiptslot%%'"
                )
                return cursor.rowcount
        finally:
            connections.close_all()

    async def main():
        first = await open_journal(store, "inv-dropped", 2)
        await first.mark_dispatch(0, attempt(0))
        dropped = await asyncio.to_thread(drop_slot_connections)
        with pytest.raises(OperationalError):
            await first.mark_dispatch(1, attempt(1))
        # The next claimant of the receipt writes its slots on a fresh connection.
        second = await open_journal(store, "inv-dropped", 2)
        await second.mark_dispatch(1, attempt(1))
        return dropped, await asyncio.to_thread(stored, "inv-dropped")

    dropped, document = run_closing(store, main())
    assert dropped == 1
    assert sorted(slot["decisionIndex"] for slot in document["pendingDispatches"]) == [0, 1]


def test_slot_writes_from_the_loop_never_queue_behind_the_pools_threads(pool):
    """With every pool thread busy (document and result writes of other runs, say), a slot sent
    from the loop still becomes durable, and the call it holds back can start."""
    store = DatabaseReceiptStore(pool, direct_slots=2)
    release = threading.Event()
    busy = threading.Barrier(9)

    def occupy() -> None:
        busy.wait(10)
        release.wait(30)

    async def main():
        journal = await open_journal(store, "inv-busy-pool", 4)
        held = [pool.submit(occupy) for _ in range(8)]
        try:
            await asyncio.to_thread(busy.wait, 10)
            async with asyncio.timeout(10):
                await asyncio.gather(*(journal.mark_dispatch(i, attempt(i)) for i in range(4)))
        finally:
            release.set()
            for future in held:
                future.result(10)
        return await asyncio.to_thread(stored, "inv-busy-pool")

    document = run_closing(store, main())
    assert sorted(slot["decisionIndex"] for slot in document["pendingDispatches"]) == [0, 1, 2, 3]


def test_slot_connections_are_opened_ahead_of_the_writes_that_need_them(pool, monkeypatch):
    """`warm` opens the loop's slot connections before the first write; a write that takes the
    last idle one has a spare opened in the background (never more than `direct_slots` in all);
    `aclose` closes every one."""
    import psycopg

    store = DatabaseReceiptStore(pool, direct_slots=3)
    opened: list[psycopg.AsyncConnection] = []
    real = psycopg.AsyncConnection.connect

    async def counting(*args, **kwargs):
        connection = await real(*args, **kwargs)
        opened.append(connection)
        return connection

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", counting)

    async def until(count: int) -> None:
        async with asyncio.timeout(10):
            while len(opened) < count:
                await asyncio.sleep(0.005)

    async def main():
        await store.warm(2)
        await store.warm(2)  # two are being opened already: nothing more
        await until(2)
        runs = [await open_journal(store, f"inv-warm-{n}", 1) for n in range(2)]
        # Two runs' slot writes at once: each takes an idle connection, none is opened for them;
        # the second took the last one, so a spare is opened behind them.
        await asyncio.gather(*(run.mark_dispatch(0, attempt(0)) for run in runs))
        await until(3)
        third = await open_journal(store, "inv-warm-2", 1)
        await third.mark_dispatch(0, attempt(0))
        await asyncio.sleep(0.05)
        return list(opened)

    connected = run_closing(store, main())
    assert len(connected) == 3
    assert all(connection.closed for connection in connected)
