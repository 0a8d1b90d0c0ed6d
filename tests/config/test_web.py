"""The production web command: gunicorn serves the admin and WhiteNoise the static files with
DEBUG off; access and application logs can be JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.config.web_process import ROOT, WebServer, manage, sluice_env


def test_web_command_serves_admin_and_static_files_with_debug_off(tmp_path):
    env = sluice_env(tmp_path / "var", DJANGO_DEBUG="false", SLUICE_LOG_FORMAT="json")
    manage(env, "migrate", "--noinput", "-v", "0")
    web = WebServer(env, tmp_path / "web.log")
    try:
        login = web.get("/admin/login/")
        assert login.status_code == 200
        assert 'name="username"' in login.text and "csrfmiddlewaretoken" in login.text

        css = web.get("/static/admin/css/base.css", headers={"Accept-Encoding": "gzip"})
        assert css.status_code == 200
        assert css.headers["content-type"].startswith("text/css")
        assert css.headers["content-encoding"] == "gzip"
        assert "max-age" in css.headers["cache-control"]
        assert "body" in css.text

        # DEBUG is off: a missing page is the plain 404, not Django's technical page.
        missing = web.get("/no-such-page/")
        assert missing.status_code == 404
        assert "URLconf" not in missing.text and "DEBUG = True" not in missing.text
        assert web.get("/static/admin/css/no-such.css").status_code == 404

        health = web.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        assert web.stop() == 0, web.log()

    lines = [json.loads(line) for line in web.log().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "gunicorn.access"]
    assert any("GET /admin/login/ HTTP/1.1" in line["message"] for line in access), lines
    assert any(line["logger"] == "gunicorn.error" for line in lines)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)


def test_web_command_stops_on_unusable_settings_with_a_typed_error(tmp_path):
    env = sluice_env(tmp_path / "var", SLUICE_WEB_WORKERS="many")
    done = subprocess.run(
        [sys.executable, "-m", "config.cli", "web", "--bind", "127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Settings are read when `config` is imported, before the command runs: the process stops
    # on the typed error that names the variable and the value.
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == "config.env.SettingsError: SLUICE_WEB_WORKERS must be an integer, got 'many'"


def test_application_logs_are_json_lines_when_asked(tmp_path):
    env = sluice_env(tmp_path / "var", SLUICE_LOG_FORMAT="json")
    code = (
        "import logging\n"
        "logging.getLogger('sluice.check').warning('run %s slow', 'r-1', extra={'run': 'r-1'})\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n"
        "    logging.getLogger('sluice.check').exception('failed')\n"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    warning, error = (json.loads(line) for line in done.stderr.strip().splitlines())
    assert warning["level"] == "WARNING" and warning["logger"] == "sluice.check"
    assert warning["message"] == "run r-1 slow" and warning["run"] == "r-1"
    assert warning["time"].endswith("+00:00")
    assert error["level"] == "ERROR" and "ZeroDivisionError" in error["exception"]

    text = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=sluice_env(tmp_path / "var"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "WARNING sluice.check run r-1 slow" in text.stderr
    assert not text.stderr.lstrip().startswith("{")
