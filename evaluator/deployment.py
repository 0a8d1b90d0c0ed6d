"""The adapters this deployment offers to evaluations, read from `SLUICE_ADAPTERS`.

`SLUICE_ADAPTERS` (a setting, else an environment variable) is a JSON object mapping adapter id
to `{"kind": "fake", "latencyMs": 20, "error": null, "callLog": null}` or
`{"kind": "openai-chat", "baseUrl": "https://...", "apiKeyEnv": "NAME"}`. The adapter id is also
the admission provider id, so it must match a provider of the workspace's profile. The default
is one fake adapter, `fake`, so the embedded demo needs no provider.
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

__all__ = ["DEFAULT_ADAPTERS", "AdapterConfigError", "adapter_ids", "build_adapters"]

DEFAULT_ADAPTERS: Mapping[str, Mapping[str, Any]] = {"fake": {"kind": "fake", "latencyMs": 20}}


class AdapterConfigError(ValueError):
    """`SLUICE_ADAPTERS` cannot be used; names what is wrong."""


def _config() -> Mapping[str, Mapping[str, Any]]:
    configured = getattr(settings, "SLUICE_ADAPTERS", None)
    if configured is None:
        raw = os.environ.get("SLUICE_ADAPTERS", "")
        if not raw:
            return DEFAULT_ADAPTERS
        try:
            configured = json.loads(raw)
        except ValueError as error:
            raise AdapterConfigError(f"SLUICE_ADAPTERS is not JSON: {error}") from None
    if not isinstance(configured, Mapping) or not all(
        isinstance(key, str) and isinstance(value, Mapping) for key, value in configured.items()
    ):
        raise AdapterConfigError("SLUICE_ADAPTERS must map adapter ids to objects")
    return configured


def adapter_ids() -> frozenset[str]:
    """The ids an evaluation may name."""
    return frozenset(_config())


def build_adapters() -> dict[str, Adapter]:
    """Fresh adapters for one run (a fake adapter keeps a call log that must not grow forever)."""
    return {key: _build(key, spec) for key, spec in _config().items()}


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
        return OpenAIChatAdapter(base_url=base_url, api_key_env=spec.get("apiKeyEnv"))
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
