"""The adapters this deployment offers to evaluations, read from `SLUICE_ADAPTERS`.

The `SLUICE_ADAPTERS` setting (config/settings.py reads it from the environment) is a JSON
object, as text or already parsed, mapping adapter id
to `{"kind": "fake", "latencyMs": 20, "error": null, "callLog": null}` or
`{"kind": "openai-chat", "baseUrl": "https://...", "apiKeyEnv": "NAME"}`. The adapter id is also
the admission provider id, so it must match a provider of the workspace's profile. The default
is one fake adapter, `fake`, so the embedded demo needs no provider. An `openai-chat` adapter may
document its provider's capacity, `"capacity": {"concurrency": 8, "requestsPerMinute": 600}`,
which each staged-provider load run's ceilings stay below, and which all the deployment's staged
runs together never exceed in calls at once (evaluator/deployment/staged_capacity.py).

`SLUICE_WORKSPACE_ADAPTERS` (likewise) maps a workspace key to adapters of that workspace only,
in the same form; an id there replaces the deployment-wide adapter of that id for that
workspace. Endpoints and credentials come from here alone: an evaluation names an adapter id
and a model, nothing else (`evaluator.engine.rulesets.DEPLOYMENT_ONLY_KEYS`).

`SLUICE_STAGED_PROVIDER` (a setting) says where a `staged-provider` load run sends the manifest's
calls: `{"adapter": "ID" or {"MANIFEST-PROVIDER": "ID", ...}, "model": "NAME",
"windowSeconds": 30}`; every adapter it names must be an `openai-chat` adapter with a capacity.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from evaluator.deployment.staged_capacity import LeasedAdapter, deployment_slots
from evaluator.engine.adapters import (
    Adapter,
    AdapterCall,
    AdapterResponse,
    FakeAdapter,
    FakeStep,
    OpenAIChatAdapter,
    SharedClients,
)
from evaluator.engine.parsing import ENV_NAME
from evaluator.harness.staged_target import Capacity, StagedEndpoint

STAGED_SETTING = "SLUICE_STAGED_PROVIDER"
DEFAULT_STAGED_WINDOW_SECONDS = 30

__all__ = [
    "DEFAULT_ADAPTERS",
    "AdapterConfigError",
    "adapter_ids",
    "build_adapters",
    "staged_endpoints",
    "staged_window_seconds",
]

_WORKSPACE_SETTING = "SLUICE_WORKSPACE_ADAPTERS"

DEFAULT_ADAPTERS: Mapping[str, Mapping[str, Any]] = {"fake": {"kind": "fake", "latencyMs": 20}}


class AdapterConfigError(ValueError):
    """`SLUICE_ADAPTERS` cannot be used; names what is wrong."""


def _read(name: str, default: Any) -> Any:
    """A setting holding JSON: text (as read from the environment by config/settings.py) or
    already parsed; `default` when it is unset or empty."""
    configured = getattr(settings, name, None)
    if configured is None or configured == "":
        return default
    if isinstance(configured, str):
        try:
            return json.loads(configured)
        except ValueError as error:
            raise AdapterConfigError(f"{name} is not JSON: {error}") from None
    return configured


def _adapter_table(table: Any, name: str) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(table, Mapping) or not all(
        isinstance(key, str) and isinstance(value, Mapping) for key, value in table.items()
    ):
        raise AdapterConfigError(f"{name} must map adapter ids to objects")
    return table


def _config(workspace_key: str | None = None) -> Mapping[str, Mapping[str, Any]]:
    adapters = dict(_adapter_table(_read("SLUICE_ADAPTERS", DEFAULT_ADAPTERS), "SLUICE_ADAPTERS"))
    if workspace_key is not None:
        per_workspace = _read(_WORKSPACE_SETTING, {})
        if not isinstance(per_workspace, Mapping):
            raise AdapterConfigError(f"{_WORKSPACE_SETTING} must map workspace keys to objects")
        own = per_workspace.get(workspace_key, {})
        adapters.update(_adapter_table(own, f"{_WORKSPACE_SETTING}.{workspace_key}"))
    return adapters


def adapter_ids(workspace_key: str | None = None) -> frozenset[str]:
    """The ids an evaluation in `workspace_key` may name (deployment-wide ones when None)."""
    return frozenset(_config(workspace_key))


_shared_clients: list[SharedClients] = []


def _clients() -> SharedClients:
    """This process's HTTP clients for `openai-chat` adapters, kept between runs."""
    if not _shared_clients:
        _shared_clients.append(SharedClients())
    return _shared_clients[0]


def build_adapters(workspace_key: str | None = None) -> dict[str, Adapter]:
    """Fresh adapters for one run in `workspace_key` (a fake adapter keeps a call log that must
    not grow forever)."""
    return {key: _build(key, spec) for key, spec in _config(workspace_key).items()}


