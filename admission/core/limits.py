"""Limits profiles: parsing, validation, round trip and digests.

A profile document is JSON with camelCase keys; the Python objects use snake_case. Every
validation failure raises ``InvalidProfileError`` naming the offending field. Digests are taken
over the limits exactly as the document wrote them, so one document has one digest everywhere.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

from admission.core.canonical import sha256_digest
from admission.core.errors import InvalidProfileError
from admission.core.labels import label_problem

__all__ = ["BreakerConfig", "Limits", "Profile", "Scope"]

Scope = Literal["workspace", "provider", "principal"]

# Beyond 2**53 - 1 a JSON integer has no exact JavaScript value, so its digest would be ambiguous.
_MAX_SAFE_INTEGER = 2**53 - 1
# Extra keys of principal entries are copied; a bound on nesting keeps the copy from recursing away.
_MAX_EXTRA_DEPTH = 64

_COUNT = "count"
_POSITIVE_COUNT = "positive count"
_AMOUNT = "amount"
_SHARE = "share"
_FLAG = "flag"
_BREAKER = "breaker"

# (JSON key, attribute, kind) in the order profile documents list them.
_LIMIT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("concurrency", "concurrency", _POSITIVE_COUNT),
    ("requestsPerMinute", "requests_per_minute", _AMOUNT),
    ("tokensPerSecond", "tokens_per_second", _AMOUNT),
    ("maxAttempts", "max_attempts", _COUNT),
    ("maxBatchSize", "max_batch_size", _COUNT),
    ("maxCostUsd", "max_cost_usd", _AMOUNT),
    ("allowUnknownCost", "allow_unknown_cost", _FLAG),
    ("maxTokens", "max_tokens", _COUNT),
    ("maxQueueLength", "max_queue_length", _COUNT),
    ("maxQueueWaitMs", "max_queue_wait_ms", _AMOUNT),
    ("maxRequestBytes", "max_request_bytes", _COUNT),
    ("maxItems", "max_items", _COUNT),
    ("maxRetainedWork", "max_retained_work", _COUNT),
    ("circuitBreaker", "circuit_breaker", _BREAKER),
    ("reservedConcurrency", "reserved_concurrency", _COUNT),
    ("maxPrincipalShare", "max_principal_share", _SHARE),
)
_LIMIT_KEYS = {key: (attr, kind) for key, attr, kind in _LIMIT_FIELDS}

_BREAKER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("failureThreshold", "failure_threshold", _POSITIVE_COUNT),
    ("openMs", "open_ms", _AMOUNT),
    ("halfOpenMaxCalls", "half_open_max_calls", _POSITIVE_COUNT),
)
_BREAKER_KEYS = {key: (attr, kind) for key, attr, kind in _BREAKER_FIELDS}

# Keys that each scope refuses, with the scopes that do allow them.
_SCOPE_FORBIDDEN: dict[str, dict[str, str]] = {
    "workspace": {
        "reservedConcurrency": "principal limits",
        "circuitBreaker": "provider limits",
    },
    "provider": {"reservedConcurrency": "principal limits"},
    "principal": {
        "maxPrincipalShare": "workspace and provider limits",
        "circuitBreaker": "provider limits",
    },
}

_PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def _label(key: Any) -> str:
    if isinstance(key, str) and key and len(key) <= 64 and key.isprintable():
        return key
    return reprlib.repr(key)


def _join(path: str, key: Any) -> str:
    return f"{path}.{_label(key)}" if path else _label(key)


def _check_number(value: Any, where: str, wanted: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidProfileError(where, f"must be {wanted}, got {_kind_of(value)}")
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            raise InvalidProfileError(where, f"must be {wanted} of finite size") from None
        return int(value)
    if not math.isfinite(value):
        raise InvalidProfileError(where, f"must be finite, got {value!r}")
    return float(value)


def _check_count(value: Any, where: str, minimum: int) -> int:
    number = _check_number(value, where, "an integer")
    if isinstance(number, float):
        if not number.is_integer():
            raise InvalidProfileError(where, f"must be an integer, got {number!r}")
        number = int(number)
    if number < minimum:
        raise InvalidProfileError(where, f"must be at least {minimum}, got {number}")
    if number > _MAX_SAFE_INTEGER:
        raise InvalidProfileError(where, f"must be at most {_MAX_SAFE_INTEGER}")
    return number


def _check_amount(value: Any, where: str) -> int | float:
    number = _check_number(value, where, "a number")
    if number < 0:
        raise InvalidProfileError(where, f"must not be negative, got {number!r}")
    return number


def _check_share(value: Any, where: str) -> int | float:
    number = _check_number(value, where, "a number")
    if not 0 < number <= 1:
        raise InvalidProfileError(where, f"must be in (0, 1], got {number!r}")
    return number


def _check_flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidProfileError(where, f"must be true or false, got {_kind_of(value)}")
    return value


def _check_value(kind: str, value: Any, where: str) -> Any:
    if kind == _POSITIVE_COUNT:
        return _check_count(value, where, 1)
    if kind == _COUNT:
        return _check_count(value, where, 0)
    if kind == _AMOUNT:
        return _check_amount(value, where)
    if kind == _SHARE:
        return _check_share(value, where)
    if kind == _FLAG:
        return _check_flag(value, where)
    if kind == _BREAKER:
        if not isinstance(value, BreakerConfig):
            raise InvalidProfileError(where, f"must be a BreakerConfig, got {_kind_of(value)}")
        return value
    raise AssertionError(kind)


def _check_id(value: Any, where: str, what: str) -> str:
    problem = label_problem(value)
    if problem is not None:
        raise InvalidProfileError(where, f"{what} {problem}")
    return value


def _require_mapping(doc: Any, where: str) -> Mapping[Any, Any]:
    if not isinstance(doc, Mapping):
        raise InvalidProfileError(where, f"must be an object, got {_kind_of(doc)}")
    return doc


def _copy_json(value: Any, where: str, depth: int = 0) -> Any:
    if depth > _MAX_EXTRA_DEPTH:
        raise InvalidProfileError(where, f"is nested deeper than {_MAX_EXTRA_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        _check_number(value, where, "a number")
        return value
    if isinstance(value, Mapping):
        copied = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidProfileError(where, "object keys must be strings")
            copied[key] = _copy_json(item, where, depth + 1)
        return copied
    if isinstance(value, list | tuple):
        return [_copy_json(item, where, depth + 1) for item in value]
    raise InvalidProfileError(where, f"must be a JSON value, got {_kind_of(value)}")


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Circuit breaker of a provider lane: opens after ``failure_threshold`` consecutive failures
    for ``open_ms``, then lets ``half_open_max_calls`` probes through."""

    failure_threshold: int
    open_ms: float = 30000
    half_open_max_calls: int = 1
    _written: frozenset[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for key, attr, kind in _BREAKER_FIELDS:
            object.__setattr__(self, attr, _check_value(kind, getattr(self, attr), key))
        written = {"failureThreshold"}
        given = self._written or frozenset()
        if "openMs" in given or self.open_ms != 30000:
            written.add("openMs")
        if "halfOpenMaxCalls" in given or self.half_open_max_calls != 1:
            written.add("halfOpenMaxCalls")
        object.__setattr__(self, "_written", frozenset(written))

    @classmethod
    def from_dict(cls, doc: Any, *, path: str = "circuitBreaker") -> BreakerConfig:
        """Parse a ``circuitBreaker`` object; ``path`` prefixes field names in errors."""
        doc = _require_mapping(doc, path)
        values: dict[str, Any] = {}
        for key, value in doc.items():
            spec = _BREAKER_KEYS.get(key) if isinstance(key, str) else None
            if spec is None:
                raise InvalidProfileError(_join(path, key), "unknown key")
            attr, kind = spec
            values[attr] = _check_value(kind, value, _join(path, key))
        if "failure_threshold" not in values:
            raise InvalidProfileError(_join(path, "failureThreshold"), "is required")
        return cls(**values, _written=frozenset(doc.keys()))

    def to_dict(self) -> dict[str, Any]:
        """The ``circuitBreaker`` JSON object, with the keys the document wrote."""
        written = self._written or frozenset()
        return {key: getattr(self, attr) for key, attr, _ in _BREAKER_FIELDS if key in written}


@dataclass(frozen=True, slots=True)
class Limits:
    """The ceilings of one scope (workspace, provider or principal). ``None`` means unlimited."""

    concurrency: int
    requests_per_minute: float | None = None
    tokens_per_second: float | None = None
    max_attempts: int | None = None
    max_batch_size: int | None = None
    max_cost_usd: float | None = None
    allow_unknown_cost: bool = False
    max_tokens: int | None = None
    max_queue_length: int | None = None
    max_queue_wait_ms: float | None = None
    max_request_bytes: int | None = None
    max_items: int | None = None
    max_retained_work: int | None = None
    circuit_breaker: BreakerConfig | None = None
    reserved_concurrency: int | None = None
    max_principal_share: float | None = None
    _written: frozenset[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        written = set()
        for key, attr, kind in _LIMIT_FIELDS:
            value = getattr(self, attr)
            if value is None:
                continue
            object.__setattr__(self, attr, _check_value(kind, value, key))
            if kind != _FLAG:
                written.add(key)
        _check_reservation(self.concurrency, self.reserved_concurrency, "reservedConcurrency")
        # allowUnknownCost: false is written only when the document said so.
        if self.allow_unknown_cost or "allowUnknownCost" in (self._written or frozenset()):
            written.add("allowUnknownCost")
        object.__setattr__(self, "_written", frozenset(written))

    @classmethod
    def from_dict(cls, doc: Any, *, scope: Scope, path: str) -> Limits:
        """Parse one limits object of the given scope; ``path`` (e.g. ``providers.jev``)
        prefixes the field names in errors."""
        forbidden = _SCOPE_FORBIDDEN.get(scope)
        if forbidden is None:
            raise ValueError(f"unknown limits scope {scope!r}")
        doc = _require_mapping(doc, path)
        values: dict[str, Any] = {}
        for key, value in doc.items():
            where = _join(path, key)
            spec = _LIMIT_KEYS.get(key) if isinstance(key, str) else None
            if spec is None:
                raise InvalidProfileError(where, "unknown key")
            if key in forbidden:
                raise InvalidProfileError(where, f"is allowed only on {forbidden[key]}")
            attr, kind = spec
            if kind == _BREAKER:
                values[attr] = BreakerConfig.from_dict(value, path=where)
            else:
                values[attr] = _check_value(kind, value, where)
        if "concurrency" not in values:
            raise InvalidProfileError(_join(path, "concurrency"), "is required")
        _check_reservation(
            values["concurrency"],
            values.get("reserved_concurrency"),
            _join(path, "reservedConcurrency"),
        )
        return cls(**values, _written=frozenset(doc.keys()))

    def to_dict(self) -> dict[str, Any]:
        """The JSON limits object, with the optional keys the document wrote."""
        written = self._written or frozenset()
        doc: dict[str, Any] = {}
        for key, attr, kind in _LIMIT_FIELDS:
            if key not in written:
                continue
            value = getattr(self, attr)
            doc[key] = value.to_dict() if kind == _BREAKER else value
        return doc


def _check_reservation(concurrency: int, reserved: int | None, where: str) -> None:
    if reserved is not None and reserved > concurrency:
        raise InvalidProfileError(
            where, f"{reserved} is above this principal's concurrency {concurrency}"
        )


@dataclass(frozen=True)
class Profile:
    """One approved, immutable limits document of a workspace.

    ``providers`` and ``principals`` are read-only mappings from id to ``Limits``. ``digest``
    covers workspace and provider limits; ``profile_digest`` also covers principal limits.
    """

    workspace_id: str
    profile_version: str
    workspace: Limits
    providers: Mapping[str, Limits]
    principals: Mapping[str, Limits]
    # The principal entries of a list-form document, for writing it back as written.
    _principal_entries: tuple[tuple[tuple[str, Any], ...], ...] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        _check_id(self.workspace_id, "workspaceId", "workspace id")
        _check_id(self.profile_version, "profileVersion", "profile version")
        if not isinstance(self.workspace, Limits):
            raise InvalidProfileError("workspace", "must be a Limits")
        object.__setattr__(self, "providers", _limits_table(self.providers, "providers"))
        object.__setattr__(self, "principals", _limits_table(self.principals, "principals"))
        _check_scope(self.workspace, "workspace", "workspace")
        for provider_id, limits in self.providers.items():
            _check_scope(limits, "provider", f"providers.{_label(provider_id)}")
        for principal_id, limits in self.principals.items():
            _check_scope(limits, "principal", f"principals.{_label(principal_id)}")
        self._check_reserved_total()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Read-only mapping proxies do not pickle; rebuild them from plain dicts instead.
        return (
            type(self),
            (
                self.workspace_id,
                self.profile_version,
                self.workspace,
                dict(self.providers),
                dict(self.principals),
                self._principal_entries,
            ),
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.workspace_id,
                self.profile_version,
                self.workspace,
                frozenset(self.providers.items()),
                frozenset(self.principals.items()),
            )
        )

    def _check_reserved_total(self) -> None:
        total = sum(limits.reserved_concurrency or 0 for limits in self.principals.values())
        if not total:
            return
        pools = [("workspace.concurrency", self.workspace.concurrency)]
        pools += [
            (f"providers.{_label(provider_id)}.concurrency", limits.concurrency)
            for provider_id, limits in self.providers.items()
        ]
        for pool, concurrency in pools:
            if total > concurrency:
                raise InvalidProfileError(
                    "principals",
                    f"reservedConcurrency sums to {total}, above {pool} {concurrency}",
                )

    @classmethod
    def from_dict(cls, doc: Any, *, workspace_id: str) -> Profile:
        """Parse a profile document with exactly the keys ``profileVersion``, ``workspace``,
        ``providers`` and ``principals`` (a list of ``{id, limits, ...}`` or a mapping
        id → limits). Raises ``InvalidProfileError`` naming the offending field."""
        _check_id(workspace_id, "workspaceId", "workspace id")
        doc = _require_mapping(doc, "profile")
        for key in doc:
            if key not in _PROFILE_KEYS:
                raise InvalidProfileError(_label(key), "unknown key")
        for key in _PROFILE_KEYS:
            if key not in doc:
                raise InvalidProfileError(key, "is required")
        profile_version = _check_id(doc["profileVersion"], "profileVersion", "profile version")
        workspace = Limits.from_dict(doc["workspace"], scope="workspace", path="workspace")
        providers = {}
        for provider_id, limits_doc in _require_mapping(doc["providers"], "providers").items():
            where = _join("providers", provider_id)
            _check_id(provider_id, where, "provider id")
            providers[provider_id] = Limits.from_dict(limits_doc, scope="provider", path=where)
        principals, entries = _parse_principals(doc["principals"])
        return cls(
            workspace_id=workspace_id,
            profile_version=profile_version,
            workspace=workspace,
            providers=providers,
            principals=principals,
            _principal_entries=entries,
        )

    @classmethod
    def from_manifest(cls, manifest: Any, *, workspace_id: str) -> Profile:
        """Take the profile out of a load manifest, ignoring the manifest's other keys."""
        manifest = _require_mapping(manifest, "manifest")
        doc = {key: manifest[key] for key in _PROFILE_KEYS if key in manifest}
        return cls.from_dict(doc, workspace_id=workspace_id)

    def to_dict(self) -> dict[str, Any]:
        """The profile document, with principals in the form they were written in."""
        principals: Any
        if self._principal_entries is None:
            principals = {pid: limits.to_dict() for pid, limits in self.principals.items()}
        else:
            principals = [self._entry_to_dict(entry) for entry in self._principal_entries]
        return {
            "profileVersion": self.profile_version,
            "workspace": self.workspace.to_dict(),
            "providers": {pid: limits.to_dict() for pid, limits in self.providers.items()},
            "principals": principals,
        }

    def _entry_to_dict(self, entry: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
        principal_id = dict(entry)["id"]
        doc: dict[str, Any] = {}
        for key, value in entry:
            if key == "limits":
                doc[key] = self.principals[principal_id].to_dict()
            else:
                doc[key] = _copy_json(value, key)
        return doc

    @cached_property
    def digest(self) -> str:
        """``sha256:`` digest of the workspace and provider limits as written."""
        return sha256_digest(
            {
                "workspace": self.workspace.to_dict(),
                "providers": {pid: limits.to_dict() for pid, limits in self.providers.items()},
            }
        )

    @cached_property
    def profile_digest(self) -> str:
        """``sha256:`` digest of workspace, provider and principal limits as written."""
        return sha256_digest(
            {
                "workspace": self.workspace.to_dict(),
                "providers": {pid: limits.to_dict() for pid, limits in self.providers.items()},
                "principals": {pid: limits.to_dict() for pid, limits in self.principals.items()},
            }
        )

    def principal(self, principal_id: str) -> Limits | None:
        """The limits of ``principal_id``, or ``None`` when the profile does not configure it."""
        return self.principals.get(principal_id)

    def provider(self, provider_id: str) -> Limits | None:
        """The limits of ``provider_id``, or ``None`` when the profile does not configure it."""
        return self.providers.get(provider_id)


def _limits_table(table: Any, where: str) -> Mapping[str, Limits]:
    table = _require_mapping(table, where)
    copied: dict[str, Limits] = {}
    for key, limits in table.items():
        at = _join(where, key)
        _check_id(key, at, "id")
        if not isinstance(limits, Limits):
            raise InvalidProfileError(at, f"must be a Limits, got {_kind_of(limits)}")
        copied[key] = limits
    return MappingProxyType(copied)


def _check_scope(limits: Limits, scope: str, path: str) -> None:
    written = limits.to_dict()
    for key, allowed_on in _SCOPE_FORBIDDEN[scope].items():
        if key in written:
            raise InvalidProfileError(f"{path}.{key}", f"is allowed only on {allowed_on}")


def _parse_principals(
    doc: Any,
) -> tuple[dict[str, Limits], tuple[tuple[tuple[str, Any], ...], ...] | None]:
    if isinstance(doc, Mapping):
        principals = {}
        for principal_id, limits_doc in doc.items():
            where = _join("principals", principal_id)
            _check_id(principal_id, where, "principal id")
            principals[principal_id] = Limits.from_dict(limits_doc, scope="principal", path=where)
        return principals, None
    if not isinstance(doc, list | tuple):
        raise InvalidProfileError(
            "principals", f"must be an array or an object, got {_kind_of(doc)}"
        )
    principals = {}
    entries = []
    for index, entry in enumerate(doc):
        where = f"principals[{index}]"
        entry = _require_mapping(entry, where)
        for key in ("id", "limits"):
            if key not in entry:
                raise InvalidProfileError(f"{where}.{key}", "is required")
        principal_id = _check_id(entry["id"], f"{where}.id", "principal id")
        if principal_id in principals:
            raise InvalidProfileError(f"{where}.id", f"duplicate principal id {principal_id!r}")
        principals[principal_id] = Limits.from_dict(
            entry["limits"], scope="principal", path=f"{where}.limits"
        )
        kept = []
        for key, value in entry.items():
            if not isinstance(key, str):
                raise InvalidProfileError(_join(where, key), "keys must be strings")
            if key in ("id", "limits"):
                kept.append((key, value if key == "id" else None))
            else:
                kept.append((key, _copy_json(value, f"{where}.{_label(key)}")))
        entries.append(tuple(kept))
    return principals, tuple(entries)
