"""Rulesets: ordered decisions, each bound to a primary target and fallbacks.

Pure Python (no Django), so the load harness can build and run rulesets on its own.
"""

from __future__ import annotations

import json
import string
from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from admission.core.canonical import sha256_digest
from evaluator.engine import parsing
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.outputs import OutputSpec

__all__ = [
    "DEFAULT_MAX_PROMPT_CHARS",
    "Binding",
    "Decision",
    "RetryPolicy",
    "Ruleset",
    "Target",
    "prompt_values",
]

MAX_DECISIONS = 10_000
# The most characters one rendered prompt may hold unless the host says otherwise: about a
# 128k-token context window at four characters per token.
DEFAULT_MAX_PROMPT_CHARS = 512_000
_PLACEHOLDER = string.Template.pattern
MAX_FALLBACKS = 8
MAX_ATTEMPTS_PER_TARGET = 20
# One day: a longer per-attempt timeout is a configuration mistake, not a plan.
MAX_TIMEOUT_MS = 86_400_000
MAX_BACKOFF_MS = 3_600_000
# What a target could use to pick a credential or an endpoint. Those belong to the deployment's
# adapter configuration; a request that names one is refused, so no tenant can point the
# provider call at a secret or a server of its choosing.
DEPLOYMENT_ONLY_KEYS = (
    "apiKey",
    "apiKeyEnv",
    "baseUrl",
    "credentials",
    "endpoint",
    "headers",
    "url",
)


