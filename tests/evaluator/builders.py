"""Builders shared by the evaluator tests: profiles, rulesets, requests, a virtual-time runner."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from admission.core import AdmissionRegistry, Profile, VirtualTimeLoop
from evaluator.engine.invocation import DecisionEvaluationRequest

T = TypeVar("T")

WORKSPACE = "ws-tenant-4f1c"
PRINCIPAL = "principal-7d2e"


def profile_doc(
    *,
    version: str = "v1",
    workspace: dict[str, Any] | None = None,
    providers: dict[str, dict[str, Any]] | None = None,
    principals: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A profile document with generous defaults."""
    return {
        "profileVersion": version,
        "workspace": workspace or {"concurrency": 64},
        "providers": providers or {"fake": {"concurrency": 64}},
        "principals": principals or {PRINCIPAL: {"concurrency": 64}},
    }


def profile(workspace_id: str = WORKSPACE, **kwargs: Any) -> Profile:
    return Profile.from_dict(profile_doc(**kwargs), workspace_id=workspace_id)


def target_doc(adapter: str = "fake", **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"adapter": adapter, "model": "model-a", "timeoutMs": 10_000}
    doc.update(overrides)
    return doc


def decision_doc(
    decision_id: str,
    *,
    adapter: str = "fake",
    fallbacks: list[dict[str, Any]] | None = None,
    **target: Any,
) -> dict[str, Any]:
    return {
        "id": decision_id,
        "prompt": "Is ${text} acceptable?",
        "allowedOutputs": ["yes", "no"],
        "binding": {"primary": target_doc(adapter, **target), "fallbacks": fallbacks or []},
    }


def ruleset_doc(count: int = 3, *, adapter: str = "fake", **target: Any) -> dict[str, Any]:
    return {
        "id": "ruleset-a",
        "decisions": [decision_doc(f"d{i}", adapter=adapter, **target) for i in range(count)],
    }


def request(
    ruleset: dict[str, Any] | None = None,
    *,
    principal_id: str = PRINCIPAL,
    workspace_id: str = WORKSPACE,
    signal: Any = None,
    **fields: Any,
) -> DecisionEvaluationRequest:
    doc: dict[str, Any] = {
        "ruleset": copy.deepcopy(ruleset or ruleset_doc()),
        "input": {"text": "x"},
    }
    doc.update(fields)
    return DecisionEvaluationRequest.from_dict(
        doc, principal_id=principal_id, workspace_id=workspace_id, signal=signal
    )


def registry_with(loop: asyncio.AbstractEventLoop, *profiles: Profile) -> AdmissionRegistry:
    registry = AdmissionRegistry(clock=loop.clock)  # type: ignore[attr-defined]
    for item in profiles:
        registry.register(item)
    return registry


def run_virtual(main: Callable[[VirtualTimeLoop], Awaitable[T]]) -> T:
    """Run ``main(loop)`` on a fresh ``VirtualTimeLoop``."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()
