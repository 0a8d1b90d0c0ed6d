"""A schemathesis run against the generated OpenAPI schema, as a workspace member with the
operator role (so every write reaches its parser): whatever the input, no server error.

Bounded to a few hundred examples in all (`EXAMPLES` per operation), so it runs in CI.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from knox.models import AuthToken
from schemathesis.checks import not_a_server_error

from admission.models import Workspace
from admission.services import profiles as services
from config.demo import demo_profile
from config.wsgi import application
from tests.admission.conftest import ALL_CONFIRMED

EXAMPLES = 25

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture
def member_token(django_user_model: Any, settings_fixture: Any) -> str:
    """acme, with an active profile, and a token of one of its members."""
    django_user_model.objects.create_user(username="demo-approver", password="x" * 20)
    workspace = Workspace.objects.create(key="acme", name="Acme")
    proposer = django_user_model.objects.create_user(username="demo-proposer")
    approver = django_user_model.objects.get(username="demo-approver")
    workspace.members.add(proposer, approver, through_defaults={"role": "operator"})
    version = services.profile_version_propose(
        workspace=workspace, document=demo_profile("v1"), proposed_by=proposer
    )
    services.profile_version_approve(version=version, approver=approver, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=version, actor=approver)
    _, token = AuthToken.objects.create(user=proposer)
    return str(token)


@pytest.fixture
def connection_kept() -> Iterator[None]:
    # Called straight through WSGI, Django would close the test's connection after each
    # request, as it does in production; Django's test client holds these off the same way.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def settings_fixture(settings: Any, connection_kept: None) -> Any:
    # Room for every example: throttling is tested on its own.
    settings.SLUICE_THROTTLE_RATES = {"anon": None, "user": None, "workspace": None, "submit": None}
    return settings


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_input_makes_the_api_fail(case: Any, member_token: str) -> None:
    if "workspace_key" in (case.path_parameters or {}):
        # Random keys only ever find no workspace; the real one exercises the views.
        case.path_parameters["workspace_key"] = "acme"
    r = case.call_and_validate(
        headers={"Authorization": f"Token {member_token}"}, checks=[not_a_server_error]
    )
    print("STATUS", case.method, case.path, r.status_code)