def prompt_values(values: Mapping[str, Any]) -> dict[str, str]:
    """Input values as prompt text: strings as they are, anything else as sorted JSON."""
    return {
        name: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        for name, value in values.items()
    }


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often one target is tried and how long to back off between tries.

    The n-th retry waits ``min(max_backoff_ms, initial_backoff_ms * 2**(n-1))``, or longer when
    the provider asked for it with ``Retry-After``.
    """

    max_attempts: int = 1
    initial_backoff_ms: float = 100.0
    max_backoff_ms: float = 2_000.0

    def __post_init__(self) -> None:
        parsing.integer(
            self.max_attempts, "maxAttempts", minimum=1, maximum=MAX_ATTEMPTS_PER_TARGET
        )
        parsing.number(
            self.initial_backoff_ms, "initialBackoffMs", minimum=0, maximum=MAX_BACKOFF_MS
        )
        parsing.number(self.max_backoff_ms, "maxBackoffMs", minimum=0, maximum=MAX_BACKOFF_MS)
        if self.initial_backoff_ms > self.max_backoff_ms:
            raise InvalidDefinitionError("initialBackoffMs", "must not exceed maxBackoffMs")

    def backoff_ms(self, retry_number: int) -> float:
        """The pause before retry ``retry_number`` (1 for the first retry)."""
        return min(self.max_backoff_ms, self.initial_backoff_ms * 2 ** (retry_number - 1))

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> RetryPolicy:
        """Parse ``{maxAttempts, initialBackoffMs, maxBackoffMs}``; all keys are optional."""
        doc = parsing.mapping(doc, where)
        parsing.known_keys(doc, ("maxAttempts", "initialBackoffMs", "maxBackoffMs"), where)
        defaults = cls()
        max_attempts = parsing.integer(
            doc.get("maxAttempts", defaults.max_attempts),
            f"{where}.maxAttempts",
            minimum=1,
            maximum=MAX_ATTEMPTS_PER_TARGET,
        )
        initial = parsing.number(
            doc.get("initialBackoffMs", defaults.initial_backoff_ms),
            f"{where}.initialBackoffMs",
            minimum=0,
            maximum=MAX_BACKOFF_MS,
        )
        ceiling = parsing.number(
            doc.get("maxBackoffMs", max(defaults.max_backoff_ms, initial)),
            f"{where}.maxBackoffMs",
            minimum=0,
            maximum=MAX_BACKOFF_MS,
        )
        if initial > ceiling:
            raise InvalidDefinitionError(
                f"{where}.initialBackoffMs", "must not exceed maxBackoffMs"
            )
        return cls(max_attempts=max_attempts, initial_backoff_ms=initial, max_backoff_ms=ceiling)

    def to_dict(self) -> dict[str, Any]:
        return {
            "maxAttempts": self.max_attempts,
            "initialBackoffMs": self.initial_backoff_ms,
            "maxBackoffMs": self.max_backoff_ms,
        }


@dataclass(frozen=True, slots=True)
class Target:
    """One place a decision can be answered: an adapter (also the admission provider id), a model,
    a per-attempt timeout and a retry policy.

    ``timeout_ms`` bounds each attempt from the moment admission is requested until the answer,
    queueing included. ``max_output_tokens`` and ``cost_per_token_usd`` feed the default estimate.
    Credentials and endpoints are the adapter's, configured by the deployment, never a target's.
    """

    adapter: str
    model: str
    timeout_ms: float = 30_000.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_output_tokens: int = 256
    cost_per_token_usd: float | None = None

    def __post_init__(self) -> None:
        parsing.identifier(self.adapter, "adapter")
        parsing.text(self.model, "model", max_length=256)
        parsing.number(self.timeout_ms, "timeoutMs", minimum=1, maximum=MAX_TIMEOUT_MS)
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidDefinitionError("retry", "must be a RetryPolicy")
        parsing.integer(self.max_output_tokens, "maxOutputTokens", minimum=0, maximum=10_000_000)
        if self.cost_per_token_usd is not None:
            parsing.number(self.cost_per_token_usd, "costPerTokenUsd", minimum=0, maximum=1_000)

    _KEYS = (
        "adapter",
        "model",
        "timeoutMs",
        "retry",
        "maxOutputTokens",
        "costPerTokenUsd",
    )

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Target:
        """Parse ``{adapter, model, timeoutMs?, retry?, maxOutputTokens?, costPerTokenUsd?}``."""
        doc = parsing.mapping(doc, where)
        for key in DEPLOYMENT_ONLY_KEYS:
            if key in doc:
                raise InvalidDefinitionError(
                    f"{where}.{key}",
                    "credentials and endpoints come from the deployment's adapter "
                    "configuration, not from a request",
                )
        parsing.known_keys(doc, cls._KEYS, where)
        adapter = parsing.identifier(parsing.required(doc, "adapter", where), f"{where}.adapter")
        model = parsing.text(
            parsing.required(doc, "model", where), f"{where}.model", max_length=256
        )
        timeout_ms = parsing.number(
            doc.get("timeoutMs", 30_000), f"{where}.timeoutMs", minimum=1, maximum=MAX_TIMEOUT_MS
        )
        retry = RetryPolicy.from_dict(doc.get("retry", {}), f"{where}.retry")
        max_output = parsing.integer(
            doc.get("maxOutputTokens", 256),
            f"{where}.maxOutputTokens",
            minimum=0,
            maximum=10_000_000,
        )
        cost = doc.get("costPerTokenUsd")
        if cost is not None:
            cost = parsing.number(cost, f"{where}.costPerTokenUsd", minimum=0, maximum=1_000)
        return cls(
            adapter=adapter,
            model=model,
            timeout_ms=timeout_ms,
            retry=retry,
            max_output_tokens=max_output,
            cost_per_token_usd=cost,
        )

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "adapter": self.adapter,
            "model": self.model,
            "timeoutMs": self.timeout_ms,
            "retry": self.retry.to_dict(),
            "maxOutputTokens": self.max_output_tokens,
        }
        if self.cost_per_token_usd is not None:
            doc["costPerTokenUsd"] = self.cost_per_token_usd
        return doc


@dataclass(frozen=True, slots=True)
class Binding:
    """The primary target of a decision and the fallbacks tried, in order, when it fails."""

    primary: Target
    fallbacks: tuple[Target, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.primary, Target):
            raise InvalidDefinitionError("primary", "must be a Target")
        object.__setattr__(self, "fallbacks", tuple(self.fallbacks))
        if len(self.fallbacks) > MAX_FALLBACKS:
            raise InvalidDefinitionError("fallbacks", f"must hold at most {MAX_FALLBACKS} targets")
        for index, target in enumerate(self.fallbacks):
            if not isinstance(target, Target):
                raise InvalidDefinitionError(f"fallbacks[{index}]", "must be a Target")

    @property
    def targets(self) -> tuple[Target, ...]:
        """Primary first, then the fallbacks."""
        return (self.primary, *self.fallbacks)

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Binding:
        """Parse ``{primary, fallbacks?}``."""
        doc = parsing.mapping(doc, where)
        parsing.known_keys(doc, ("primary", "fallbacks"), where)
        primary = Target.from_dict(parsing.required(doc, "primary", where), f"{where}.primary")
        items = parsing.sequence(
            doc.get("fallbacks", []), f"{where}.fallbacks", max_items=MAX_FALLBACKS
        )
        fallbacks = tuple(
            Target.from_dict(item, f"{where}.fallbacks[{index}]")
            for index, item in enumerate(items)
        )
        return cls(primary=primary, fallbacks=fallbacks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "primary": self.primary.to_dict(),
            "fallbacks": [target.to_dict() for target in self.fallbacks],
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """One question of a ruleset.

    ``prompt`` is a ``string.Template`` (``${name}`` placeholders filled from the request input);
    ``output`` says which answers are acceptable.
    """

    id: str
    prompt: str
    output: OutputSpec
    binding: Binding

    def __post_init__(self) -> None:
        parsing.identifier(self.id, "id")
        parsing.text(self.prompt, "prompt")
        template = string.Template(self.prompt)
        if not template.is_valid():
            raise InvalidDefinitionError("prompt", "has a malformed ${...} placeholder")

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The input fields the prompt refers to."""
        return tuple(string.Template(self.prompt).get_identifiers())

    def render(self, values: Mapping[str, Any]) -> str:
        """The prompt with its placeholders filled; non-text values are written as JSON."""
        return string.Template(self.prompt).substitute(prompt_values(values))

    def rendered_length(self, texts: Mapping[str, str]) -> int:
        """How many characters `render` writes with `texts` (from `prompt_values`), counted
        without rendering, in time linear in the prompt's length."""
        length = len(self.prompt)
        # findall returns (escaped, named, braced, invalid) per match; a valid template has
        # no invalid ones, and counting equal tuples keeps the work in C.
        for (escaped, named, braced, _), count in Counter(
            _PLACEHOLDER.findall(self.prompt)
        ).items():
            if escaped:
                length -= count  # "$$" writes "$"
            elif named:
                length += count * (len(texts.get(named, "")) - len(named) - 1)
            elif braced:
                length += count * (len(texts.get(braced, "")) - len(braced) - 3)
        return length

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Decision:
        """Parse ``{id, prompt, allowedOutputs | outputSchema, binding}``."""
        doc = parsing.mapping(doc, where)
        parsing.known_keys(
            doc, ("id", "prompt", "allowedOutputs", "outputSchema", "binding"), where
        )
        decision_id = parsing.identifier(parsing.required(doc, "id", where), f"{where}.id")
        prompt = parsing.text(parsing.required(doc, "prompt", where), f"{where}.prompt")
        if not string.Template(prompt).is_valid():
            raise InvalidDefinitionError(f"{where}.prompt", "has a malformed ${...} placeholder")
        output = OutputSpec.from_decision(doc, where)
        binding = Binding.from_dict(parsing.required(doc, "binding", where), f"{where}.binding")
        return cls(id=decision_id, prompt=prompt, output=output, binding=binding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            **self.output.to_dict(),
            "binding": self.binding.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class Ruleset:
    """An ordered list of decisions; that order is the canonical order of every result."""

    id: str
    decisions: tuple[Decision, ...]
    version: str | None = None

    def __post_init__(self) -> None:
        parsing.identifier(self.id, "id")
        if self.version is not None:
            parsing.identifier(self.version, "version")
        object.__setattr__(self, "decisions", tuple(self.decisions))
        if not 1 <= len(self.decisions) <= MAX_DECISIONS:
            raise InvalidDefinitionError("decisions", f"must hold 1 to {MAX_DECISIONS} decisions")
        seen: set[str] = set()
        for index, decision in enumerate(self.decisions):
            if not isinstance(decision, Decision):
                raise InvalidDefinitionError(f"decisions[{index}]", "must be a Decision")
            if decision.id in seen:
                raise InvalidDefinitionError(f"decisions[{index}].id", "repeats an earlier id")
            seen.add(decision.id)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "ruleset") -> Ruleset:
        """Parse ``{id, version?, decisions: [...]}``; errors name the offending where."""
        doc = parsing.mapping(doc, where)
        parsing.known_keys(doc, ("id", "version", "decisions"), where)
        ruleset_id = parsing.identifier(parsing.required(doc, "id", where), f"{where}.id")
        version = doc.get("version")
        if version is not None:
            version = parsing.identifier(version, f"{where}.version")
        items = parsing.sequence(
            parsing.required(doc, "decisions", where),
            f"{where}.decisions",
            min_items=1,
            max_items=MAX_DECISIONS,
        )
        decisions = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            decision = Decision.from_dict(item, f"{where}.decisions[{index}]")
            if decision.id in seen:
                raise InvalidDefinitionError(
                    f"{where}.decisions[{index}].id", "repeats an earlier id"
                )
            seen.add(decision.id)
            decisions.append(decision)
        return cls(id=ruleset_id, decisions=tuple(decisions), version=version)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "decisions": [d.to_dict() for d in self.decisions]}
        if self.version is not None:
            doc["version"] = self.version
        return doc

    @property
    def digest(self) -> str:
        """``sha256:`` digest of the canonical ruleset document; binds receipts to a ruleset."""
        return sha256_digest(self.to_dict())

    def adapter_ids(self) -> frozenset[str]:
        """Every adapter id named by any target of any decision."""
        return frozenset(t.adapter for d in self.decisions for t in d.binding.targets)

    def unknown_adapter_field(self, known: Container[str], where: str = "ruleset") -> str | None:
        """The path of the first target, in ruleset then binding order, naming no `known` id."""
        for index, decision in enumerate(self.decisions):
            for position, target in enumerate(decision.binding.targets):
                if target.adapter not in known:
                    slot = "primary" if position == 0 else f"fallbacks[{position - 1}]"
                    return f"{where}.decisions[{index}].binding.{slot}.adapter"
        return None

    def oversized_prompt(self, texts: Mapping[str, str], max_chars: int) -> tuple[int, int] | None:
        """The index and rendered length of the first decision whose prompt, filled with `texts`,
        would exceed `max_chars` characters; None when every prompt fits."""
        for index, decision in enumerate(self.decisions):
            length = decision.rendered_length(texts)
            if length > max_chars:
                return index, length
        return None
