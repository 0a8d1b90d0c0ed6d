"""Migration 0012: a running v3 receipt's slots move from its document to slot rows, so the
model counts them; a v2 receipt keeps its one slot in its document and is counted from there."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("evaluator", "0011_run_times_from_the_database")]
AFTER = [("evaluator", "0012_receipt_slots")]


def slot(index: int) -> dict:
    return {
        "decisionId": f"d{index}",
        "decisionIndex": index,
        "targetIndex": 0,
        "adapterId": "fake",
        "model": "m",
        "number": 1,
        "startedMs": 1.0,
        "evidence": None,
        "atEpochMs": 2.0,
    }


def document(schema: str, **extra) -> dict:
    return {
        "schema": f"decision-evaluation-receipt/{schema}",
        "state": "running",
        "revision": 3,
        "decisions": [
            {"decisionId": f"d{i}", "status": None, "output": None, "attempts": []}
            for i in range(3)
        ],
        **extra,
    }


def test_migration_moves_v3_slots_to_rows_and_keeps_a_v2_slot_in_its_document():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("evaluator", "Receipt")
    common = {"workspace_id": "ws", "principal_id": "p", "ruleset_id": "r", "revision": 3}
    old.objects.create(
        invocation_id="v3",
        schema="decision-evaluation-receipt/v3",
        ruleset_digest="d",
        pending_dispatch=True,
        document=document("v3", pendingDispatches=[slot(0), slot(2)], maxPendingDispatches=2),
        **common,
    )
    old.objects.create(
        invocation_id="v2",
        schema="decision-evaluation-receipt/v2",
        ruleset_digest="d",
        pending_dispatch=True,
        document=document("v2", pendingDispatch=slot(1)),
        **common,
    )
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)

    from evaluator.models import Receipt

    v3 = Receipt.objects.get(invocation_id="v3")
    assert "pendingDispatches" not in v3.document
    assert sorted(v3.slots.values_list("decision_index", flat=True)) == [0, 2]
    assert v3.pending_dispatches == 2
    assert [s["decisionId"] for s in v3.full_document()["pendingDispatches"]] == ["d0", "d2"]
    v2 = Receipt.objects.get(invocation_id="v2")
    assert v2.document["pendingDispatch"]["decisionIndex"] == 1
    assert v2.pending_dispatches == 1 and not v2.slots.exists()

    # And back: the slots return to the document and the flag.
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("evaluator", "Receipt")
    back = old.objects.get(invocation_id="v3")
    assert back.pending_dispatch is True
    assert [s["decisionIndex"] for s in back.document["pendingDispatches"]] == [0, 2]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
