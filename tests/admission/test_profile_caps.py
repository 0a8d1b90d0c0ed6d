"""Bounded documents: a profile's size and principals, and the versions a workspace keeps pending,
are capped with typed errors through every interface; the profile list's pages stay small."""

from __future__ import annotations

import io
import json
import os
from typing import Any
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from admission.core import InvalidProfileError
from admission.models import ProfileVersion, Workspace
from admission.services import profiles as services
from tests.admission.conftest import ALL_CONFIRMED

pytestmark = pytest.mark.django_db


def _with_principals(document: dict[str, Any], count: int) -> dict[str, Any]:
    document["principals"] = {f"caller-{index:05d}": {"concurrency": 1} for index in range(count)}
    return document


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_profile_over_the_principal_cap_is_refused_naming_principals(
    workspace, proposer, make_document, settings
):
    settings.SLUICE_MAX_PROFILE_PRINCIPALS = 30
    fits = _with_principals(make_document("v-fits"), 30)
    services.profile_version_propose(workspace=workspace, document=fits, proposed_by=proposer)
    with pytest.raises(InvalidProfileError) as refused:
        services.profile_version_propose(
            workspace=workspace,
            document=_with_principals(make_document("v-over"), 31),
            proposed_by=proposer,
        )
    assert refused.value.field == "principals"
    assert "names 31 principals" in str(refused.value)
    assert "at most 30 per profile (SLUICE_MAX_PROFILE_PRINCIPALS)" in str(refused.value)

    response = _api(proposer).post(
        "/api/workspaces/acme/profiles/",
        {"document": _with_principals(make_document("v-over"), 31)},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "SLUICE_MAX_PROFILE_PRINCIPALS" in response.json()["error"]["fields"]["document"][0]
    assert list(ProfileVersion.objects.values_list("profile_version", flat=True)) == ["v-fits"]


def test_a_profile_over_the_byte_cap_is_refused_before_it_is_parsed(
    workspace, proposer, make_document, settings, tmp_path
):
    settings.SLUICE_MAX_PROFILE_BYTES = 4096
    document = make_document("v-big")
    document["notes"] = "n" * 5000  # not even a known key: the size is checked first
    with pytest.raises(InvalidProfileError) as refused:
        services.profile_version_propose(
            workspace=workspace, document=document, proposed_by=proposer
        )
    assert refused.value.field == "profile"
    assert "this deployment keeps profiles of at most 4096 bytes" in str(refused.value)

    path = tmp_path / "big-profile.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with (
        mock.patch.dict(os.environ, {"SLUICE_PROFILES_PASSWORD": "pat-password"}),
        pytest.raises(CommandError, match="SLUICE_MAX_PROFILE_BYTES"),
    ):
        call_command(
            "profiles",
            "propose",
            "--workspace",
            "acme",
            "--user",
            "pat",
            "--file",
            str(path),
            stdout=io.StringIO(),
        )
    assert not ProfileVersion.objects.exists()


