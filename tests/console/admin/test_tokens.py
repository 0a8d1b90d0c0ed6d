"""No global tokens: the admin never issues an API token (not even a superuser's own), only a
superuser sees and revokes tokens there, and the API issues a token to its owner alone."""

from __future__ import annotations

import base64

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.test import Client
from knox.models import AuthToken
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", password="root-password")


def _admin(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_has_no_way_to_issue_a_token_for_anyone(root, member):
    admin = _admin(root)
    assert admin.get("/admin/knox/authtoken/add/").status_code == 403
    forged = admin.post(
        "/admin/knox/authtoken/add/", {"user": member.pk, "expiry": "2099-01-01 00:00:00"}
    )
    assert forged.status_code == 403
    assert not AuthToken.objects.exists()
    listing = admin.get("/admin/knox/authtoken/").content.decode()
    assert "/admin/knox/authtoken/add/" not in listing


def test_a_superuser_sees_and_revokes_tokens_with_a_record(root, member):
    token_row, token = AuthToken.objects.create(user=member)
    admin = _admin(root)
    listing = admin.get("/admin/knox/authtoken/").content.decode()
    assert "mia" in listing and token[:8] in listing
    assert token[:9] not in listing  # a prefix to tell tokens apart, never more
    page = admin.get(f"/admin/knox/authtoken/{token_row.pk}/change/").content.decode()
    assert 'name="user"' not in page  # read-only: nothing to change
    revoked = admin.post(f"/admin/knox/authtoken/{token_row.pk}/delete/", {"post": "yes"})
    assert revoked.status_code == 302
    assert not AuthToken.objects.exists()
    assert LogEntry.objects.filter(user=root, action_flag=DELETION).exists()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/workspaces/").status_code == 401


def test_staff_without_superuser_status_do_not_see_tokens(proposer, member):
    AuthToken.objects.create(user=member)
    admin = _admin(proposer)
    assert admin.get("/admin/knox/authtoken/").status_code == 403
    assert "knox" not in admin.get("/admin/").content.decode()


def test_the_api_issues_a_token_to_its_owner_with_the_configured_expiry(member, settings):
    basic = base64.b64encode(b"mia:mia-password").decode()
    answer = APIClient().post("/api/auth/token/", HTTP_AUTHORIZATION=f"Basic {basic}")
    assert answer.status_code == 200, answer.content
    issued = AuthToken.objects.get()
    assert issued.user == member
    lifetime = issued.expiry - issued.created
    assert abs(lifetime - settings.REST_KNOX["TOKEN_TTL"]).total_seconds() < 5
