"""Finding 9 (tokens) and finding 6 (admin sign-in): API tokens are stored as digests and expire,
missing or bad credentials are a 401 with a challenge, and repeated wrong passwords lock the
sign-in out (django-axes), in the admin and on the token endpoint alike."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

TOKEN_URL = "/api/auth/token/"


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def test_a_token_is_issued_once_and_stored_only_as_a_digest(member, workspace, settings):
    response = APIClient().post(TOKEN_URL, HTTP_AUTHORIZATION=_basic("mia", "mia-password"))
    assert response.status_code == 200, response.content
    token = response.json()["token"]
    expiry = dt.datetime.fromisoformat(response.json()["expiry"].replace("Z", "+00:00"))
    ttl = settings.REST_KNOX["TOKEN_TTL"]
    assert abs((expiry - timezone.now()) - ttl) < dt.timedelta(minutes=1)
    row = AuthToken.objects.get(user=member)
    assert token not in (row.digest, row.token_key) and len(row.digest) == 128
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        assert not any(token in str(value) for value in cursor.fetchone())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/workspaces/acme/profiles/").status_code == 200


def test_an_expired_token_is_refused(member, workspace):
    _, token = AuthToken.objects.create(user=member, expiry=dt.timedelta(seconds=-1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    response = client.get("/api/workspaces/acme/profiles/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


@pytest.mark.parametrize(
    "header",
    [None, "Token", "Token a b", "Token " + "0" * 64, "Bearer x", "Token \xff\xfe"],
)
def test_missing_or_bad_credentials_are_401_with_a_challenge(member, workspace, header):
    client = APIClient(raise_request_exception=False)
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/workspaces/acme/evaluations/")
    assert response.status_code == 401, response.content
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["error"]["type"] in ("not_authenticated", "authentication_failed")


def test_the_token_endpoint_needs_a_password(member):
    anonymous = APIClient().post(TOKEN_URL)
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Basic")
    wrong = APIClient().post(TOKEN_URL, HTTP_AUTHORIZATION=_basic("mia", "nope"))
    assert wrong.status_code == 401
    assert not AuthToken.objects.exists()


def _admin_login(client: Client, password: str) -> Any:
    return client.post("/admin/login/?next=/admin/", {"username": "pat", "password": password})


def test_repeated_wrong_admin_passwords_lock_the_sign_in_out(proposer, workspace, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _admin_login(client, "wrong-password").status_code == 200  # the form again
    locked = _admin_login(client, "wrong-password")
    assert locked.status_code == 429
    for _ in range(15):
        assert _admin_login(client, "wrong-password").status_code == 429
    # Even the right password is refused until the cool-off ends.
    assert _admin_login(client, "pat-password").status_code == 429
    assert "_auth_user_id" not in client.session


def test_a_successful_sign_in_resets_the_count(proposer, workspace, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _admin_login(client, "wrong-password")
    assert _admin_login(client, "pat-password").status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _admin_login(client, "wrong-password").status_code == 200


def test_wrong_passwords_on_the_token_endpoint_count_toward_the_lockout(
    proposer, workspace, settings
):
    api = APIClient()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        api.post(TOKEN_URL, HTTP_AUTHORIZATION=_basic("pat", "wrong-password"))
    refused = api.post(TOKEN_URL, HTTP_AUTHORIZATION=_basic("pat", "pat-password"))
    # Locked out, the right password is refused like a wrong one: no token, nothing learnt.
    assert refused.status_code == 401, refused.content
    assert refused.json()["error"]["type"] == "authentication_failed"
    assert not AuthToken.objects.exists()
    assert _admin_login(Client(), "pat-password").status_code == 429
