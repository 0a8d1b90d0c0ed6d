"""Every admin table and page prints numbers rounded for reading: with data full of long floats
(durations, costs, delays, ratios, limits) the walk over the admin's pages finds no number with
more digits than a reader needs. JSON blocks (`<pre>`), form fields and scripts keep every
digit and are not read here."""

from __future__ import annotations

import datetime as dt
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from admission.models import AdmissionSnapshot, ProfileVersion, RolloutEvent
from admission.services import profiles as profile_services
from admission.services import rollout
from console.forms.runs import example_attempt, example_request
from console.templatetags.readable import readable_number, usd
from evaluator.harness.manifests import load_manifest
from evaluator.harness.service import run_manifest
from evaluator.models import EvaluationRun, LoadRun, Receipt
from evaluator.services import runs as run_services

pytestmark = pytest.mark.django_db

MANIFEST = Path(__file__).resolve().parents[3] / "manifests" / "load-manifest.v2.json"
LONG = 72.21712345678901
TINY = 0.0001234567890123

# A number with a fraction, not part of a dotted word (addresses, versions, dates).
NUMBER = re.compile(r"(?<![\w.:])-?\d[\d,]*\.\d+(?![\w.]*\d)")
SKIPPED = {"script", "style", "pre", "textarea", "code", "title"}


