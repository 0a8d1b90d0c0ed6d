"""Counted state of one admission scope: permits, queue, buckets, budgets, pause and breaker."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from admission.core.rotation import Rotation
from admission.core.rules import EPSILON, Gate, has_budgets

if TYPE_CHECKING:
    from admission.core.limits import BreakerConfig, Limits


class TokenBucket:
    """A lazily refilled bucket; capacity and rate come from the scope's current limits."""

    __slots__ = ("capacity", "holder", "level", "parked", "rate_per_ms", "updated_ms")

    def __init__(self, capacity: float, rate_per_ms: float, now_ms: float) -> None:
        self.capacity = capacity
        self.rate_per_ms = rate_per_ms
        self.level = capacity
        self.updated_ms = now_ms
        # The waiter holding this bucket's large-token reservation, if any.
        self.holder: object | None = None
        # Lanes waiting for the holder to resolve before their estimate can ever fit.
        self.parked: Rotation[Any] = Rotation()

    def refill(self, now_ms: float) -> float:
        elapsed = now_ms - self.updated_ms
        if elapsed > 0:
            level = self.level + elapsed * self.rate_per_ms
            self.level = level if level < self.capacity else self.capacity
            self.updated_ms = now_ms
        return self.level

    def reconfigure(self, capacity: float, rate_per_ms: float, now_ms: float) -> None:
        self.refill(now_ms)
        self.capacity = capacity
        self.rate_per_ms = rate_per_ms
        if self.level > capacity:
            self.level = capacity

    def ms_until(self, amount: float, now_ms: float) -> float:
        """Milliseconds until `amount` is available, or inf when the refill can never reach it."""
        missing = amount - self.refill(now_ms)
        if missing <= EPSILON:
            return 0.0
        if amount > self.capacity + EPSILON or self.rate_per_ms <= 0:
            return math.inf
        return missing / self.rate_per_ms

    def is_full(self, now_ms: float) -> bool:
        return self.refill(now_ms) >= self.capacity - EPSILON


class Breaker:
    """Closed / open / half-open state of one provider lane."""

    __slots__ = ("failures", "generation", "opened_ms", "probes", "state")

    def __init__(self) -> None:
        self.state = "closed"
        self.failures = 0
        self.generation = 0
        self.opened_ms = 0.0
        self.probes = 0


class Budget:
    """What one invocation (budget id) has used in one scope."""

    __slots__ = ("attempts", "cost", "tokens")

    def __init__(self) -> None:
        self.attempts = 0
        self.cost = 0.0
        self.tokens = 0


class Scope:
    """Counters of a principal, the workspace or a provider inside one controller."""

    __slots__ = (
        "active",
        "breaker",
        "breaker_config",
        "budgets",
        "configured",
        "has_budgets",
        "key",
        "kind",
        "limits",
        "pairs",
        "parked",
        "pause_until_ms",
        "pressure",
        "queued",
        "repeats",
        "req_bucket",
        "reserved",
        "tok_bucket",
        "unused_reserved",
    )

    def __init__(self, kind: str, key: str, limits: Limits, now_ms: float) -> None:
        self.kind = kind
        self.key = key
        self.active = 0
        self.queued = 0
        self.budgets: dict[str, Budget] = {}
        # Lanes deferred because this scope had no free permit, woken when one is released.
        self.parked: Rotation[Any] = Rotation()
        self.req_bucket: TokenBucket | None = None
        self.tok_bucket: TokenBucket | None = None
        self.pause_until_ms = -math.inf
        self.breaker: Breaker | None = None
        self.breaker_config: BreakerConfig | None = None
        # Provider scopes: per-principal counters in this pool and recent retry-pressure events.
        self.pairs: dict[str, Pair] = {}
        self.pressure: deque[float] = deque()
        self.repeats: dict[str, int] = {}
        # Principal scopes: the reservation; pools: reservations of others not in use.
        self.reserved = 0
        self.unused_reserved = 0
        self.limits = limits
        self.has_budgets = False
        # False once a newer profile no longer names this scope; its counters live on.
        self.configured = True
        self.apply(limits, now_ms)

    def apply(self, limits: Limits, now_ms: float) -> None:
        self.limits = limits
        self.configured = True
        self.has_budgets = has_budgets(limits)
        rpm = limits.requests_per_minute
        if rpm is None:
            self.req_bucket = None
        elif self.req_bucket is None:
            self.req_bucket = TokenBucket(rpm, rpm / 60_000.0, now_ms)
        else:
            self.req_bucket.reconfigure(rpm, rpm / 60_000.0, now_ms)
        tps = limits.tokens_per_second
        if tps is None:
            self.tok_bucket = None
        elif self.tok_bucket is None:
            self.tok_bucket = TokenBucket(tps, tps / 1000.0, now_ms)
        else:
            self.tok_bucket.reconfigure(tps, tps / 1000.0, now_ms)
        if self.kind == "principal":
            self.reserved = limits.reserved_concurrency or 0
        if self.kind == "provider":
            self.breaker_config = limits.circuit_breaker
            if self.breaker_config is not None and self.breaker is None:
                self.breaker = Breaker()

    def pair(self, principal_id: str) -> Pair:
        pair = self.pairs.get(principal_id)
        if pair is None:
            pair = self.pairs[principal_id] = Pair()
        return pair

    def is_idle(self, now_ms: float) -> bool:
        """Nothing here would change an admission outcome if the scope were forgotten."""
        if self.active or self.queued or self.budgets or self.parked:
            return False
        if self.pause_until_ms > now_ms or self.repeats:
            return False
        breaker = self.breaker
        if breaker is not None and (breaker.state != "closed" or breaker.failures):
            return False
        for bucket in (self.req_bucket, self.tok_bucket):
            if bucket is not None and (bucket.holder is not None or not bucket.is_full(now_ms)):
                return False
        return not any(pair.active or pair.queued for pair in self.pairs.values())


class Pair:
    """A principal's permits and waiters inside one provider pool."""

    __slots__ = ("active", "gate", "gate_epoch", "parked", "queued", "served")

    def __init__(self) -> None:
        self.active = 0
        self.queued = 0
        # The controller's admission stamp of this pair's latest admission (0: never admitted).
        self.served = 0
        # The lane's static rules (`rules.compile_gate`), compiled once per profile.
        self.gate: Gate = ()
        self.gate_epoch = -1
        # Lanes deferred on this principal's share cap in the provider pool.
        self.parked: Rotation[Any] = Rotation()
