"""Canary and shadow key spaces in a process (admission/runtime/registry.py): one that is
replaced stays open exactly while a run may still use it, and closes when the last one ends,
however many replacements come meanwhile; with deployment-wide admission its coordinator (its
Redis clients) is closed then."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from admission.core import AdmissionRequest, Estimate
from admission.models import ProfileVersion, RolloutEvent, Workspace
from admission.rollout.plan import RunPlan
from admission.runtime import registry as runtime
from admission.runtime.canary import CanaryRegistry
from admission.services import profiles as services
from tests.service.conftest import wait_for


def answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


pytestmark = pytest.mark.django_db


@pytest.fixture(params=["in-process", "redis"])
def admission(request: pytest.FixtureRequest, settings: Any) -> str:
    if request.param == "in-process":
        settings.SLUICE_ADMISSION_REDIS_URL = ""
    else:
        url = os.environ.get("SLUICE_TEST_ADMISSION_REDIS_URL", "redis://127.0.0.1:6379/0")
        if not answers(url):
            pytest.skip(f"coordinated admission needs Redis at {url}")
        settings.SLUICE_ADMISSION_REDIS_URL = url
        settings.SLUICE_ADMISSION_KEY_PREFIX = f"t{uuid.uuid4().hex[:12]}"
    runtime.reset_registry()
    return str(request.param)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own, as a worker's evaluation loop; at the end every
    coordinator still open on it (the process registry's, the current key spaces') closes."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running

    async def close_all() -> None:
        registry = runtime.get_registry()
        factory = getattr(registry, "_controller_factory", None)
        held = [getattr(factory, "__self__", None)]
        held += [_coordinator(r) for r in _key_space_registries(registry)]
        for coordinator in held:
            if coordinator is not None and getattr(coordinator, "_loop", None) is running:
                await coordinator.aclose()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(close_all(), running).result(30)
    running.call_soon_threadsafe(running.stop)
    thread.join(5)
    running.close()


def _key_space_registries(registry: Any) -> list[Any]:
    found = []
    shadow = registry.shadow("acme")
    if shadow is not None:
        found.append(shadow.host)
    found += [own for _, own in runtime._canaries.values()]
    return found


def _event(workspace: Workspace, pk: int, version: ProfileVersion, kind: str) -> RolloutEvent:
    return RolloutEvent(pk=pk, workspace=workspace, kind=kind, version=version)


def _plan(
    workspace: Workspace,
    *,
    shadow: RolloutEvent | None = None,
    canary: RolloutEvent | None = None,
    on_canary: bool = False,
) -> RunPlan:
    return RunPlan(
        workspace_key=workspace.key,
        parallel_allowed=True,
        shadow=shadow,
        canary=canary,
        on_canary=on_canary,
    )


def _use(registry: Any, workspace: Workspace, loop: asyncio.AbstractEventLoop) -> None:
    """Admit and release one request through `registry` on `loop`, and mirror it into the
    workspace's shadow if there is one (so their clients open)."""

    async def once() -> None:
        request = AdmissionRequest(
            budget_id=uuid.uuid4().hex,
            principal_id="noisy",
            workspace_id=workspace.key,
            provider_id="jev",
            estimate=Estimate(tokens=10, cost_usd=0.001, retained_work=1, attempts=1),
        )
        lease = await registry.controller(workspace.key).acquire(request)
        shadow = registry.shadow(workspace.key)
        if shadow is not None:
            # Its copy is decided in the shadow's key space.
            shadow.mirror(request)
        lease.release(success=True)

    asyncio.run_coroutine_threadsafe(once(), loop).result(30)


def _coordinator(registry: Any) -> Any:
    """The coordinator of the open key space of `registry` (None in-process)."""
    space = runtime._spaces.get(id(registry))
    return space.coordinator if space is not None else None


def _closed(registry: Any, admission: str) -> Callable[[], bool]:
    """Whether the key space's coordinator is closed (in-process: there is none, so the key
    space is gone once forgotten)."""
    coordinator = _coordinator(registry)
    assert (coordinator is not None) == (admission == "redis")
    if coordinator is None:
        return lambda: True
    # Used on the loop (a shadow's copy is decided by a task of its own).
    wait_for(lambda: coordinator._loop is not None, 10, "the key space to be used")
    return lambda: bool(coordinator._closed)


