"""Suite-wide hooks."""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from django.core.cache import caches
from django.core.cache.backends.locmem import LocMemCache

# Hypothesis's per-example deadline (200 ms) and its "too slow" health check time the machine,
# not the code: on a loaded two-core CI runner an example touching Redis, PostgreSQL or a
# subprocess, or one that meets a garbage collection, outlasts them and fails a test whose
# property holds. The suite asserts behaviour only, so neither applies anywhere (a test may
# still ask for a deadline of its own). Examples are still saved in .hypothesis/ (ignored by
# git) and replayed locally; a fresh clone, as CI runs, replays none.
hypothesis.settings.register_profile(
    "sluice", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("sluice")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    # CI runs with every service, Chromium and PostgreSQL present: there a skip would hide a
    # test that silently stopped running, so SLUICE_STRICT_SKIPS turns it into a failure.
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SLUICE_STRICT_SKIPS") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped in a strict run (SLUICE_STRICT_SKIPS): {report.longrepr}"


@pytest.fixture(autouse=True)
def _in_process_admission(settings: Any) -> None:
    # Admission is coordinated in Redis only where a test asks for it (tests/admission/
    # coordination and the service tests, which run real deployments): a test's workspaces
    # must not meet another test's in a shared Redis.
    settings.SLUICE_ADMISSION_REDIS_URL = ""


@pytest.fixture
def chromium_path() -> str:
    """The Chromium that browser tests drive (SLUICE_CHROMIUM); skips when there is none."""
    # An empty value (`$(command -v chromium)` where there is none) is no path: Playwright
    # would look for a browser of its own download instead.
    path = os.environ.get("SLUICE_CHROMIUM") or "/usr/bin/chromium"
    if not (Path(path).exists() or shutil.which(path)):
        pytest.skip(f"no Chromium at {path}")
    return path


@pytest.fixture(autouse=True)
def _fresh_throttle_counters() -> None:
    # API throttles count in the cache; every test starts with a full budget. Only a
    # process-local cache is cleared: clearing a Redis cache would flush a shared database.
    if isinstance(caches["default"], LocMemCache):
        caches["default"].clear()


@pytest.fixture
def demo(settings: Any) -> Generator[Any, None, None]:
    """The demo workspace (config/demo.py: its users and active profile) on a fresh admission
    registry, with fast password hashing and no API throttles."""
    from admission.models import Workspace
    from admission.runtime import registry as runtime
    from config.demo import demo_setup

    # The registry must not carry revisions of rows another test's rollback erased.
    runtime.reset_registry()
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.SLUICE_THROTTLE_RATES = {"anon": None, "user": None, "workspace": None, "submit": None}
    demo_setup()
    yield Workspace.objects.get(key="demo")
    runtime.reset_registry()
