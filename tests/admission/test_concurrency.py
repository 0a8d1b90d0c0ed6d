"""Concurrent activations on real PostgreSQL connections, and the cross-process notification."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from admission.models import ProfileChangeRecord
from admission.runtime import registry as runtime
from admission.services import profiles as services

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _run_concurrently(*calls: Any) -> list[tuple[str, Any]]:
    """Start every call at once, each on its own thread and so its own database connection."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[tuple[str, Any]] = []

    def run(call: Any) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes.append(("ok", call()))
        except services.ProfileServiceError as error:
            outcomes.append(("refused", error))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


@pytest.fixture
def slow_registration(monkeypatch):
    """Hold the workspace lock a little longer, so the other operator surely waits on it."""
    register = runtime.register_activation

    def slow(version: Any) -> Any:
        time.sleep(0.3)
        return register(version)

    monkeypatch.setattr(runtime, "register_activation", slow)


def test_CNC_ADMIT_AUDIT_two_operators_activate_the_same_version_one_wins(
    workspace, proposer, approver, approved, slow_registration
):
    v1 = approved("v1")

    outcomes = _run_concurrently(
        lambda: services.profile_version_activate(version=v1, actor=approver),
        lambda: services.profile_version_activate(version=v1, actor=proposer),
    )

    assert sorted(kind for kind, _ in outcomes) == ["ok", "refused"]
    refused = next(value for kind, value in outcomes if kind == "refused")
    assert isinstance(refused, services.ProfileActivationConflict)
    assert "already the current version" in str(refused)
    assert ProfileChangeRecord.objects.count() == 1
    assert [r.kind for r in runtime.get_registry().profile_history("acme")] == ["initial"]


def test_CNC_ADMIT_AUDIT_concurrent_activations_of_two_versions_chain_in_lock_order(
    workspace, approver, proposer, approved, slow_registration
):
    v1, v2, v3 = approved("v1"), approved("v2", concurrency=2), approved("v3", concurrency=3)
    services.profile_version_activate(version=v1, actor=approver)

    outcomes = _run_concurrently(
        lambda: services.profile_version_activate(version=v2, actor=approver),
        lambda: services.profile_version_activate(version=v3, actor=proposer),
    )

    assert [kind for kind, _ in outcomes] == ["ok", "ok"]
    ledger = list(ProfileChangeRecord.objects.filter(workspace=workspace).order_by("id"))
    labels = [record.profile_version for record in ledger]
    assert labels[0] == "v1" and sorted(labels[1:]) == ["v2", "v3"]
    # Whoever went second saw the first as its predecessor: no lost update.
    assert ledger[2].previous_profile_version == ledger[1].profile_version
    core = runtime.get_registry().profile_history("acme")
    assert [r.to_dict() for r in core] == [r.to_dict() for r in ledger]


def test_activation_notifies_other_processes_at_commit(workspace, approver, approved):
    settings = connection.settings_dict
    listener = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        autocommit=True,
    )
    try:
        listener.execute(f"LISTEN {services.NOTIFY_CHANNEL}")
        services.profile_version_activate(version=approved("v1"), actor=approver)
        received = list(listener.notifies(timeout=5, stop_after=1))
    finally:
        listener.close()
    assert [(n.channel, n.payload) for n in received] == [(services.NOTIFY_CHANNEL, "acme")]