def test_pending_versions_per_workspace_are_capped_until_one_is_decided(
    workspace, proposer, approver, make_document, settings
):
    settings.SLUICE_MAX_PENDING_VERSIONS = 3
    versions = [
        services.profile_version_propose(
            workspace=workspace, document=make_document(f"v{n}"), proposed_by=proposer
        )
        for n in range(3)
    ]
    with pytest.raises(services.ProfilePendingLimit) as refused:
        services.profile_version_propose(
            workspace=workspace, document=make_document("v3"), proposed_by=proposer
        )
    assert refused.value.code == "conflict" and refused.value.field == "document"
    assert "already has 3 versions awaiting approval" in str(refused.value)

    response = _api(proposer).post(
        "/api/workspaces/acme/profiles/", {"document": make_document("v3")}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "SLUICE_MAX_PENDING_VERSIONS" in response.json()["error"]["fields"]["document"][0]

    admin = Client()
    admin.force_login(proposer)
    page = admin.post(
        "/admin/admission/profileversion/add/",
        {"workspace": workspace.pk, "document": json.dumps(make_document("v3"))},
    )
    assert page.status_code == 200
    assert "SLUICE_MAX_PENDING_VERSIONS" in page.content.decode()

    services.profile_version_approve(
        version=versions[0], approver=approver, checklist=ALL_CONFIRMED
    )
    services.profile_version_propose(
        workspace=workspace, document=make_document("v3"), proposed_by=proposer
    )
    assert ProfileVersion.objects.count() == 4


def test_the_profile_list_pages_stay_small_whatever_page_size_asks(
    workspace, proposer, approver, make_document, settings
):
    for n in range(25):
        version = services.profile_version_propose(
            workspace=workspace, document=make_document(f"v{n:02d}"), proposed_by=proposer
        )
        services.profile_version_reject(version=version, approver=approver, comment="no")
    response = _api(proposer).get("/api/workspaces/acme/profiles/", {"page_size": 500})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 20 and response.json()["next"]


def test_big_documents_are_summarised_with_their_limits_and_json_on_demand(
    workspace, proposer, approver, make_document, make_user
):
    principals = {
        f"caller-{n:05d}": {"concurrency": 1, "requestsPerMinute": 600, "maxQueueLength": 32}
        for n in range(900)
    }
    base = services.profile_version_propose(
        workspace=workspace,
        document={**make_document("v-base"), "principals": principals},
        proposed_by=proposer,
    )
    services.profile_version_approve(version=base, approver=approver, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=base, actor=approver)
    changed = {**principals, "caller-00421": {**principals["caller-00421"], "concurrency": 2}}
    document = {**make_document("v-big"), "principals": changed}
    version = services.profile_version_propose(
        workspace=workspace, document=document, proposed_by=proposer
    )
    admin = Client()
    admin.force_login(approver)
    page = admin.get(f"/admin/admission/profileversion/{version.pk}/change/").content.decode()
    assert "900 principals" in page and '"caller-00899"' not in page
    assert "too long for a line diff" in page and "principals.caller-00421" in page

    limits = f"/admin/admission/profileversion/{version.pk}/limits/"
    found = admin.get(limits, {"q": "caller-0042"}).content.decode()
    assert "1 row for “caller-0042”" in found
    # Every limit of caller-00420 … caller-00429, a hundred rows a page.
    every = admin.get(limits, {"q": "caller-0042", "all": "1", "page": 2}).content.decode()
    assert "page 2 of 2" in every and "principals.caller-00429" in every
    whole = admin.get(f"/admin/admission/profileversion/{version.pk}/document.json")
    assert whole.json() == document

    # Another workspace's operator sees neither.
    stranger = make_user("sam")
    other = Workspace.objects.create(key="other", name="Other")
    other.members.add(stranger, through_defaults={"role": "operator"})
    outsider = Client()
    outsider.force_login(stranger)
    assert outsider.get(limits).status_code == 404
    json_url = f"/admin/admission/profileversion/{version.pk}/document.json"
    assert outsider.get(json_url).status_code == 404


def test_a_decision_page_reviews_at_most_ten_versions_at_once(
    workspace, proposer, approver, make_document
):
    versions = [
        services.profile_version_propose(
            workspace=workspace, document=make_document(f"v{n}"), proposed_by=proposer
        )
        for n in range(11)
    ]
    admin = Client()
    admin.force_login(approver)
    refused = admin.post(
        "/admin/admission/profileversion/",
        {"action": "approve_selected", "_selected_action": [v.pk for v in versions]},
        follow=True,
    )
    assert "Select at most 10 versions to approve at a time (11 were selected)." in (
        refused.content.decode()
    )
    shown = admin.post(
        "/admin/admission/profileversion/",
        {"action": "approve_selected", "_selected_action": [v.pk for v in versions[:10]]},
    )
    assert shown.content.decode().count('class="module review"') == 10
