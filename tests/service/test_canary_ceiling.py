"""A canary under deployment-wide admission, with two worker processes: its runs are admitted
under the canary version's limits for the whole deployment and within the active version's
shared pools, so the provider (a loopback server that records every call's start and end) never
has more calls in flight than the active ceiling, nor the canary more than its own; promoting
takes effect at the next run boundary."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import Deployment, admission_redis_env, demo_provider_over_http

pytestmark = pytest.mark.celery

BASE = "/api/workspaces/demo"
RUNS, DECISIONS = 40, 5

VERSIONS = """
from config.demo import demo_profile, demo_version_approve, demo_version_activate

def document(label, provider_concurrency):
    document = demo_profile(label, concurrency=8)
    document["providers"]["fake"]["concurrency"] = provider_concurrency
    for limits in document["principals"].values():
        limits["concurrency"] = 8
    return document

demo_version_activate(document("demo-active", 4))
demo_version_approve(document("demo-canary", 2))
print("ok")
"""


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    # Ends before starts at the same instant: a call that ended frees its place first.
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def _document(tag: str) -> dict[str, Any]:
    document = example_request(DECISIONS)
    document["input"] = {"text": tag}
    document["scheduler"] = {"enabled": True, "bindingConcurrency": DECISIONS}
    return document


@pytest.mark.parametrize("mode", ["full"])
def test_a_canary_never_takes_the_provider_above_the_active_ceiling(deployment: Deployment):
    with LoopbackServer() as provider:
        provider.default = Reply(delay=0.15)
        deployment.env["SLUICE_ADAPTERS"] = demo_provider_over_http(provider.base_url)
        deployment.env.update(admission_redis_env(deployment))
        assert deployment.django(VERSIONS).strip().endswith("ok")
        deployment.start_web()
        started = deployment.api(
            "POST", BASE + "/canary/", json={"version": "demo-canary", "fraction": 0.5}
        )
        assert started.status_code == 201, started.text
        deployment.start_worker()
        deployment.start_worker()

        tags: dict[str, str] = {}
        for index in range(RUNS):
            tag = f"run-{index}-{uuid.uuid4().hex[:6]}"
            user = "demo-approver" if index % 2 else "demo-proposer"
            tags[deployment.submit(_document(tag), user=user)["id"]] = tag

        def finished() -> list[dict[str, Any]]:
            runs = deployment.api("GET", BASE + "/evaluations/?page_size=500").json()["results"]
            return [run for run in runs if run["finishedAt"]]

        # Promote once half the runs are done: runs in flight keep the arm they started on.
        deployment._wait(lambda: len(finished()) >= RUNS // 2, 120, "half the runs to finish")
        promoted = deployment.api("POST", BASE + "/canary/promote/", json={"reason": "holds"})
        assert promoted.status_code == 200, promoted.text
        after = {}
        for index in range(4):
            tag = f"after-{index}-{uuid.uuid4().hex[:6]}"
            after[deployment.submit(_document(tag))["id"]] = tag

        runs = {run_id: deployment.wait_run(run_id, timeout=120) for run_id in {**tags, **after}}

    for run in runs.values():
        assert run["status"] == "completed", run
        assert [d["status"] for d in run["result"]["decisions"]] == ["succeeded"] * DECISIONS
    on_canary = {run_id for run_id in tags if runs[run_id]["result"]["rollout"]["canary"]}
    assert 0 < len(on_canary) < RUNS
    assert all(runs[run_id]["profileVersion"] == "demo-canary" for run_id in on_canary)
    # Every other run ran whole on the active version, or, from the promotion on, on the
    # promoted one: the switch happens at a run boundary, and startedAt is that boundary's
    # instant (the plan and the profile version are read in the transaction that stamps it,
    # which a promotion cannot straddle), so the promotion's time splits the runs exactly.
    promoted_at = _at(promoted.json()["at"])
    others = [runs[run_id] for run_id in set(tags) - on_canary]
    assert any(run["profileVersion"] == "demo-active" for run in others)
    for run in [*others, *(runs[run_id] for run_id in after)]:
        assert run["result"]["rollout"]["canary"] is None
        started = _at(run["startedAt"])
        expected = "demo-canary" if started >= promoted_at else "demo-active"
        assert run["profileVersion"] == expected, (run["startedAt"], promoted_at)

    canary_tags = {tags[run_id] for run_id in on_canary}
    calls = provider.requests
    assert len(calls) == (RUNS + len(after)) * DECISIONS
    every = [(call["at"], call["ended"]) for call in calls]
    canary = [
        (call["at"], call["ended"])
        for call in calls
        if any(tag in call["body"]["messages"][1]["content"] for tag in canary_tags)
    ]
    assert provider.max_in_flight <= 4
    assert _most_at_once(every) <= 4
    assert _most_at_once(canary) <= 2
    # The load was there to break the ceilings: both were reached.
    assert _most_at_once(every) == 4
    assert _most_at_once(canary) == 2
