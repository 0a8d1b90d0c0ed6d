"""Finding 8: Django's deployment checks pass, at warning level, under the production
environment docs/security.md documents; and they do notice when it is not followed."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _deploy_check(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    # Exactly the documented variables, nothing inherited from the test session.
    environment = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SLUICE_VAR_DIR": str(tmp_path),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
        "DJANGO_ALLOWED_HOSTS": "sluice.example.com",
        "DATABASE_URL": "postgres://sluice:password@db.example.com:5432/sluice",
        "CELERY_BROKER_URL": "redis://redis.example.com:6379/0",
        "SLUICE_BEHIND_TLS_PROXY": "1",
        **overrides,
    }
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={key: value for key, value in environment.items() if value},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_passes_under_the_documented_production_environment(tmp_path):
    result = _deploy_check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_when_the_deployment_weakens_a_default(tmp_path):
    plain_http = _deploy_check(tmp_path, DJANGO_HTTPS="0")
    assert plain_http.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in plain_http.stderr
    debug = _deploy_check(tmp_path, DJANGO_DEBUG="1")
    assert debug.returncode != 0 and "security.W018" in debug.stderr
    weak_key = _deploy_check(tmp_path, DJANGO_SECRET_KEY="short")
    assert weak_key.returncode != 0 and "security.W009" in weak_key.stderr
