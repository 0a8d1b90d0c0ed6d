"""Shadow comparisons are read incrementally: settled observations are folded once into a kept
checkpoint, each later read fetches only the newer rows, and the answer equals a full read."""

from __future__ import annotations

import datetime as dt

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from freezegun import freeze_time

from admission.services import profiles as services
from admission.services import rollout

pytestmark = pytest.mark.django_db


def _observe(session, n: int) -> None:
    rollout.shadow_observation_record(
        session_id=session.pk,
        run_id=f"run-{n}",
        active={"requests": n, "admitted": n},
        shadow={"requests": n, "admitted": 1, "rejected": {"queue-full": n - 1}},
    )


def test_settled_observations_are_folded_once_and_new_ones_read_on_top(
    workspace, proposer, approver, approved
):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    session = rollout.shadow_start(version=approved("v2", concurrency=2), actor=proposer)
    long_ago = timezone.now() - dt.timedelta(minutes=10)
    with freeze_time(long_ago):
        for n in range(2, 42):
            _observe(session, n)

    first = rollout.shadow_comparison(session=session)
    assert first.observations == 40
    key = f"comparison:shadow:{session.pk}:{session.at.timestamp()}"
    kept = cache.get(key)
    assert kept["count"] == 40

    for n in (50, 60):
        _observe(session, n)
    with CaptureQueriesContext(connection) as queries:
        second = rollout.shadow_comparison(session=session)
    # Every read starts at the checkpoint: nothing folded before is fetched again.
    table = '"admission_shadowobservation"'
    reads = [q["sql"] for q in queries.captured_queries if table in q["sql"]]
    assert reads and all(f'{table}."at" >=' in sql for sql in reads)
    assert second.observations == 42
    assert cache.get(key)["count"] == 40  # the fresh rows are not settled yet

    cache.delete(key)
    full = rollout.shadow_comparison(session=session)
    assert second.to_dict() == full.to_dict()
    assert second.series == full.series
    seen = [*range(2, 42), 50, 60]
    assert second.series[-1] == (sum(seen), 0, sum(n - 1 for n in seen))


def test_the_plotted_series_stays_bounded(workspace, proposer, approver, approved):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    session = rollout.shadow_start(version=approved("v2", concurrency=2), actor=proposer)
    with freeze_time(timezone.now() - dt.timedelta(minutes=10)):
        for n in range(2, 2 + 2 * rollout.SERIES_POINTS + 50):
            _observe(session, n)
    comparison = rollout.shadow_comparison(session=session)
    assert comparison.observations == 2 * rollout.SERIES_POINTS + 50
    assert len(comparison.series) <= 2 * rollout.SERIES_POINTS
    # The last point is exact: every request and rejection counted.
    requests = sum(range(2, 2 + 2 * rollout.SERIES_POINTS + 50))
    assert comparison.series[-1][0] == requests
