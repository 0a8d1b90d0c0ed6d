"""The banner `make run` prints: credentials only on the default address or when asked for, and
a curl line that works from any directory."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from config import cli
from config.demo import Demo, DemoUser

DEMO = Demo(
    workspace="demo",
    profile_version="demo-v1",
    proposer=DemoUser("demo-proposer", "proposer-secret", "tok-proposer-123"),
    approver=DemoUser("demo-approver", "approver-secret", "tok-approver-456"),
)
SECRETS = ("proposer-secret", "approver-secret", "tok-proposer-123", "tok-approver-456")


def _banner(capsys: pytest.CaptureFixture[str], addr: str, *, show: bool) -> str:
    cli._banner(DEMO, addr, "filesystem", "sqlite3 var/sluice.sqlite3", show_credentials=show)
    return capsys.readouterr().out


def test_another_address_never_prints_credentials(capsys):
    out = _banner(capsys, "0.0.0.0:8000", show=False)
    assert not any(secret in out for secret in SECRETS)
    assert "SLUICE_SHOW_CREDENTIALS=1" in out
    assert "-m config.cli demo-setup" in out
    assert 'Authorization: Token $TOKEN"' in out


def test_credentials_are_printed_when_shown(capsys):
    out = _banner(capsys, cli.DEFAULT_ADDR, show=True)
    assert all(secret in out for secret in SECRETS)
    assert "Authorization: Token tok-proposer-123" in out


def test_the_curl_line_names_the_example_by_an_absolute_path(capsys):
    out = _banner(capsys, cli.DEFAULT_ADDR, show=True)
    match = re.search(r"-d (\S+) http://127\.0\.0\.1:8000/api/workspaces/demo/evaluations/", out)
    assert match, out
    (argument,) = shlex.split(match.group(1))
    path = Path(argument.removeprefix("@"))
    assert path.is_absolute() and path.is_file()
    assert "-sS " in out


@pytest.mark.parametrize(
    ("argv", "environment", "shown"),
    [
        (["run"], {}, False),
        (["run", "--show-credentials"], {}, True),
        (["run"], {"SLUICE_SHOW_CREDENTIALS": "1"}, True),
        (["run"], {"SLUICE_SHOW_CREDENTIALS": "0"}, False),
    ],
)
def test_the_flag_and_its_environment_variable(monkeypatch, argv, environment, shown):
    seen = {}
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(cli, "run_command", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(argv) == 0
    assert seen["show_credentials"] is shown


def test_the_banner_names_the_credentials_file_and_whose_token_the_curl_line_uses(capsys, tmp_path):
    kept = tmp_path / "demo-credentials.txt"
    cli._banner(
        DEMO, "0.0.0.0:8000", "filesystem", "sqlite3", show_credentials=False, credentials=kept
    )
    out = capsys.readouterr().out
    assert not any(secret in out for secret in SECRETS)
    assert f"The demo passwords are in {kept} (readable by you only)." in out
    assert "Run an evaluation as demo-proposer (TOKEN is demo-proposer's API token" in out
    assert "  TOKEN=$(cd " in out and "demo-setup --token demo-proposer)\n" in out

    cli._banner(
        DEMO, cli.DEFAULT_ADDR, "filesystem", "sqlite3", show_credentials=True, credentials=kept
    )
    out = capsys.readouterr().out
    assert "Run an evaluation as demo-proposer (with demo-proposer's API token" in out
    assert f"The passwords are kept in {kept}" in out
    assert "TOKEN=" not in out


def test_demo_setup_token_prints_one_fresh_token_or_names_the_users(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_prepare", lambda verbosity: (DEMO, None))
    assert cli.main(["demo-setup", "--token", "demo-approver"]) == 0
    assert capsys.readouterr().out == "tok-approver-456\n"
    assert cli.main(["demo-setup", "--token", "root"]) == 2
    err = capsys.readouterr().err
    assert "--token takes a demo user, demo-proposer or demo-approver; got 'root'" in err
