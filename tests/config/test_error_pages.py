"""Finding 1 (DEBUG on by default, settings and environment on error pages) and the typed API
errors outside DRF's views: 404 for unrouted /api/ URLs, 405, 413, 500."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


def _settings_in_a_fresh_process(**environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SLUICE_"))}
    env.update(environment)
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        "print(json.dumps({'debug': settings.DEBUG, 'https': settings.SECURE_SSL_REDIRECT}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_debug_is_off_and_https_on_unless_asked_for(tmp_path):
    result = _settings_in_a_fresh_process(DJANGO_SECRET_KEY="k" * 60, SLUICE_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"debug": False, "https": True}


def test_no_secret_key_with_debug_off_fails_at_start_with_a_clear_message(tmp_path):
    result = _settings_in_a_fresh_process(SLUICE_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is not set and DEBUG is off" in result.stderr
    assert not (tmp_path / "secret-key").exists()


def test_a_key_the_demo_generated_under_the_var_dir_is_used(tmp_path):
    from config.env import secret_key_file_create

    key_file = tmp_path / "secret-key"
    secret_key_file_create(key_file)
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    first = key_file.read_text()
    secret_key_file_create(key_file)
    assert key_file.read_text() == first
    result = _settings_in_a_fresh_process(SLUICE_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr


@pytest.mark.urls("tests.config.error_urls")
def test_a_debug_error_page_shows_no_setting_environment_or_variable(settings, member):
    settings.DEBUG = True
    settings.DATABASES["default"]["PASSWORD"] = "db-password-canary"
    client = Client(raise_request_exception=False)
    client.force_login(member)
    response = client.get(
        "/boom/",
        HTTP_AUTHORIZATION="Token token-canary",
        DATABASE_URL="postgres://u:url-canary@db/x",
        PLAIN_VARIABLE="env-canary",
    )
    assert response.status_code == 500
    page = response.content.decode()
    assert "failing on purpose" in page  # it is the debug page, with its traceback
    for canary in (
        "db-password-canary",
        "url-canary",
        "env-canary",
        "token-canary",
        settings.SECRET_KEY,
        settings.DATABASES["default"]["NAME"],
    ):
        assert canary not in page


@pytest.mark.urls("tests.config.error_urls")
def test_api_server_errors_are_the_typed_json_body(member):
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(member)
    response = client.get("/api/boom/")
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "type": "server_error",
            "detail": "The server failed to answer; it has been logged.",
        }
    }
    html = Client(raise_request_exception=False).get("/boom/")
    assert html.status_code == 500 and "failing on purpose" not in html.content.decode()


def test_unrouted_api_urls_are_a_typed_404_and_other_urls_list_no_routes(member):
    client = APIClient()
    client.force_authenticate(member)
    for url in ("/api/nothing-here/", "/api/workspaces/acme/profiles/v1/extra/bits/"):
        response = client.get(url)
        assert response.status_code == 404
        assert response.json() == {"error": {"type": "not_found", "detail": "Not found."}}
    page = Client().get("/no-such-page/")
    assert page.status_code == 404
    assert b"api/workspaces" not in page.content and b"URLconf" not in page.content


def test_wrong_methods_are_a_typed_405(member, workspace):
    client = APIClient()
    client.force_authenticate(member)
    response = client.delete("/api/workspaces/acme/profiles/")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "method_not_allowed"


def test_bodies_over_the_cap_are_a_typed_413(proposer, workspace, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    client = APIClient()
    client.force_authenticate(proposer)
    body = json.dumps({"document": {"profileVersion": "x" * 5000}})
    for url in (
        "/api/workspaces/acme/profiles/",
        "/api/workspaces/acme/evaluations/",
        "/api/workspaces/acme/load-runs/",
    ):
        response = client.post(url, body, content_type="application/json")
        assert response.status_code == 413, response.content
        assert response.json()["error"]["type"] == "request_too_large"
        assert "4096 bytes" in response.json()["error"]["detail"]
