"""A shadow judged for the whole deployment, with two worker processes: every process decides its
copies against one shadow state in Redis, so the shadow's merged tallies are what one process
computes over all the arrivals (not each process's share of them), and the real side runs as it
does without a shadow.

The shadow is chosen so that its verdict is fixed by the workload alone: its provider bucket holds
SHADOW_RPM requests and it queues nothing, so over a phase much shorter than the refill of one
token it admits exactly SHADOW_RPM copies and refuses the rest. Two processes each judging their
own share would admit twice as many."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import Deployment, admission_redis_env, demo_provider_over_http

pytestmark = pytest.mark.celery

BASE = "/api/workspaces/demo"
RUNS, DECISIONS = 12, 4
ACTIVE_CEILING = 4
SHADOW_RPM = 3

VERSIONS = f"""
from config.demo import demo_profile, demo_version_approve, demo_version_activate

def document(label, **provider):
    document = demo_profile(label, concurrency=8)
    document["providers"]["fake"]["concurrency"] = {ACTIVE_CEILING}
    document["providers"]["fake"].update(provider)
    for limits in document["principals"].values():
        limits["concurrency"] = 8
    return document

demo_version_activate(document("demo-active"))
# Tighter: a bucket of {SHADOW_RPM} requests a minute and no queue at the provider.
demo_version_approve(document("demo-shadow", requestsPerMinute={SHADOW_RPM}, maxQueueLength=0))
print("ok")
"""

CLAIMED_BY = """
import json
from evaluator.models import EvaluationRun
ids = {ids!r}
print(json.dumps(sorted({{str(w) for w in EvaluationRun.objects.filter(
    pk__in=ids).values_list("claimed_by", flat=True)}})))
"""


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    # Ends before starts at the same instant: a call that ended frees its place first.
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def _phase(deployment: Deployment, provider: LoopbackServer, name: str) -> dict[str, Any]:
    """RUNS evaluations of DECISIONS parallel decisions from both demo users, all at once."""
    tags: dict[str, str] = {}
    for index in range(RUNS):
        tag = f"{name}-{index}-{uuid.uuid4().hex[:6]}"
        document = example_request(DECISIONS)
        document["input"] = {"text": tag}
        document["scheduler"] = {"enabled": True, "bindingConcurrency": DECISIONS}
        user = "demo-approver" if index % 2 else "demo-proposer"
        tags[deployment.submit(document, user=user)["id"]] = tag
    runs = {run_id: deployment.wait_run(run_id, timeout=60) for run_id in tags}
    calls = [
        call
        for call in provider.requests
        if any(tag in call["body"]["messages"][1]["content"] for tag in tags.values())
    ]
    return {"runs": runs, "calls": calls}


def _succeeded(phase: dict[str, Any]) -> None:
    for run in phase["runs"].values():
        assert run["status"] == "completed", run
        assert run["profileVersion"] == "demo-active"
        assert [d["status"] for d in run["result"]["decisions"]] == ["succeeded"] * DECISIONS
    assert len(phase["calls"]) == RUNS * DECISIONS


@pytest.mark.parametrize("mode", ["full"])
def test_two_workers_share_one_shadow_and_reality_is_as_without_it(deployment: Deployment):
    with LoopbackServer() as provider:
        provider.default = Reply(delay=0.1)
        deployment.env["SLUICE_ADAPTERS"] = demo_provider_over_http(provider.base_url)
        deployment.env.update(admission_redis_env(deployment))
        assert deployment.django(VERSIONS).strip().endswith("ok")
        deployment.start_web()
        deployment.start_worker()
        deployment.start_worker()

        plain = _phase(deployment, provider, "plain")
        started = deployment.api("POST", BASE + "/shadow/", json={"version": "demo-shadow"})
        assert started.status_code == 201, started.text
        began = time.monotonic()
        shadowed = _phase(deployment, provider, "shadowed")
        # A shadow copy still being decided when its run ended counts with the next run of that
        # process (the documented tolerance): one-decision runs carry such late copies in until
        # the totals are exact. Each is a request on both sides, refused by the empty bucket.
        flushes = 0
        while True:
            shown = deployment.api("GET", BASE + "/shadow/")
            assert shown.status_code == 200, shown.text
            totals = shown.json()["comparison"]
            if totals["shadow"]["requests"] == totals["active"]["requests"] or flushes == 10:
                break
            document = example_request(1)
            document["input"] = {"text": f"flush-{flushes}-{uuid.uuid4().hex[:6]}"}
            flushed = deployment.wait_run(deployment.submit(document)["id"], timeout=30)
            assert flushed["status"] == "completed", flushed
            flushes += 1
        elapsed = time.monotonic() - began
        claimants = json.loads(
            deployment.django(CLAIMED_BY.format(ids=list(shadowed["runs"]))).splitlines()[-1]
        )

    # (b) Reality: with and without the shadow every run completes with every decision, on the
    # active version, and the provider sees the active ceiling reached and never passed.
    _succeeded(plain)
    _succeeded(shadowed)
    for phase in (plain, shadowed):
        assert phase["runs"] and all(
            run["result"]["rollout"]["shadow"] == ("demo-shadow" if phase is shadowed else None)
            for run in phase["runs"].values()
        )
        assert _most_at_once([(c["at"], c["ended"]) for c in phase["calls"]]) == ACTIVE_CEILING
    assert provider.max_in_flight == ACTIVE_CEILING

    # Both worker processes ran shadowed runs, so each mirrored part of the load.
    assert len(claimants) == 2 and all(claimants), claimants

    # (a) The shadow's verdict, merged from every run of both processes. The bucket refills one
    # token in 60 / SHADOW_RPM seconds; the phase is far shorter, so the count is exact.
    assert elapsed < 60 / SHADOW_RPM, elapsed
    comparison = shown.json()["comparison"]
    requests = RUNS * DECISIONS
    # Each run left its own observation, counted once.
    assert comparison["observations"] == RUNS + flushes
    assert comparison["active"]["requests"] == requests + flushes
    assert comparison["active"]["admitted"] == requests + flushes
    assert comparison["active"]["rejected"] == {}
    assert comparison["shadow"]["requests"] == requests + flushes, flushes
    # As one process computes over all the arrivals: the bucket's SHADOW_RPM, once for the
    # deployment (a shadow per process would admit 2 * SHADOW_RPM), and every other copy refused.
    assert comparison["shadow"]["admitted"] == SHADOW_RPM
    assert comparison["shadow"]["rejected"] == {"queue-full": requests + flushes - SHADOW_RPM}
    # Nothing of the shadow waited in a queue: it has none. Reality queued behind its ceiling,
    # but not every request: the first ACTIVE_CEILING found the provider free.
    assert comparison["shadow"]["deferred"] == 0
    assert comparison["shadow"]["queueDelayMs"]["max"] == 0
    assert 0 < comparison["active"]["deferred"] <= requests - ACTIVE_CEILING
    assert comparison["passed"] is False
