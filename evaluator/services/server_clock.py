"""The one clock that liveness is judged by: the database server's.

Workers write their runs' heartbeats and claim times, and sweepers judge them stale, on the
database server's clock (`clock_timestamp()` on PostgreSQL), so a worker whose own clock is off
by seconds or minutes is judged alive or dead correctly, and the times a run shows its users come
from one clock. With SQLite (the embedded mode) the database is a library inside the process:
there is no server clock apart from the process's, and `now()` is the process's own clock. That
mode runs exactly one worker process, which both writes and judges the heartbeats, so its
judgement is consistent; a clock stepped while it runs moves both sides at once.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone

__all__ = ["now"]


def now() -> datetime:
    """The database server's current time (aware, UTC)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # clock_timestamp(), not now(): the time of this statement, not of the transaction.
            cursor.execute("SELECT clock_timestamp()")
            row = cursor.fetchone()
        value: datetime = row[0]
        return value.astimezone(UTC)
    return timezone.now()