class _Text(HTMLParser):
    """The page's visible text, outside JSON blocks, scripts and form fields."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED:
            self.skipping += 1

    def handle_endtag(self, tag):
        if tag in SKIPPED and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def too_precise(number: str) -> bool:
    """More digits than a reader needs: three significant digits below 100 (or a tenth
    from 10), cents for money, none past the point from 100 up."""
    if "." not in number:
        return False
    whole, fraction = number.lstrip("-").replace(",", "").split(".")
    if int(whole) >= 100:
        return len(fraction) > 2
    if int(whole) >= 1:
        return len(whole) + len(fraction) > 3 and len(fraction) > 2
    return len(fraction.lstrip("0")) > 3


def test_the_rule_tells_raw_floats_from_readable_ones():
    for raw in ("72.217", "1.0475550912799085", "0.00012345", "1234.567", "12.345"):
        assert too_precise(raw), raw
    for fine in ("72.2", "1.05", "0.000123", "1,234.57", "12.3", "1.5", "0.5"):
        assert not too_precise(fine), fine
    for value in (LONG, TINY, 1.0475550912799085, 12345.6789, -3.14159):
        assert not too_precise(readable_number(value).replace("$", "")), value
        assert not too_precise(usd(value).replace("$", "")), value


def raw_numbers(html: str) -> list[str]:
    """The too precise numbers of a page, each with the text around it."""
    parser = _Text()
    parser.feed(html)
    text = " ".join(" ".join(parser.parts).split())
    return [
        text[max(0, m.start() - 50) : m.end() + 10]
        for m in NUMBER.finditer(text)
        if too_precise(m.group())
    ]


@pytest.fixture
def superuser(django_user_model, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return django_user_model.objects.create_superuser("root", password="root-password")


@pytest.fixture
def pages(workspace, proposer, approver, approved, make_document, superuser, client):
    """A workspace with an active version, a shadow and a canary with observations, runs,
    a load run, usage, a receipt and published live figures, all full of long floats."""
    workspace.members.add(superuser, through_defaults={"role": "operator"})
    first = approved("acme-v1")
    profile_services.profile_version_activate(version=first, actor=approver)
    shadowed = approved("acme-v2", concurrency=3)
    session = rollout.shadow_start(version=shadowed, actor=approver, reason="try it")
    tally = {
        "requests": 7,
        "retries": 1,
        "admitted": 6,
        "deferred": 3,
        "rejected": {"queue-full": 1},
        "retryableRejected": 1,
        "wouldRetry": 0,
        "queueDelayMs": {"total": 1234.5678901234, "max": LONG},
        "maxQueued": 2,
        "maxRetryPressure": 1,
        "breakerTransitions": {},
    }
    rollout.shadow_observation_record(
        session_id=session.pk, run_id="r1", active=tally, shadow=dict(tally, admitted=5)
    )
    rollout.shadow_stop(workspace=workspace, actor=approver)
    canary = approved("acme-v3", concurrency=2)
    rollout.canary_start(version=canary, actor=approver, fraction=0.3333333333333333)
    # A proposal with limits of many digits: its page and its limits table against the current.
    document = make_document("acme-v4")
    document["workspace"]["maxPrincipalShare"] = 0.3333333333333333
    document["workspace"]["maxCostUsd"] = 1.0475550912799085
    document["providers"]["jev"]["tokensPerSecond"] = 12345.678901
    profile_services.profile_version_propose(
        workspace=workspace, document=document, proposed_by=proposer
    )

    started = timezone.now() - dt.timedelta(seconds=3.14159265)
    attempt = {
        "decisionId": "check-1",
        **example_attempt(
            started_ms=12.345678901,
            ended_ms=1034.56789012,
            tokens=37,
            cost_usd=TINY,
            deferred_by=("concurrency",),
            retry_after_ms=1500.123456789,
            permit_held={"reason": "cancelled", "untilMs": 2345.678901234},
            infrastructure_refusals={"coordination-unavailable": 3},
            infrastructure_wait_ms=4200.56789012,
            evidence={
                "decision": "admit",
                "reason": "admitted",
                "queueDelayMs": LONG,
                "active": 1,
                "queued": 0,
                "estimatedTokens": 40,
                "estimatedCostUsd": 0.000123456789,
                "retryPressure": 0,
                "breakerState": "closed",
            },
        ),
    }
    for index, profile_version in enumerate(("acme-v1", "acme-v3")):
        run = EvaluationRun.objects.create(
            workspace=workspace,
            submitted_by=proposer,
            principal_id="pat",
            invocation_id=f"inv-{index}",
            document=example_request(1),
            ruleset_id="demo-screening",
            ruleset_digest="sha256:" + "0" * 64,
            decision_count=1,
            profile_version=profile_version,
            status=EvaluationRun.Status.RUNNING,
            started_at=started,
        )
        run_services.run_finish(
            run,
            status="completed",
            attempts=[attempt],
            result={
                "status": "completed",
                "decisions": [{"decisionId": "check-1", "status": "succeeded", "output": "yes"}],
            },
        )

    record = run_manifest(load_manifest(MANIFEST), "evaluator")
    LoadRun.objects.create(
        what_if_version=shadowed,
        workspace=workspace,
        submitted_by=proposer,
        manifest_name=MANIFEST.name,
        target="evaluator",
        status=LoadRun.Status.COMPLETED,
        passed=record["passed"],
        manifest_digest=record["manifest"]["digest"],
        record=record,
        started_at=started,
        finished_at=timezone.now(),
    )
    Receipt.objects.create(
        workspace_id=workspace.key,
        principal_id="pat",
        invocation_id="inv-0",
        revision=3,
        document={"schema": "decision-evaluation-receipt/v3", "state": "completed"},
    )
    now_ms = timezone.now().timestamp() * 1000.0
    minute = str(int(now_ms // 60_000) * 60_000)
    AdmissionSnapshot.objects.create(
        process_id="worker-1",
        written_at=timezone.now(),
        state={
            workspace.key: {
                "rev": "acme-v1",
                "now": now_ms,
                "principals": 1,
                "leases": 1,
                "waiters": 0,
                "workspace": {"a": 1, "q": 0},
                "providers": {
                    "fake": {
                        "a": 1,
                        "q": 0,
                        "breaker": "half-open",
                        "failures": 2,
                        "pause": 1234.5678901,
                        "reopen": 987.654321,
                    }
                },
                "totals": {"fake|admit|admitted": 3, "fake|delay|sum": 216},
                "counts": {minute: {"fake|admit|admitted": 3, "fake|defer|concurrency": 1}},
                "transitions": [
                    {
                        "providerId": "fake",
                        "from": "closed",
                        "to": "open",
                        "atEpochMs": now_ms - 1234.5678,
                        "failures": 5,
                    }
                ],
            }
        },
    )
    client.force_login(superuser)
    return workspace


def admin_urls(workspace) -> list[str]:
    urls = [
        reverse("admin:index"),
        reverse("admission-dashboard"),
        reverse("usage") + "?range=24h",
        reverse("usage") + "?range=7d",
        reverse("usage") + "?range=30d&provider=fake",
        reverse("usage") + "?start=2026-01-01&end=2026-01-03",
        reverse("admin:admission_rolloutevent_controls_index"),
        reverse("admin:admission_rolloutevent_controls", args=[workspace.key]),
    ]
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
        for pk in model.objects.values_list("pk", flat=True)[:6]:
            urls.append(reverse("admin:{}_{}_change".format(*info), args=[pk]))
    for event in RolloutEvent.objects.filter(
        kind__in=[RolloutEvent.Kind.SHADOW_START, RolloutEvent.Kind.CANARY_START]
    ):
        urls.append(reverse("admin:admission_rolloutevent_comparison", args=[event.pk]))
    for version in ProfileVersion.objects.all():
        urls.append(reverse("admin:admission_profileversion_limits", args=[version.pk]))
    return urls


def test_no_admin_page_prints_a_raw_float(pages, client):
    found: dict[str, list[str]] = {}
    walked = 0
    for url in admin_urls(pages):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        walked += 1
        html = response.content.decode()
        raw = raw_numbers(html)
        if raw:
            found[url] = raw
    assert walked > 30
    # The long floats were there to be shown, and were shown rounded.
    run = EvaluationRun.objects.order_by("created_at").first()
    page = client.get(reverse("admin:evaluator_evaluationrun_change", args=[run.pk]))
    assert "72.2" in page.content.decode()
    event = RolloutEvent.objects.get(kind=RolloutEvent.Kind.CANARY_START)
    page = client.get(reverse("admin:admission_rolloutevent_change", args=[event.pk]))
    assert "33.3% of runs" in page.content.decode()
    assert not found, "\n".join(f"{url}: {raw}" for url, raw in found.items())
