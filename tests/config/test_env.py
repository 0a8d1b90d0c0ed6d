"""Settings from the environment: database URLs and booleans, with clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config.env import SettingsError, database_from_url, env_bool, env_float, env_str

ROOT = Path(__file__).resolve().parents[2]


def test_postgres_url_becomes_a_database_entry():
    entry = database_from_url(
        "postgres://user:p%40ss@db.local:5433/sluice?sslmode=disable", Path("/p")
    )
    assert entry["ENGINE"] == "django.db.backends.postgresql"
    assert (entry["NAME"], entry["USER"], entry["PASSWORD"]) == ("sluice", "user", "p@ss")
    assert (entry["HOST"], entry["PORT"]) == ("db.local", "5433")
    # A connection to a server that answers nothing gives up after 5 s unless the URL says.
    assert entry["OPTIONS"] == {"sslmode": "disable", "connect_timeout": "5"}
    kept = database_from_url("postgres://u@h/s?connect_timeout=2", Path("/p"))
    assert kept["OPTIONS"] == {"connect_timeout": "2"}


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


def test_strings_and_numbers(monkeypatch):
    monkeypatch.delenv("TEXT", raising=False)
    assert env_str("TEXT", "fallback") == "fallback"
    monkeypatch.setenv("TEXT", "  value ")
    assert env_str("TEXT", "fallback") == "value"
    monkeypatch.setenv("TEXT", "")
    assert env_str("TEXT", "fallback") == ""  # set to empty on purpose: kept
    monkeypatch.setenv("RATE", "0.25")
    assert env_float("RATE", 1.0, exclusive=True) == 0.25
    for bad in ("fast", "nan", "inf", "-1", "0"):
        monkeypatch.setenv("RATE", bad)
        with pytest.raises(SettingsError, match="RATE"):
            env_float("RATE", 1.0, exclusive=True)
    monkeypatch.setenv("RATE", "")
    assert env_float("RATE", None) is None


def _settings_probe(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: settings are read once, at import.
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); " + code],
        cwd=ROOT,
        # A deployment's settings need a key; the probe's signs nothing.
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "DJANGO_SECRET_KEY": "settings-probe",
            **env,
        },
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_celery_app_takes_queue_and_broker_options_from_the_settings(tmp_path):
    probe = _settings_probe(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SLUICE_VAR_DIR": str(tmp_path),
            "CELERY_BROKER_URL": "redis://127.0.0.1:6399/9",
            "SLUICE_CELERY_QUEUE": "q-probe",
            "SLUICE_BROKER_VISIBILITY_TIMEOUT": "40",
            "SLUICE_PROFILE_LISTEN": "no",
            "SLUICE_PROFILE_POLL_SECONDS": "0.5",
        },
        "from config.celery import app; from django.conf import settings; "
        "o = app.conf.broker_transport_options; "
        "print(app.conf.task_default_queue, o['visibility_timeout'], "
        "o['unacked_restore_interval'], settings.SLUICE_PROFILE_LISTEN, "
        "settings.SLUICE_PROFILE_POLL_SECONDS)",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["q-probe", "40", "8", "False", "0.5"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLUICE_PROFILE_POLL_SECONDS", "soon"),
        ("SLUICE_BROKER_VISIBILITY_TIMEOUT", "0"),
        ("SLUICE_BROKER_POLL_SECONDS", "-1"),
        ("SLUICE_PROFILE_LISTEN", "maybe"),
    ],
)
def test_an_unusable_value_stops_the_process_naming_the_variable(tmp_path, name, value):
    broker = "redis://127.0.0.1:6399/9" if "VISIBILITY" in name else "filesystem://"
    probe = _settings_probe(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SLUICE_VAR_DIR": str(tmp_path),
            "CELERY_BROKER_URL": broker,
            name: value,
        },
        "pass",
    )
    assert probe.returncode != 0
    assert f"SettingsError: {name}" in probe.stderr