def _build(key: str, spec: Mapping[str, Any]) -> Adapter:
    kind = spec.get("kind")
    if kind == "fake":
        step = FakeStep(
            latency_ms=float(spec.get("latencyMs", 0)),
            error=spec.get("error"),
            tokens=spec.get("tokens"),
        )
        idempotent = bool(spec.get("idempotent", False))
        if spec.get("callLog"):
            return LoggedFakeAdapter(str(spec["callLog"]), default=step, idempotent=idempotent)
        return FakeAdapter(default=step, idempotent=idempotent)
    if kind == "openai-chat":
        base_url = spec.get("baseUrl")
        if not isinstance(base_url, str) or not base_url:
            raise AdapterConfigError(f"SLUICE_ADAPTERS.{key}.baseUrl is required")
        key_env = spec.get("apiKeyEnv")
        if key_env is not None and (not isinstance(key_env, str) or not ENV_NAME.match(key_env)):
            raise AdapterConfigError(f"SLUICE_ADAPTERS.{key}.apiKeyEnv must be a variable name")
        # Runs share kept-alive connections to the provider (one pool per event loop).
        return OpenAIChatAdapter(base_url=base_url, api_key_env=key_env, clients=_clients())
    raise AdapterConfigError(f"SLUICE_ADAPTERS.{key}.kind must be 'fake' or 'openai-chat'")


def _staged_setting() -> Mapping[str, Any]:
    staged = getattr(settings, STAGED_SETTING, None)
    if staged is None:
        raise AdapterConfigError(
            f"this deployment configures no staged provider ({STAGED_SETTING} is not set)"
        )
    if not isinstance(staged, Mapping):
        raise AdapterConfigError(f"{STAGED_SETTING} must be an object")
    unknown = sorted(set(staged) - {"adapter", "model", "windowSeconds"})
    if unknown:
        raise AdapterConfigError(f"{STAGED_SETTING}.{unknown[0]} is not a known key")
    model = staged.get("model")
    if not isinstance(model, str) or not model.strip():
        raise AdapterConfigError(f"{STAGED_SETTING}.model must name the model to call")
    return staged


def staged_window_seconds() -> float:
    """How much of the manifest's timeline a staged run releases (`windowSeconds`)."""
    window = _staged_setting().get("windowSeconds", DEFAULT_STAGED_WINDOW_SECONDS)
    if isinstance(window, bool) or not isinstance(window, int | float):
        raise AdapterConfigError(f"{STAGED_SETTING}.windowSeconds must be a number of seconds")
    return float(window)


def _capacity(key: str, spec: Mapping[str, Any]) -> Capacity | None:
    raw = spec.get("capacity")
    if raw is None:
        return None
    where = f"SLUICE_ADAPTERS.{key}.capacity"
    if not isinstance(raw, Mapping) or set(raw) - {"concurrency", "requestsPerMinute"}:
        raise AdapterConfigError(f"{where} must be {{concurrency, requestsPerMinute?}}")
    concurrency = raw.get("concurrency")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise AdapterConfigError(f"{where}.concurrency must be a positive integer")
    rate = raw.get("requestsPerMinute")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < float("inf")
    ):
        raise AdapterConfigError(f"{where}.requestsPerMinute must be a non-negative number")
    return Capacity(concurrency=concurrency, requests_per_minute=rate)


def staged_endpoints(provider_ids: list[str]) -> dict[str, StagedEndpoint]:
    """The endpoint of each manifest provider lane for a staged run, with fresh adapters."""
    staged = _staged_setting()
    chosen = staged.get("adapter")
    if isinstance(chosen, str):
        lanes = dict.fromkeys(provider_ids, chosen)
    elif isinstance(chosen, Mapping) and all(isinstance(v, str) for v in chosen.values()):
        lanes = dict(chosen)
    else:
        raise AdapterConfigError(
            f"{STAGED_SETTING}.adapter must be an adapter id or map manifest providers to ids"
        )
    configured = _config()
    adapters: dict[str, Adapter] = {}
    endpoints = {}
    for provider_id, adapter_id in lanes.items():
        spec = configured.get(adapter_id)
        if spec is None or spec.get("kind") != "openai-chat":
            raise AdapterConfigError(
                f"{STAGED_SETTING}.adapter: {adapter_id!r} is not an openai-chat adapter of "
                "SLUICE_ADAPTERS; staged runs call a real endpoint"
            )
        capacity = _capacity(adapter_id, spec)
        if adapter_id not in adapters:
            adapter = _build(adapter_id, spec)
            if capacity is not None:
                # Every staged run of the deployment shares the endpoint's documented capacity.
                adapter = LeasedAdapter(adapter, deployment_slots(adapter_id, capacity.concurrency))
            adapters[adapter_id] = adapter
        endpoints[provider_id] = StagedEndpoint(
            adapter_id=adapter_id,
            adapter=adapters[adapter_id],
            model=str(staged["model"]),
            capacity=capacity,
        )
    return endpoints


class LoggedFakeAdapter(FakeAdapter):
    """A fake adapter that appends one JSON line per call to `callLog` before answering, so a
    test can count dispatches across worker processes, killed ones included."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._path = path

    async def invoke(self, call: AdapterCall) -> AdapterResponse:
        line = {
            "pid": os.getpid(),
            "decisionId": call.decision_id,
            "attempt": call.attempt,
            "atEpochMs": time.time() * 1000.0,
        }
        with open(self._path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")
        return await super().invoke(call)
