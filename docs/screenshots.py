"""Take the quick tour's screenshots from the real admin: `python docs/screenshots.py`.

Sets up a throwaway embedded deployment (SQLite and the filesystem broker in a temporary
directory), starts its web server and worker, and drives the admin with a headless Chromium
(`SLUICE_CHROMIUM`, default /usr/bin/chromium) at 1280 x 860: propose, run a what-if, approve,
activate, roll back, run an evaluation and a load run, then shadow a stricter version, turn
the kill switch, start a canary and watch admission live. PNGs go to docs/img/; `--only 19,23`
writes only those shots (the tour still runs every step, since later steps need earlier ones).
`--admission-redis redis://HOST:PORT/N` coordinates admission in that Redis (under a key
prefix of the tour's own, removed afterwards), so the live admission dashboard has
deployment-wide figures to show; without it the dashboard says it has none.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect, sync_playwright

# Run as a script from anywhere: the project root is where config/ and manage.py live.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# The tour's deployment is thrown away with its temporary directory: a key of its own signs it.
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 860}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer 200 within {timeout} s")


@contextmanager
def deployment(admission_redis: str = "") -> Iterator[tuple[str, dict[str, str]]]:
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
            SLUICE_ADMISSION_REDIS_URL=admission_redis,
            SLUICE_ADMISSION_KEY_PREFIX=f"sluice-tour-{os.getpid()}",
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
        # Workspaces and memberships are a superuser's pages: the tour has one of its own.
        admin_password = secrets.token_urlsafe(16)
        subprocess.run(
            [
                python,
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--username",
                "tour-admin",
                "--email",
                "tour-admin@example.invalid",
            ],
            cwd=ROOT,
            env={**env, "DJANGO_SUPERUSER_PASSWORD": admin_password},
            check=True,
            capture_output=True,
        )
        demo["users"].append({"username": "tour-admin", "password": admin_password})
        port = _free_port()
        log = (Path(tmp) / "processes.log").open("wb")
        children = [
            subprocess.Popen(
                [python, "-m", "config.cli", "web", "--bind", f"127.0.0.1:{port}"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "config.cli",
                    "worker",
                    "--concurrency",
                    "1",
                    "--loglevel",
                    "WARNING",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
        ]
        try:
            _wait_ready(f"http://127.0.0.1:{port}/readyz")
            yield f"http://127.0.0.1:{port}", {u["username"]: u["password"] for u in demo["users"]}
        finally:
            for child in children:
                child.send_signal(signal.SIGTERM)
            for child in children:
                child.wait(timeout=30)
            log.close()
            if admission_redis:
                _forget_admission_state(admission_redis, env["SLUICE_ADMISSION_KEY_PREFIX"])


def _forget_admission_state(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


class Tour:
    def __init__(
        self, page: Page, base: str, passwords: dict[str, str], only: set[str] | None = None
    ) -> None:
        self.page = page
        self.base = base
        self.passwords = passwords
        self.only = only

    def shot(self, name: str, *, full_page: bool = False, selector: str | None = None) -> None:
        if self.only is not None and name.split("-", 1)[0] not in self.only:
            return
        IMG.mkdir(parents=True, exist_ok=True)
        path = str(IMG / f"{name}.png")
        if selector is not None:
            self.page.locator(selector).screenshot(path=path)
        else:
            self.page.screenshot(path=path, full_page=full_page)
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


def tightened(label: str, **principal_limits: object) -> dict[str, Any]:
    """The demo profile with the manifest's queue bounds: at most 64 waiting, 2 s each."""
    from config.demo import demo_profile as make

    document = make(label, maxQueueLength=64, maxQueueWaitMs=2000)
    document["providers"]["fake"].update(maxQueueLength=64, maxQueueWaitMs=2000)
    for limits in document["principals"].values():
        limits.update(maxQueueWaitMs=2000, **principal_limits)
    return document


def strict(label: str) -> dict[str, Any]:
    """The demo profile with the fake provider at two requests a minute and no queue."""
    from config.demo import demo_profile as make

    document = make(label)
    document["providers"]["fake"].update(requestsPerMinute=2, maxQueueLength=0)
    return document


def wait_for_status(page: Page, seconds: float) -> None:
    """A run's page reloads itself while the run is queued or running; wait for the last one."""
    page.wait_for_url("**/change/")
    expect(page.locator("#run-refresh")).to_have_count(0, timeout=seconds * 1000)
    page.wait_for_load_state()


