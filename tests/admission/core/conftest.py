"""A small harness for controller scenarios on virtual time."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import settings

from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    AdmissionRequest,
    Estimate,
    Lease,
    Profile,
    VirtualTimeLoop,
)

WORKSPACE = "ws-1"


def examples(count: int) -> int:
    """``count`` Hypothesis examples, times ``SLUICE_HYPOTHESIS_SCALE`` (default 1).

    The mutation run (docs/admission-core.md) sets a fraction: it runs the core's tests once per
    mutant, and the property tests' full example counts would make it take hours.
    """
    scale = float(os.environ.get("SLUICE_HYPOTHESIS_SCALE", "1"))
    return max(10, round(count * scale))


if "SLUICE_HYPOTHESIS_SCALE" in os.environ:
    # Tests that name no count run Hypothesis's default 100, scaled the same way.
    settings.register_profile("scaled", max_examples=examples(100))
    settings.load_profile("scaled")


def profile_doc(
    version: str = "v1",
    *,
    workspace: dict[str, Any] | None = None,
    providers: dict[str, dict[str, Any]] | None = None,
    principals: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "profileVersion": version,
        "workspace": workspace if workspace is not None else {"concurrency": 100},
        "providers": providers if providers is not None else {"llm": {"concurrency": 100}},
        "principals": principals
        if principals is not None
        else {"alice": {"concurrency": 100}, "bob": {"concurrency": 100}},
    }


def make_profile(**kwargs: Any) -> Profile:
    return Profile.from_dict(profile_doc(**kwargs), workspace_id=WORKSPACE)


def request(
    principal: str = "alice",
    provider: str = "llm",
    budget: str = "inv-1",
    *,
    deadline_ms: float | None = None,
    signal: Any = None,
    workspace: str = WORKSPACE,
    **estimate: Any,
) -> AdmissionRequest:
    return AdmissionRequest(
        budget_id=budget,
        principal_id=principal,
        workspace_id=workspace,
        provider_id=provider,
        estimate=Estimate(**estimate),
        deadline_ms=deadline_ms,
        signal=signal,
    )


class Scenario:
    """A registry on a fresh virtual-time loop, with helpers to start and settle acquires."""

    def __init__(self, profile: Profile | None = None, seed: int = 7) -> None:
        self.loop = VirtualTimeLoop()
        self.registry = AdmissionRegistry(clock=self.loop.clock, rng=random.Random(seed))
        self.controller = self.registry.register(profile or make_profile())

    def now(self) -> float:
        return self.loop.clock.monotonic_ms()

    def run(self, body: Callable[[Scenario], Awaitable[Any]]) -> Any:
        return self.loop.run_until_complete(body(self))

    def start(self, req: AdmissionRequest) -> asyncio.Task[Lease]:
        return self.loop.create_task(self.controller.acquire(req))

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def admit(self, req: AdmissionRequest) -> Lease:
        return await self.controller.acquire(req)

    async def reject(self, req: AdmissionRequest) -> AdmissionRejected:
        try:
            lease = await self.controller.acquire(req)
        except AdmissionRejected as error:
            return error
        lease.release()
        raise AssertionError("expected a rejection, got an admission")

    def close(self) -> None:
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


@pytest.fixture
def scenario_factory() -> Any:
    made: list[Scenario] = []

    def factory(profile: Profile | None = None, seed: int = 7) -> Scenario:
        scenario = Scenario(profile, seed)
        made.append(scenario)
        return scenario

    yield factory
    for scenario in made:
        scenario.close()


def rejection_of(task: asyncio.Task[Lease]) -> AdmissionRejected:
    error = task.exception()
    assert isinstance(error, AdmissionRejected), f"expected AdmissionRejected, got {error!r}"
    return error
