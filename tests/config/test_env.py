"""Settings from the environment: database URLs and booleans, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.env import SettingsError, database_from_url, env_bool


def test_postgres_url_becomes_a_database_entry():
    entry = database_from_url(
        "postgres://user:p%40ss@db.local:5433/sluice?sslmode=disable", Path("/p")
    )
    assert entry["ENGINE"] == "django.db.backends.postgresql"
    assert (entry["NAME"], entry["USER"], entry["PASSWORD"]) == ("sluice", "user", "p@ss")
    assert (entry["HOST"], entry["PORT"]) == ("db.local", "5433")
    assert entry["OPTIONS"] == {"sslmode": "disable"}


def test_sqlite_urls_relative_and_absolute():
    assert database_from_url("sqlite:///var/x.db", Path("/proj"))["NAME"] == "/proj/var/x.db"
    assert database_from_url("sqlite:////tmp/x.db", Path("/proj"))["NAME"] == "/tmp/x.db"


@pytest.mark.parametrize("url", ["mysql://x/y", "postgres://host/", "sqlite:///"])
def test_unusable_database_urls_are_refused(url):
    with pytest.raises(SettingsError):
        database_from_url(url, Path("/proj"))


def test_booleans(monkeypatch):
    monkeypatch.setenv("FLAG", "off")
    assert env_bool("FLAG", True) is False
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(SettingsError, match="FLAG"):
        env_bool("FLAG", True)
    monkeypatch.delenv("FLAG")
    assert env_bool("FLAG", True) is True
