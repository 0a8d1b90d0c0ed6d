"""Adapters that answer decisions: a deterministic fake and an OpenAI-compatible HTTP client."""

from evaluator.engine.adapters.base import Adapter, AdapterCall, AdapterError, AdapterResponse
from evaluator.engine.adapters.fake import FakeAdapter, FakeCall, FakeStep
from evaluator.engine.adapters.openai_http import OpenAIChatAdapter, parse_retry_after_ms

__all__ = [
    "Adapter",
    "AdapterCall",
    "AdapterError",
    "AdapterResponse",
    "FakeAdapter",
    "FakeCall",
    "FakeStep",
    "OpenAIChatAdapter",
    "parse_retry_after_ms",
]
