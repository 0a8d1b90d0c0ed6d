"""What the benchmarks that run Django share: its set-up for a throwaway deployment on loopback
(a key of its own, plain HTTP) and a test database dropped afterwards.

Import it first and call `configure()` before importing anything that needs the settings.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def configure(**environment: str) -> None:
    """Set Django up in this process; `environment` holds defaults read by the settings."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", "benchmark-" + secrets.token_urlsafe(48))
    os.environ.setdefault("DJANGO_HTTPS", "0")
    for name, value in environment.items():
        os.environ.setdefault(name, value)

    import django

    django.setup()


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A test database next to the configured one (SQLite when DATABASE_URL is unset), dropped
    when the block ends; yields its name."""
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield name
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)
        teardown_test_environment()
