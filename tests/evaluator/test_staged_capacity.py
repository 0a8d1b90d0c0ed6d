"""One ceiling for a real endpoint: staged runs started together, in any workspaces and threads,
never put more calls in flight on the endpoint than its documented capacity, whether the slots
live in Redis (every worker process) or in the one worker process."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import connection

from admission.models import Workspace
from evaluator.deployment.staged_capacity import LocalSlots, RedisSlots
from evaluator.models import LoadRun
from evaluator.services.runs import load_run_submit
from evaluator.worker.load_dispatch import load_run_execute
from tests.evaluator.loopback import LoopbackServer, Reply

MANIFEST = "load-manifest.v2.json"
CAPACITY = 8


def _redis_url() -> str:
    # As the service tests do: the shared Redis on its default port unless told otherwise.
    url = os.environ.get("SLUICE_TEST_ADMISSION_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {url}")
    return url


@pytest.fixture(params=["redis", "local"])
def slots_url(request: pytest.FixtureRequest) -> str:
    return _redis_url() if request.param == "redis" else ""


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        # A provider's service time, long enough for calls of every run to overlap.
        server.default = Reply(content="answered", delay=0.15)
        yield server


def _hold_together(make_slots: Any, holders: int, limit: int) -> int:
    """Run `holders` takers at once on two threads' loops; the most holding a slot together."""
    held = 0
    most = 0
    lock = threading.Lock()

    async def one(slots: Any) -> None:
        nonlocal held, most
        token = await slots.take(10_000)
        with lock:
            held += 1
            most = max(most, held)
        await asyncio.sleep(0.01)
        with lock:
            held -= 1
        await slots.give_back(token)

    async def loop_main() -> None:
        slots = make_slots()
        try:
            await asyncio.gather(*(one(slots) for _ in range(holders // 2)))
        finally:
            await slots.aclose()

    threads = [threading.Thread(target=asyncio.run, args=(loop_main(),)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return most


def test_local_slots_hold_their_limit_across_threads():
    key = f"test-{uuid.uuid4().hex}"
    assert _hold_together(lambda: LocalSlots(key, 3), 40, 3) == 3


def test_redis_slots_hold_their_limit_across_clients_and_free_a_dead_holders_slot():
    url = _redis_url()
    key = f"sluice-test-{uuid.uuid4().hex}:staged-capacity:staged"
    try:
        assert _hold_together(lambda: RedisSlots(url, key, 3), 40, 3) == 3

        async def abandoned() -> bool:
            slots = RedisSlots(url, key, 1)
            await slots.take(200)  # a holder that never gives its slot back
            other = RedisSlots(url, key, 1)
            try:
                await asyncio.wait_for(other.take(10_000), 5)
            finally:
                await slots.aclose()
                await other.aclose()
            return True

        assert asyncio.run(abandoned())
    finally:
        redis.Redis.from_url(url).delete(key)


@pytest.mark.django_db(transaction=True)
def test_four_staged_runs_never_exceed_the_endpoints_capacity_together(
    settings: Any, server: LoopbackServer, django_user_model: Any, slots_url: str
):
    settings.SLUICE_ADAPTERS = {
        "fake": {"kind": "fake"},
        "staged": {
            "kind": "openai-chat",
            "baseUrl": server.base_url,
            "capacity": {"concurrency": CAPACITY, "requestsPerMinute": 60_000},
        },
    }
    settings.SLUICE_STAGED_PROVIDER = {"adapter": "staged", "model": "m", "windowSeconds": 1}
    settings.SLUICE_ADMISSION_REDIS_URL = slots_url
    settings.SLUICE_ADMISSION_KEY_PREFIX = f"sluice-test-{uuid.uuid4().hex}"
    # Both runs of each workspace at once (one load run per workspace in flight by default).
    settings.SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT = 2
    runs = []
    for key in ("acme", "globex"):
        workspace = Workspace.objects.create(key=key, name=key)
        operator = django_user_model.objects.create_user(f"op-{key}", is_staff=True)
        workspace.members.add(operator, through_defaults={"role": "operator"})
        runs += [
            load_run_submit(workspace, operator, MANIFEST, "staged-provider") for _ in range(2)
        ]

    start = threading.Barrier(len(runs))

    def execute(run: LoadRun) -> None:
        try:
            start.wait()
            load_run_execute(run.pk, wait_seconds=60)
        finally:
            connection.close()

    threads = [threading.Thread(target=execute, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    done = [LoadRun.objects.get(pk=run.pk) for run in runs]
    assert [run.status for run in done] == ["completed"] * 4, [run.error for run in done]
    # Each run alone may fill the endpoint; together they queue for its slots instead.
    assert CAPACITY // 2 < server.max_in_flight <= CAPACITY, server.max_in_flight
    assert len(server.requests) > 4 * CAPACITY


def test_a_call_without_reachable_slots_is_not_sent():
    from evaluator.deployment.staged_capacity import LeasedAdapter
    from evaluator.engine.adapters import FakeAdapter
    from evaluator.engine.adapters.base import AdapterError
    from tests.evaluator.builders import request
    from tests.service.conftest import free_port

    fake = FakeAdapter()
    leased = LeasedAdapter(fake, RedisSlots(f"redis://127.0.0.1:{free_port()}/0", "k", 1))
    decision = request().ruleset.decisions[0]

    async def call() -> AdapterError:
        from evaluator.engine.adapters.base import AdapterCall

        target = decision.binding.primary
        try:
            await leased.invoke(AdapterCall(decision.id, "prompt", target, decision.output, 1))
        except AdapterError as error:
            return error
        finally:
            await leased.aclose()
        raise AssertionError("the call went through")

    error = asyncio.run(call())
    assert error.kind == "connect-error" and error.sent is False and error.retryable
    assert "capacity slots are unavailable" in str(error)
    assert fake.calls == []
