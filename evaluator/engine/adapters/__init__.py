"""Adapters that answer decisions: a deterministic fake and an OpenAI-compatible HTTP client.

The HTTP adapter (and httpx with it) is imported on first use, so code that only needs the fake
adapter, like the load harness, does not pay for it.
"""

from typing import TYPE_CHECKING, Any

from evaluator.engine.adapters.base import Adapter, AdapterCall, AdapterError, AdapterResponse
from evaluator.engine.adapters.fake import FakeAdapter, FakeCall, FakeStep

if TYPE_CHECKING:
    from evaluator.engine.adapters.openai_http import (
        OpenAIChatAdapter,
        SharedClients,
        parse_retry_after_ms,
    )

__all__ = [
    "Adapter",
    "AdapterCall",
    "AdapterError",
    "AdapterResponse",
    "FakeAdapter",
    "FakeCall",
    "FakeStep",
    "OpenAIChatAdapter",
    "SharedClients",
    "parse_retry_after_ms",
]

_LAZY = frozenset({"OpenAIChatAdapter", "SharedClients", "parse_retry_after_ms"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from evaluator.engine.adapters import openai_http

        return getattr(openai_http, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
