"""What the benchmarks that run Django share: its set-up for a throwaway deployment on loopback
(a key of its own, plain HTTP), a test database dropped afterwards, and for the benchmarks that
start a whole service: a deployment talking to a loopback provider, the script that activates a
profile in it, and the API's timestamps as seconds.

Import it first and call `configure()` before importing anything that needs the settings.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

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


# Proposes, approves and activates (as the demo's proposer and approver) the demo profile under
# another label with other limits; run through `Deployment.django`.
_ACTIVATE_PROFILE = """
from config.demo import demo_profile, demo_version_activate
document = demo_profile({label!r})
parts = [document["workspace"], *document["providers"].values(),
         *document["principals"].values()]
for part in parts:
    part.update({limits!r})
{then}
demo_version_activate(document, comment="benchmark")
"""


def activate_profile_script(label: str, limits: Mapping[str, Any], then: str = "") -> str:
    """A script for `Deployment.django` that activates the demo profile as `label`, with
    `limits` set on the workspace, every provider and every principal; `then` (Python at the
    script's top level) changes `document` or `parts` further before it is proposed."""
    return _ACTIVATE_PROFILE.format(label=label, limits=dict(limits), then=then)


def epoch_seconds(value: str) -> float:
    """An API timestamp (ISO 8601, `Z` for UTC) as seconds since the epoch."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def service_deployment(tmp: str, mode: str, provider: Any, *, name: str = "") -> Any:
    """A deployment (`tests.service.conftest.Deployment`) in `tmp` whose `fake` adapter is
    `provider`, a loopback OpenAI-compatible server; None, with the reason printed under `name`
    (default: the mode), when the mode cannot run on this machine."""
    import _pytest.outcomes

    from tests.service.conftest import Deployment

    try:
        deployment = Deployment(Path(tmp), mode)
    except _pytest.outcomes.Skipped as skipped:
        print(f"{name or mode}: skipped ({skipped.msg})")
        return None
    deployment.env["SLUICE_ADAPTERS"] = json.dumps(
        {"fake": {"kind": "openai-chat", "baseUrl": provider.base_url}}
    )
    return deployment
