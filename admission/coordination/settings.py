"""What a deployment decides about coordinated admission: where Redis is and how leases behave."""

from __future__ import annotations

from dataclasses import dataclass

from admission.coordination.clients import SCHEMES

FAIL_CLOSED = "fail-closed"
DEGRADED = "degraded"
FAILURE_MODES = (FAIL_CLOSED, DEGRADED)


@dataclass(frozen=True, slots=True)
class CoordinationSettings:
    """Settings of one process's coordinator; every process of a deployment uses the same.

    - `lease_ttl_ms`: a process that stops renewing (it died, or lost Redis) loses its permits
      and waiters this long after its last renewal; it renews every `heartbeat_ms`.
    - `recovery_grace_ms`: after Redis lost its state (a restart without persistence),
      admission waits this long so every live process puts back the permits it still holds
      (after a failover, also until each process the replica knew as live there has).
    - `timeout_ms`: the longest one round trip may take before the attempt is refused as
      `coordination-unavailable`.
    - `url`: one Redis server, or a Redis Cluster as `redis+cluster://host:port` (see
      clients.py).
    - `on_failure`: `fail-closed` refuses while Redis is unreachable; `degraded` admits locally
      under each limit divided by the number of live worker processes last seen.
    """

    url: str
    prefix: str = "sluice"
    lease_ttl_ms: int = 20_000
    heartbeat_ms: int = 1_000
    recovery_grace_ms: int = 3_000
    timeout_ms: int = 250
    idle_ttl_ms: int = 3_600_000
    budget_ttl_ms: int = 86_400_000
    on_failure: str = FAIL_CLOSED
    expected_processes: int = 1

    def __post_init__(self) -> None:
        if not self.url.startswith(SCHEMES):
            raise ValueError(
                "the admission Redis URL must start with redis://, rediss://, unix:// or (a "
                "Redis Cluster) redis+cluster:// or rediss+cluster://"
            )
        if self.on_failure not in FAILURE_MODES:
            raise ValueError(f"on_failure must be one of {', '.join(FAILURE_MODES)}")
        for name in (
            "lease_ttl_ms",
            "heartbeat_ms",
            "timeout_ms",
            "idle_ttl_ms",
            "budget_ttl_ms",
            "expected_processes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer")
        if type(self.recovery_grace_ms) is not int or self.recovery_grace_ms < 0:
            raise ValueError("recovery_grace_ms must be a non-negative integer")
        if self.heartbeat_ms * 3 > self.lease_ttl_ms:
            raise ValueError("heartbeat_ms must be at most a third of lease_ttl_ms")
        if not self.prefix or any(ch in self.prefix for ch in "{}"):
            raise ValueError("prefix must be non-empty and hold no braces")
