"""Take the quick tour's screenshots from the real admin: `python docs/screenshots.py`.

Sets up a throwaway embedded deployment (SQLite and the filesystem broker in a temporary
directory), starts its web server and worker, and drives the admin with a headless Chromium
(`SLUICE_CHROMIUM`, default /usr/bin/chromium): propose, approve, activate, roll back, run an
evaluation and a load run. PNGs go to docs/img/.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

# Run as a script from anywhere: the project root is where config/ and manage.py live.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 860}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def deployment() -> Iterator[tuple[str, dict[str, str]]]:
    """A demo deployment of its own; yields the base URL and the demo passwords."""
    with tempfile.TemporaryDirectory(prefix="sluice-tour-") as tmp:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "CELERY_BROKER_URL")
        }
        env.update(
            SLUICE_VAR_DIR=str(Path(tmp) / "var"),
            SLUICE_CELERY_QUEUE="sluice-tour",
            DJANGO_SETTINGS_MODULE="config.settings",
            # Plain HTTP on loopback, as `make run` allows itself.
            DJANGO_HTTPS="0",
        )
        python = sys.executable
        setup = subprocess.run(
            [python, "-m", "config.cli", "demo-setup", "--json"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        demo = json.loads(setup.stdout.splitlines()[-1])
        port = _free_port()
        log = (Path(tmp) / "processes.log").open("wb")
        children = [
            subprocess.Popen(
                [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--insecure"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [python, "-m", "celery", "-A", "config", "worker", "-c", "1", "-l", "WARNING"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
        ]
        try:
            time.sleep(4)
            yield f"http://127.0.0.1:{port}", {u["username"]: u["password"] for u in demo["users"]}
        finally:
            for child in children:
                child.send_signal(signal.SIGTERM)
            for child in children:
                child.wait(timeout=30)
            log.close()


class Tour:
    def __init__(self, page: Page, base: str, passwords: dict[str, str]) -> None:
        self.page = page
        self.base = base
        self.passwords = passwords

    def shot(self, name: str, *, full_page: bool = False) -> None:
        IMG.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(IMG / f"{name}.png"), full_page=full_page)
        print(f"docs/img/{name}.png")

    def go(self, path: str) -> None:
        self.page.goto(self.base + path)

    def login(self, username: str, *, shot: str | None = None) -> None:
        self.page.context.clear_cookies()
        self.go("/admin/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", self.passwords[username])
        if shot:
            self.shot(shot)
        self.page.click("input[type=submit]")
        self.page.wait_for_url(self.base + "/admin/")

    def action(self, changelist: str, label: str, action: str) -> None:
        """Tick the row whose link says `label` on a changelist and run `action` on it."""
        self.go(changelist)
        row = self.page.locator("#result_list tbody tr", has_text=label).first
        row.locator("input.action-select").check()
        self.page.select_option("select[name=action]", action)
        self.page.click("button[name=index]")

    def decide(self, shot: str, comment: str) -> None:
        for box in self.page.locator("form input[type=checkbox]").all():
            box.check()
        self.page.fill("textarea[name=comment]", comment)
        self.shot(shot, full_page=True)
        self.page.click("#decision-submit")


def demo_profile(label: str, **workspace_limits: object) -> dict[str, object]:
    from config.demo import demo_profile as make

    return make(label, **workspace_limits)


def tour(page: Page, base: str, passwords: dict[str, str]) -> None:
    t = Tour(page, base, passwords)
    versions = "/admin/admission/profileversion/"

    t.login("demo-proposer", shot="01-login")
    t.shot("02-admin-index")

    t.go(versions + "add/")
    page.select_option("#id_workspace", label="demo")
    page.fill("#id_document", json.dumps(demo_profile("demo-v2", concurrency=3), indent=2))
    page.click("input[name=_preview]")
    t.shot("03-propose-preview", full_page=True)
    page.click("input[name=_propose]")
    t.shot("04-proposed")

    t.login("demo-approver")
    t.action(versions, "demo-v2", "approve_selected")
    t.decide("05-approve-checklist", "Tightens workspace concurrency to 3; diff reviewed.")
    t.shot("06-approved")
    t.action(versions, "demo-v2", "activate_selected")
    t.shot("07-activated")

    t.action(versions, "demo-v1", "request_rollback")
    t.shot("08-rollback-requested")
    t.login("demo-proposer")
    t.action("/admin/admission/rollbackrequest/", "demo", "approve_rollbacks")
    t.decide("09-rollback-approve", "Back to demo-v1 while the canary is reviewed.")
    t.shot("10-rolled-back")
    t.go("/admin/admission/profilechangerecord/")
    t.shot("11-change-history")

    t.go("/admin/evaluator/evaluationrun/add/")
    page.select_option("#id_workspace", label="demo")
    t.shot("12-submit-evaluation", full_page=True)
    page.click("input[name=_start]")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page.reload()
        status = page.locator(".field-status .readonly").inner_text().strip().lower()
        if status not in ("queued", "running"):
            break
        time.sleep(0.5)
    t.shot("13-evaluation-result", full_page=True)
    t.go("/admin/evaluator/evaluationrun/")
    t.shot("14-evaluation-runs")

    t.go("/admin/evaluator/loadrun/add/")
    page.select_option("#id_workspace", label="demo")
    t.shot("15-start-load-run")
    page.click("input[name=_start]")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        page.reload()
        status = page.locator(".field-status .readonly").inner_text().strip().lower()
        if status not in ("queued", "running"):
            break
        time.sleep(2)
    t.shot("16-load-run-record", full_page=True)


def main() -> int:
    import django

    django.setup()
    with deployment() as (base, passwords), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        try:
            tour(page, base, passwords)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