def tour(page: Page, base: str, passwords: dict[str, str], only: set[str] | None = None) -> None:
    t = Tour(page, base, passwords, only)
    versions = "/admin/admission/profileversion/"

    t.login("demo-proposer", shot="01-login")
    t.shot("02-admin-index")

    # Propose: the form starts from the active version under the next label.
    t.go(versions + "add/")
    t.shot("03-propose-start", full_page=True)
    page.fill("#id_document", json.dumps(tightened("demo-v2", requestsPerMinute=0), indent=2))
    page.click("input[name=_preview]")
    page.locator(".limits-diff").first.scroll_into_view_if_needed()
    t.shot("04-propose-zero-limit")
    page.fill("#id_document", json.dumps(tightened("demo-v2"), indent=2))
    page.click("input[name=_preview]")
    t.shot("05-propose-preview", full_page=True)
    page.click("input[name=_propose]")
    t.shot("06-proposed")

    # What-if: the manifest against demo-v2's limits, on the worker.
    t.action(versions, "demo-v2", "run_what_if")
    t.shot("07-what-if-form")
    page.click("#action-submit")
    page.click("#result_list a:text-is('demo-v2')")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and page.locator(".what-if-run table").count() == 0:
        time.sleep(2)
        page.reload()
    page.locator(".field-what_if_records").scroll_into_view_if_needed()
    t.shot("08-what-if-record")

    t.login("demo-approver")
    t.action(versions, "demo-v2", "approve_selected")
    t.decide("09-approve-checklist", "Queue bounds now match the manifest; what-if passes.")
    t.shot("10-approved")
    t.action(versions, "demo-v2", "activate_selected")
    t.shot("11-activated")

    t.action(versions, "demo-v1", "request_rollback")
    page.fill("#id_reason", "Clients time out at 2 s waits; back to demo-v1 while we measure.")
    t.shot("12-rollback-reason")
    page.click("#action-submit")
    t.shot("13-rollback-requested")
    t.login("demo-proposer")
    t.action("/admin/admission/rollbackrequest/", "demo", "approve_rollbacks")
    t.decide("14-rollback-approve", "Agreed; demo-v1 until the client timeouts are raised.")
    t.shot("15-rolled-back")
    t.go("/admin/admission/profilechangerecord/")
    t.shot("16-change-history")
    t.login("tour-admin")
    t.go("/admin/admission/workspace/")
    page.click("#result_list a:text-is('demo')")
    t.shot("17-workspace", full_page=True)
    t.login("demo-proposer")

    t.go("/admin/evaluator/evaluationrun/add/")
    page.select_option("#id_workspace", label="demo")
    t.shot("18-submit-evaluation", full_page=True)
    page.click("input[name=_start]")
    wait_for_status(page, 30)
    t.shot("19-evaluation-result", full_page=True)
    t.go("/admin/evaluator/evaluationrun/")
    t.shot("20-evaluation-runs")

    t.go("/admin/evaluator/loadrun/add/")
    page.select_option("#id_workspace", label="demo")
    t.shot("21-start-load-run")
    page.click("input[name=_start]")
    wait_for_status(page, 180)
    t.shot("22-load-run-record", full_page=True)
    t.shot("23-load-run-charts", selector="#run-glance")

    # Rollout: a stricter demo-v3 as the shadow, then the kill switch and a canary.
    t.go(versions + "add/")
    page.fill("#id_document", json.dumps(strict("demo-v3"), indent=2))
    page.click("input[name=_propose]")
    t.login("demo-approver")
    t.action(versions, "demo-v3", "approve_selected")
    t.decide("24-approve-demo-v3", "A stricter request rate; shadow it before anything else.")
    rollout = "/admin/admission/rolloutevent/controls/"
    t.go(rollout)
    t.shot("25-rollout-index")
    page.click("#rollout-workspaces a:text-is('demo')")
    page.select_option("#id_shadow-version", label="demo-v3")
    page.fill("#id_shadow-reason", "What would demo-v3's request rate do to today's runs?")
    page.click("#submit-shadow_start")
    t.go("/admin/evaluator/evaluationrun/add/")
    page.select_option("#id_workspace", label="demo")
    page.click("input[name=_start]")
    wait_for_status(page, 30)
    t.go(rollout + "demo/")
    t.shot("26-shadow-running", full_page=True)
    page.click("#shadow a:text-is('Comparison with plots')")
    t.shot("27-shadow-comparison", full_page=True)
    t.go(rollout + "demo/")
    page.fill(
        "#form-switch textarea",
        "The provider's latency doubled at 14:05; serial until it recovers.",
    )
    page.click("#submit-switch")
    t.shot("28-kill-switch-off")
    page.fill("#id_shadow_stop-reason", "Seen enough: demo-v3 refuses most requests.")
    page.click("#submit-shadow_stop")
    page.select_option("#id_canary-version", label="demo-v3")
    page.fill("#id_canary-principals", "demo-proposer")
    page.fill("#id_canary-fraction", "0.1")
    page.click("#submit-canary_start")
    t.shot("29-canary-running", full_page=True)
    t.go("/admin/admission/rolloutevent/")
    t.shot("30-rollout-events")

    # Live admission: a few more evaluations first, so the hour has something to show.
    for _ in range(3):
        t.go("/admin/evaluator/evaluationrun/add/")
        page.select_option("#id_workspace", label="demo")
        page.click("input[name=_start]")
        wait_for_status(page, 60)
    t.go("/admin/")
    t.shot("31-admin-index-live-link")
    page.click("#live-admission-link a:text-is('Live admission')")
    page.wait_for_url("**/admin/admission/live/")
    t.shot("32-live-admission", full_page=True)


def main() -> int:
    import argparse

    import django

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated shot numbers to write, e.g. 19,22,23")
    parser.add_argument(
        "--admission-redis", default="", help="coordinate admission in this Redis (redis://...)"
    )
    args = parser.parse_args()
    only = {part.strip() for part in args.only.split(",")} if args.only else None
    django.setup()
    with deployment(args.admission_redis) as (base, passwords), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport=VIEWPORT)
        try:
            tour(page, base, passwords, only)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
