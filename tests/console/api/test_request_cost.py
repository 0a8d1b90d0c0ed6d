"""What one API request may cost: the JSON depth check is linear in the body's size, bodies are
capped per endpoint, and the worst body at the cap is refused quickly by the production web
server while another workspace's request is answered within a second."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from admission.services import profiles as admission_services
from console.api.untrusted_json import UntrustedJSONError, load_untrusted_json, nesting_depth
from console.forms.runs import example_request
from evaluator.models import EvaluationRun
from tests.config.web_process import WebServer
from tests.service.conftest import Deployment

EVALUATION_CAP = 1_048_576

# Texts that made the former check quadratic, and shapes that stress any bracket scanner.
ATTACK_SHAPES = {
    "unclosed string of escaped quotes": ('{"input": "', '\\"'),
    "unclosed string ending in a backslash": ('{"input": "', '\\"\\'),
    "bare escaped quotes": ("", '\\"'),
    "quote runs": ("", '"'),
    "opening brackets": ("", "["),
    "empty arrays": ("", "[]"),
    "small strings": ("[", '"a",'),
    "objects with escapes": ("[", '{"a":[1,{"b":"x\\\\"}]},'),
}


def _at_size(prefix: str, fragment: str, size: int) -> str:
    count = max(1, (size - len(prefix)) // len(fragment))
    return prefix + fragment * count


def _cpu_seconds(text: str, repeats: int = 3) -> float:
    # Process CPU time, the best of a few: other processes on a loaded machine do not count.
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        nesting_depth(text)
        best = min(best, time.process_time() - started)
    return best


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    fragment=st.text(alphabet='[]{}"\\,:a 1', min_size=1, max_size=12),
    prefix=st.sampled_from(["", "[", '{"input": "', '{"a": [']),
)
def test_the_depth_check_grows_linearly_with_the_size_of_any_text(fragment, prefix):
    small = _at_size(prefix, fragment, 32_768)
    large = _at_size(prefix, fragment, 8 * 32_768)
    ratio = len(large) / len(small)
    # Linear: eight times the text costs about eight times the time. A quadratic check costs
    # sixty-four times; the slack (3x plus a millisecond) absorbs timer noise only.
    assert _cpu_seconds(large) <= 3 * ratio * _cpu_seconds(small) + 0.001


@pytest.mark.parametrize("shape", sorted(ATTACK_SHAPES))
def test_every_attack_shape_at_the_body_cap_is_checked_in_bounded_time(shape):
    prefix, fragment = ATTACK_SHAPES[shape]
    text = _at_size(prefix, fragment, EVALUATION_CAP)
    assert _cpu_seconds(text, repeats=1) < 0.5
    started = time.process_time()
    with contextlib.suppress(UntrustedJSONError):
        load_untrusted_json(text, max_depth=64)
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("", 0),
        ("1", 0),
        ('"[[[["', 0),
        ('["\\"[", {"a": [[]]}]', 4),
        ('{"a": "\\\\", "b": [[1]]}', 3),
        ('[[["\\\\\\"]]"]]]', 3),
        ("[" * 65 + "]" * 65, 65),
        ('["unclosed [[[', 1),
    ],
)
def test_the_depth_is_exact_for_strings_holding_brackets_and_escapes(text, depth):
    assert nesting_depth(text) == depth


@pytest.mark.django_db
def test_each_endpoint_has_its_own_body_cap(proposer, workspace):
    client = APIClient()
    client.force_authenticate(proposer)
    with override_settings(SLUICE_MAX_ACTION_REQUEST_BYTES=2048):
        body = json.dumps({"comment": "x" * 3000})
        approve = client.post(
            "/api/workspaces/acme/profiles/v1/approve/", body, content_type="application/json"
        )
        assert approve.status_code == 413, approve.content
        assert approve.json()["error"] == {
            "type": "request_too_large",
            "detail": "The request body is larger than 2048 bytes.",
        }
        # The profile proposal's own, larger cap lets the same body through to validation.
        propose = client.post(
            "/api/workspaces/acme/profiles/", body, content_type="application/json"
        )
        assert propose.status_code == 400 and "document" in propose.json()["error"]["fields"]


@pytest.mark.django_db
def test_a_signed_in_staff_user_without_membership_pays_the_linear_check_only(django_user_model):
    # The session CSRF check reads the body before permissions: the check must be cheap anyway.
    staff = django_user_model.objects.create_user("staff", is_staff=True)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff)
    body = _at_size('{"input": "', '\\"', 65_536)
    started = time.process_time()
    response = client.post("/api/workspaces/", body, content_type="application/json")
    assert time.process_time() - started < 1.0
    assert response.status_code in (400, 403, 405), response.content
    assert response.status_code != 500


@pytest.mark.django_db
def test_a_submission_over_the_prompt_cap_is_a_400_naming_the_prompt(
    proposer, approver, workspace, approved, settings
):
    admission_services.profile_version_activate(version=approved("v1"), actor=approver)
    settings.SLUICE_MAX_PROMPT_CHARS = 10_000
    client = APIClient()
    client.force_authenticate(proposer)
    document = example_request()
    document["ruleset"]["decisions"].append(
        {**document["ruleset"]["decisions"][0], "id": "expands", "prompt": "${big}" * 3}
    )
    document["input"]["big"] = "y" * 4_000
    response = client.post(
        "/api/workspaces/acme/evaluations/", json.dumps(document), content_type="application/json"
    )
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    field = f"ruleset.decisions[{len(document['ruleset']['decisions']) - 1}].prompt"
    assert list(fields) == [field]
    assert "renders to 12000 characters" in fields[field][0]
    assert "SLUICE_MAX_PROMPT_CHARS" in fields[field][0]
    assert not EvaluationRun.objects.exists()

    document["input"]["big"] = "y" * 3_000
    accepted = client.post(
        "/api/workspaces/acme/evaluations/", json.dumps(document), content_type="application/json"
    )
    assert accepted.status_code == 201, accepted.content


# --------------------------------------------------------------------------- a real web server

_SECOND_WORKSPACE = """
from django.contrib.auth import get_user_model
from knox.models import AuthToken
from admission.models import Workspace, WorkspaceMembership
user = get_user_model().objects.create_user("other-member", password="a long password 1")
workspace = Workspace.objects.create(key="other", name="Other")
WorkspaceMembership.objects.create(
    workspace=workspace, user=user, role=WorkspaceMembership.Role.MEMBER
)
print(AuthToken.objects.create(user=user)[1])
"""


def test_the_production_server_refuses_attack_bodies_quickly_and_serves_others(tmp_path: Path):
    deployment = Deployment(tmp_path, "embedded").setup()
    try:
        other_token = deployment.django(_SECOND_WORKSPACE).strip().splitlines()[-1]
        attacker = {"Authorization": f"Token {deployment.token()}"}
        other = {"Authorization": f"Token {other_token}"}
        web = WebServer(deployment.env, tmp_path / "web.log", "--workers", "2")
        try:
            _attack_while_another_workspace_reads(web.url, attacker, other)
        finally:
            web.stop()
    finally:
        deployment.stop()


def _attack_while_another_workspace_reads(
    url: str, attacker: dict[str, str], other: dict[str, str]
) -> None:
    evaluations = f"{url}/api/workspaces/demo/evaluations/"
    bodies = {
        "unclosed": _at_size('{"input": "', '\\"', EVALUATION_CAP),
        "deep": "[" * EVALUATION_CAP,
        "over the cap": _at_size('{"input": "', '\\"', EVALUATION_CAP + 2),
    }
    answers: dict[str, Any] = {}

    def attack(name: str) -> None:
        started = time.monotonic()
        response = httpx.post(
            evaluations,
            content=bodies[name].encode(),
            headers={**attacker, "Content-Type": "application/json"},
            timeout=60,
        )
        answers[name] = (response, time.monotonic() - started)

    # Each web worker loads the URLs, views and serializers on its first request: warm both
    # with requests at once, as a deployment that has served anything is.
    def warm(_: int) -> int:
        return httpx.get(f"{url}/api/workspaces/", headers=other, timeout=30).status_code

    with ThreadPoolExecutor(6) as pool:
        for _ in range(2):
            assert set(pool.map(warm, range(6))) == {200}
    with httpx.Client(base_url=url, headers=other, timeout=30) as client:
        assert client.get("/api/workspaces/").status_code == 200
        threads = [threading.Thread(target=attack, args=(name,)) for name in bodies]
        for thread in threads:
            thread.start()
        # Another workspace's reads while both web workers take the attack bodies.
        waits = []
        while any(thread.is_alive() for thread in threads):
            started = time.monotonic()
            response = client.get("/api/workspaces/")
            waits.append(time.monotonic() - started)
            assert response.status_code == 200, response.text
            assert [w["key"] for w in response.json()] == ["other"]
        for thread in threads:
            thread.join()
    assert max(waits) < 1.0, waits

    for name in ("unclosed", "deep"):
        response, took = answers[name]
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"]["type"] == "parse_error"
        assert took < 5.0, (name, took)
    assert "nested deeper than 64 levels" in answers["deep"][0].json()["error"]["detail"]
    response, took = answers["over the cap"]
    assert response.status_code == 413, response.text
    assert response.json()["error"] == {
        "type": "request_too_large",
        "detail": f"The request body is larger than {EVALUATION_CAP} bytes.",
    }
    assert took < 5.0
