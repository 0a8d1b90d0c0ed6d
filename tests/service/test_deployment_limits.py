"""A provider's limits hold for the whole deployment: two worker instances, one set of limits.

Full mode only: admission state is shared through Redis there. The provider is a real
OpenAI-compatible loopback server that records every request and how many were in flight; the
profile gives it `concurrency: 2` and `requestsPerMinute: 20` (a bucket of 20 that refills one
request every 3 s), and both worker instances run several evaluations at once.
"""

from __future__ import annotations

import pytest

from console.forms.runs import example_request
from tests.evaluator.loopback import LoopbackServer, Reply

from .conftest import admission_redis_env, demo_provider_over_http

pytestmark = pytest.mark.celery

RPM = 20
CONCURRENCY = 2

ACTIVATE_LIMITS = f"""
from config.demo import demo_profile, demo_version_activate
document = demo_profile("demo-shared-limits")
document["providers"]["fake"].update(
    concurrency={CONCURRENCY}, requestsPerMinute={RPM}, maxQueueWaitMs=60000
)
print(demo_version_activate(document).kind)
"""


@pytest.mark.parametrize("mode", ["full"], indirect=True)
def test_two_worker_instances_share_one_concurrency_and_one_rate(deployment):
    runs, decisions = 5, 5
    with LoopbackServer() as provider:
        provider.default = Reply(content="yes", delay=0.3)
        # The adapter keeps the profile's provider name; its calls go to the loopback server.
        env = {"SLUICE_ADAPTERS": demo_provider_over_http(provider.base_url)}
        env.update(admission_redis_env(deployment))
        deployment.django(ACTIVATE_LIMITS)
        deployment.start_web(env)
        for _ in range(2):
            deployment.start_worker({**env, "SLUICE_WORKER_SLOTS": "2"}, concurrency=2)

        submitted = []
        for index in range(runs):
            document = example_request(decisions)
            # Every decision's prompt names its run, so a repeated dispatch is visible.
            document["input"]["text"] = f"case {index}"
            # Runs waiting for admission hold no worker slot, so all five wait at once, and a
            # decision's timeout counts its wait: 25 calls under a 20-a-minute bucket take 15 s.
            for decision in document["ruleset"]["decisions"]:
                decision["binding"]["primary"]["timeoutMs"] = 60000
            submitted.append(deployment.submit(document)["id"])
        finished = [deployment.wait_run(run_id, timeout=150) for run_id in submitted]

    assert [run["status"] for run in finished] == ["completed"] * runs, finished
    prompts = [request["body"]["messages"][-1]["content"] for request in provider.requests]
    assert len(prompts) == runs * decisions
    assert len(set(prompts)) == len(prompts), "a decision reached the provider twice"

    # Never more calls at the provider than its concurrency, across both instances.
    assert provider.max_in_flight == CONCURRENCY
    # The bucket: at most RPM at once, then one more per 60/RPM seconds. The server sees a
    # request a little after it was admitted (a worker's first call also opens its connection),
    # so a window is widened by a second; without a shared bucket, four pool processes would
    # have let four buckets' worth through.
    arrivals = sorted(request["at"] for request in provider.requests)
    for first, start in enumerate(arrivals):
        for last in range(first, len(arrivals)):
            window = arrivals[last] - start
            allowed = RPM + (window + 1.0) * RPM / 60
            assert last - first + 1 <= allowed, (first, last, window)
    # More than one bucket's worth was asked for, so the refill was really waited for.
    assert arrivals[-1] - arrivals[0] >= (runs * decisions - RPM) * 60 / RPM - 1

    # Every attempt was admitted once and sent; the evidence counts the deployment's permits,
    # which never exceed the provider's concurrency.
    attempts = [attempt for run in finished for attempt in run["attempts"]]
    assert len(attempts) == runs * decisions
    assert all(a["sent"] and a["evidence"]["decision"] == "admit" for a in attempts)
    assert 1 <= max(a["evidence"]["active"] for a in attempts) <= CONCURRENCY