def test_a_replaced_canary_key_space_closes_when_its_last_run_ends(
    admission, workspace, approver, approved, loop
):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    canaries = [
        _event(
            workspace, pk, approved(f"c{pk}", concurrency=10 + pk), RolloutEvent.Kind.CANARY_START
        )
        for pk in range(1, 8)
    ]
    first_run, first = runtime.registry_for_run(
        _plan(workspace, canary=canaries[0], on_canary=True)
    )
    assert isinstance(first_run, CanaryRegistry)
    _use(first_run, workspace, loop)
    _, second = runtime.registry_for_run(_plan(workspace, canary=canaries[0], on_canary=True))
    closed = _closed(first_run._canary, admission)
    assert runtime.open_key_spaces() == ["canary:1"]

    # Replaced six times while its two runs go on; no run takes the later canaries.
    for canary in canaries[1:]:
        _, hold = runtime.registry_for_run(_plan(workspace, canary=canary))
        hold.release()
    assert runtime.open_key_spaces() == ["canary:1", "canary:7"]
    first.release()
    assert runtime.open_key_spaces() == ["canary:1", "canary:7"]
    assert admission == "in-process" or not closed()
    second.release()
    second.release()
    assert runtime.open_key_spaces() == ["canary:7"]
    wait_for(closed, 10, "the replaced canary's coordinator to close")

    # A canary abandoned with no run left on it closes at once.
    _, hold = runtime.registry_for_run(_plan(workspace))
    hold.release()
    assert runtime.open_key_spaces() == []


def test_a_replaced_shadow_key_space_closes_when_the_runs_in_flight_then_end(
    admission, workspace, approver, approved, loop
):
    services.profile_version_activate(version=approved("v1"), actor=approver)
    shadows = [
        _event(
            workspace, pk, approved(f"s{pk}", concurrency=10 + pk), RolloutEvent.Kind.SHADOW_START
        )
        for pk in range(11, 14)
    ]
    registry, a = runtime.registry_for_run(_plan(workspace, shadow=shadows[0]))
    first_shadow = registry.shadow(workspace.key)
    assert first_shadow is not None
    _use(registry, workspace, loop)
    closed = _closed(first_shadow.host, admission)
    # Run b starts under the next shadow: run a may still have copies in the first one.
    _, b = runtime.registry_for_run(_plan(workspace, shadow=shadows[1]))
    assert runtime.open_key_spaces() == ["shadow:11", "shadow:12"]
    _, c = runtime.registry_for_run(_plan(workspace, shadow=shadows[2]))
    b.release()
    assert runtime.open_key_spaces() == ["shadow:11", "shadow:12", "shadow:13"]
    a.release()
    assert runtime.open_key_spaces() == ["shadow:13"]
    wait_for(closed, 10, "the replaced shadow's coordinator to close")

    # Stopped (and a canary abandoned) while run c, run d and a canary run are in flight.
    canary = _event(workspace, 20, approved("c20", concurrency=40), RolloutEvent.Kind.CANARY_START)
    _, on_canary = runtime.registry_for_run(
        _plan(workspace, shadow=shadows[2], canary=canary, on_canary=True)
    )
    _, d = runtime.registry_for_run(_plan(workspace, shadow=shadows[2], canary=canary))
    assert runtime.open_key_spaces() == ["canary:20", "shadow:13"]
    _, e = runtime.registry_for_run(_plan(workspace))
    assert runtime.open_key_spaces() == ["canary:20", "shadow:13"]
    c.release()
    assert runtime.open_key_spaces() == ["canary:20", "shadow:13"]
    # The canary run mirrors nothing into the shadow: the shadow closes after run d.
    d.release()
    assert runtime.open_key_spaces() == ["canary:20"]
    on_canary.release()
    assert runtime.open_key_spaces() == []
    e.release()
