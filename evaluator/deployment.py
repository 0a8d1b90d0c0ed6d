"""The adapters this deployment offers to evaluations, read from `SLUICE_ADAPTERS`.

`SLUICE_ADAPTERS` (a setting, else an environment variable) is a JSON object mapping adapter id
to `{"kind": "fake", "latencyMs": 20, "error": null, "callLog": null}` or
`{"kind": "openai-chat", "baseUrl": "https://...", "apiKeyEnv": "NAME"}`. The adapter id is also
the admission provider id, so it must match a provider of the workspace's profile. The default
is one fake adapter, `fake`, so the embedded demo needs no provider.

`SLUICE_WORKSPACE_ADAPTERS` (likewise) maps a workspace key to adapters of that workspace only,
in the same form; an id there replaces the deployment-wide adapter of that id for that
workspace. Endpoints and credentials come from here alone: an evaluation names an adapter id
and a model, nothing else (`evaluator.engine.rulesets.DEPLOYMENT_ONLY_KEYS`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from evaluator.engine.adapters import (
    Adapter,
    AdapterCall,
    AdapterResponse,
    FakeAdapter,
    FakeStep,
    OpenAIChatAdapter,
)
from evaluator.engine.parsing import ENV_NAME

__all__ = ["DEFAULT_ADAPTERS", "AdapterConfigError", "adapter_ids", "build_adapters"]

_WORKSPACE_SETTING = "SLUICE_WORKSPACE_ADAPTERS"

DEFAULT_ADAPTERS: Mapping[str, Mapping[str, Any]] = {"fake": {"kind": "fake", "latencyMs": 20}}


class AdapterConfigError(ValueError):
    """`SLUICE_ADAPTERS` cannot be used; names what is wrong."""


def _read(name: str, default: Any) -> Any:
    configured = getattr(settings, name, None)
    if configured is not None:
        return configured
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        return json.loads(raw)
    except ValueError as error:
        raise AdapterConfigError(f"{name} is not JSON: {error}") from None


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
        return OpenAIChatAdapter(base_url=base_url, api_key_env=key_env)
    raise AdapterConfigError(f"SLUICE_ADAPTERS.{key}.kind must be 'fake' or 'openai-chat'")


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
