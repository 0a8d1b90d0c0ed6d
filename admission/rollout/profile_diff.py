"""The limits of two profile documents side by side, as an approver reads them.

Pure Python (documents in, rows out): the admin renders the rows, tests read them. An optional
limit that a document leaves out is shown as what it means ("unlimited", "no breaker", "false",
the breaker default), never as a blank, and a zero limit carries a warning that says what it
shuts out, because a zero admits nothing of that kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LimitRow", "limit_rows", "limits_diff", "zero_limit_count", "zero_warning"]

NOT_CONFIGURED = "not configured"
UNLIMITED = "unlimited"

# The limit fields in the order of the profile document, with what an omitted one means.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("concurrency", UNLIMITED),
    ("requestsPerMinute", UNLIMITED),
    ("tokensPerSecond", UNLIMITED),
    ("maxAttempts", UNLIMITED),
    ("maxBatchSize", UNLIMITED),
    ("maxCostUsd", UNLIMITED),
    ("allowUnknownCost", "false"),
    ("maxTokens", UNLIMITED),
    ("maxQueueLength", UNLIMITED),
    ("maxQueueWaitMs", UNLIMITED),
    ("maxRequestBytes", UNLIMITED),
    ("maxItems", UNLIMITED),
    ("maxRetainedWork", UNLIMITED),
    ("reservedConcurrency", "none"),
    ("maxPrincipalShare", UNLIMITED),
)
_BREAKER_FIELDS: tuple[tuple[str, str], ...] = (
    ("failureThreshold", "no breaker"),
    ("openMs", "30000 (default)"),
    ("halfOpenMaxCalls", "1 (default)"),
)

# What a zero shuts out, per field; fields where zero is harmless are absent.
_ZERO_WARNINGS: Mapping[str, str] = {
    "requestsPerMinute": "0 admits nothing: every request is refused (requests-per-minute)",
    "tokensPerSecond": "0 admits no request that estimates any tokens (tokens-per-second)",
    "maxAttempts": "0 admits nothing: every attempt is over the budget (attempts)",
    "maxCostUsd": "0 admits no request that costs anything (cost)",
    "maxTokens": "0 admits no request that estimates any tokens (tokens)",
    "maxBatchSize": "0 admits no request with a batch (batch-size)",
    "maxRequestBytes": "0 admits no request with a body (request-too-large)",
    "maxItems": "0 admits no request with items (too-many-items)",
    "maxRetainedWork": "0 admits no request that retains work (retained-work)",
    "maxQueueLength": "0 lets nothing wait: whatever cannot start at once is refused (queue-full)",
    "maxQueueWaitMs": "0 lets nothing wait: a queued request times out at once (queue-timeout)",
}


@dataclass(frozen=True, slots=True)
class LimitRow:
    """One limit of one scope: its value before and after, as text, and a zero warning."""

    scope: str
    field: str
    current: str
    proposed: str
    warning: str | None

    @property
    def changed(self) -> bool:
        return self.current != self.proposed


def zero_warning(field: str, value: Any) -> str | None:
    """The warning for ``field`` set to ``value``, when that value is a zero that shuts work out."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != 0:
        return None
    return _ZERO_WARNINGS.get(field)


def _principals(section: Any) -> dict[str, Any]:
    if isinstance(section, Mapping):
        return dict(section)
    if isinstance(section, list):
        return {
            entry["id"]: entry.get("limits")
            for entry in section
            if isinstance(entry, Mapping) and isinstance(entry.get("id"), str)
        }
    return {}


def _scopes(document: Mapping[str, Any] | None) -> dict[str, Any]:
    """Scope name → limits object: ``workspace``, ``providers.ID``, ``principals.ID``."""
    if document is None:
        return {}
    scopes: dict[str, Any] = {"workspace": document.get("workspace")}
    providers = document.get("providers")
    for provider_id, limits in (providers if isinstance(providers, Mapping) else {}).items():
        scopes[f"providers.{provider_id}"] = limits
    for principal_id, limits in _principals(document.get("principals")).items():
        scopes[f"principals.{principal_id}"] = limits
    return scopes


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _values(limits: Any) -> dict[str, str]:
    """Every field of one scope as text, omitted ones as what they mean."""
    if not isinstance(limits, Mapping):
        return {}
    values = {
        field: _text(limits[field]) if field in limits else omitted for field, omitted in _FIELDS
    }
    breaker = limits.get("circuitBreaker")
    for field, omitted in _BREAKER_FIELDS:
        key = f"circuitBreaker.{field}"
        if isinstance(breaker, Mapping) and field in breaker:
            values[key] = _text(breaker[field])
        else:
            values[key] = omitted if isinstance(breaker, Mapping) else "no breaker"
    return values


def _rows(
    current: Mapping[str, Any] | None, proposed: Mapping[str, Any], *, everything: bool = True
) -> Iterator[LimitRow]:
    before, after = _scopes(current), _scopes(proposed)
    # Proposed order first, then the scopes the proposal drops.
    names = list(after) + [name for name in before if name not in after]
    for name in names:
        new_limits = after.get(name)
        # An unchanged scope shows only its zero limits: a profile's thousand principals mostly
        # stay as they were, and reading them must not cost a row each.
        if (
            not everything
            and name in before
            and before[name] == new_limits
            and not (
                isinstance(new_limits, Mapping)
                and any(zero_warning(field, value) for field, value in new_limits.items())
            )
        ):
            continue
        old, new = _values(before.get(name)), _values(new_limits)
        for field in dict.fromkeys([*new, *old]):
            raw = None
            if isinstance(new_limits, Mapping):
                raw = new_limits.get(field)
            current_text = old.get(field, NOT_CONFIGURED)
            proposed_text = new.get(field, NOT_CONFIGURED)
            warning = zero_warning(field, raw)
            if not everything and current_text == proposed_text and warning is None:
                continue
            yield LimitRow(
                scope=name,
                field=field,
                current=current_text,
                proposed=proposed_text,
                warning=warning,
            )


def limits_diff(
    current: Mapping[str, Any] | None, proposed: Mapping[str, Any], *, everything: bool = False
) -> list[LimitRow]:
    """The rows an approver must read: every changed limit and every zero limit of ``proposed``.

    ``current`` is the active version's document (None when there is none, so every limit is
    new); ``everything`` also returns the unchanged rows.
    """
    return list(limit_rows(current, proposed, everything=everything))


def limit_rows(
    current: Mapping[str, Any] | None, proposed: Mapping[str, Any], *, everything: bool = False
) -> Iterator[LimitRow]:
    """`limits_diff` one row at a time, so a page that shows the first rows computes only them."""
    return _rows(current, proposed, everything=everything)


def zero_limit_count(document: Mapping[str, Any]) -> int:
    """How many limits of `document` are a zero that shuts work out, without building rows."""
    count = 0
    for limits in _scopes(document).values():
        # Most scopes hold no zero at all: `in` scans their values in C.
        if isinstance(limits, Mapping) and 0 in limits.values():
            count += sum(zero_warning(field, value) is not None for field, value in limits.items())
    return count
