"""Coordinated admission against a real Redis: several coordinators play several processes.

Each coordinator has its own registry, as a separate process would; they share one Redis under a
key prefix of the test's own. Tests that stop Redis use a private `redis-server` they start.
The `deployment` fixture runs each test twice: on one Redis server, and on a Redis Cluster of
three primaries with a replica each that the tests start on loopback (once per session).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.coordination.clients import SyncClient, sync_client
from admission.coordination.protocol import parse_scope
from admission.coordination.scripts import library_code
from admission.core import AdmissionRegistry, AdmissionRequest, Estimate, Profile
from tests.private_services import PrivateRedis, PrivateRedisCluster

WORKSPACE = "ws-1"
SHARED_REDIS = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/8")


def profile(
    version: str = "v1",
    *,
    workspace: dict[str, Any] | None = None,
    providers: dict[str, dict[str, Any]] | None = None,
    principals: dict[str, dict[str, Any]] | None = None,
) -> Profile:
    document = {
        "profileVersion": version,
        "workspace": workspace if workspace is not None else {"concurrency": 100},
        "providers": providers if providers is not None else {"llm": {"concurrency": 100}},
        "principals": principals
        if principals is not None
        else {"alice": {"concurrency": 100}, "bob": {"concurrency": 100}},
    }
    return Profile.from_dict(document, workspace_id=WORKSPACE)


def request(
    principal: str = "alice",
    provider: str = "llm",
    budget: str = "inv-1",
    *,
    deadline_ms: float | None = None,
    signal: Any = None,
    **estimate: Any,
) -> AdmissionRequest:
    return AdmissionRequest(
        budget_id=budget,
        principal_id=principal,
        workspace_id=WORKSPACE,
        provider_id=provider,
        estimate=Estimate(**estimate),
        deadline_ms=deadline_ms,
        signal=signal,
    )


def _reachable(url: str) -> bool:
    try:
        return bool(sync_client(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


@dataclass
class Process:
    """One simulated worker process: a coordinator and the registry it feeds."""

    coordinator: RedisCoordinator
    registry: AdmissionRegistry

    def controller(self, workspace: str = WORKSPACE) -> Any:
        controller = self.registry.controller(workspace)
        assert controller is not None
        return controller


def leases_in(state: Mapping[Any, Any]) -> dict[str, Any]:
    """The leases among the fields of a workspace's state hash (`L<lease id>` -> the lease), by
    lease id; scope fields never begin with L."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        text = name.decode() if isinstance(name, bytes) else str(name)
        if text.startswith("L"):
            out[text[1:]] = value
    return out


@dataclass
class Deployment:
    """Coordinators sharing one Redis under one prefix, and a plain client to look inside."""

    url: str
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")
    processes: list[Process] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    sequence: int = 0
    _client: SyncClient | None = None

    @property
    def client(self) -> Any:
        """A plain client to look inside (a cluster client on a cluster)."""
        if self._client is None:
            self._client = sync_client(self.url, decode_responses=True)
        return self._client

    def process(self, *, register: Profile | None = None, **overrides: Any) -> Process:
        # A round trip may take up to two seconds: a loaded CI machine stalls a process (or a
        # node of the test cluster) for hundreds of milliseconds, and a shorter budget refuses
        # decisions as coordination-unavailable. A lease of three seconds gives a grant 1.5 s to
        # be taken (half the lease) before it lapses back to the pool and its waiter queues
        # again at the back, which would reorder the lanes the fairness tests check.
        options = {
            "lease_ttl_ms": 3_000,
            "heartbeat_ms": 100,
            "recovery_grace_ms": 0,
            "timeout_ms": 2_000,
            **self.settings,
            **overrides,
        }
        coordinator = RedisCoordinator(
            CoordinationSettings(url=self.url, prefix=self.prefix, **options)
        )
        registry = AdmissionRegistry(controller_factory=coordinator.controller)
        process = Process(coordinator, registry)
        self.processes.append(process)
        if register is not None:
            self.register(register, process)
        return process

    def register(self, profile: Profile, *processes: Process) -> None:
        """Activate `profile` (the next ledger position) in the given processes (default all)."""
        self.sequence += 1
        for process in processes or tuple(self.processes):
            process.registry.register(profile, sequence=self.sequence)

    def key(self, suffix: str, workspace: str = WORKSPACE) -> str:
        return f"{self.prefix}:{{{workspace}}}:{suffix}"

    def leases(self, workspace: str = WORKSPACE) -> dict[str, dict[str, Any]]:
        """The workspace's leases as stored, by lease id."""
        stored = leases_in(self.client.hgetall(self.key("s", workspace)))
        return {lease_id: json.loads(text) for lease_id, text in stored.items()}

    def lose_epoch(self, workspace: str = WORKSPACE) -> None:
        """What a promoted replica or a Redis restarted from its AOF lacks: the workspace's
        epoch (its `e:` fields of the profile hash, never replicated)."""
        key = self.key("prof", workspace)
        fields = [f for f in self.client.hkeys(key) if str(f).startswith("e:")]
        assert fields, "the workspace has no epoch to lose"
        self.client.hdel(key, *fields)

    def scope(self, suffix: str) -> dict[str, str]:
        """One scope's stored state (`P`, `W`, `V:<provider>`, `X:<len>:<provider><principal>`),
        as field -> value."""
        return parse_scope(self.client.hget(self.key("s"), suffix))

    def scopes(self) -> dict[str, dict[str, str]]:
        """Every stored scope of the workspace (the state hash's fields but its leases)."""
        return {
            name: parse_scope(raw)
            for name, raw in self.client.hgetall(self.key("s")).items()
            if not name.startswith("L")
        }

    def active(self, suffix: str) -> int:
        return int(self.scope(suffix).get("a", 0))

    def queued(self, suffix: str) -> int:
        return int(self.scope(suffix).get("q", 0))

    def stored_keys(self) -> list[str]:
        return sorted(self.client.scan_iter(f"{self.prefix}:*", count=1000))

    async def close(self) -> None:
        for process in self.processes:
            await process.coordinator.aclose()

    def cleanup(self) -> None:
        client = self.client
        for key in client.scan_iter(f"{self.prefix}:*", count=1000):
            client.delete(key)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[PrivateRedisCluster]:
    """A Redis Cluster of three primaries with one replica each, on free loopback ports, shared
    by the session's tests (each under a key prefix of its own)."""
    # A node frozen by a test for a second or two is not failed over.
    cluster = PrivateRedisCluster(node_timeout_ms=5000)
    try:
        # The function library is loaded on every primary once, as the deployment's first call
        # does (compiling it on three busy primaries could outlast a test's short timeout);
        # test_failover.py checks that a primary without it gets it again by itself.
        client = sync_client(cluster.url, socket_timeout=30)
        client.function_load(library_code(), replace=True)
        client.close()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(params=["redis", "cluster"])
def shared_url(request: pytest.FixtureRequest) -> str:
    """The shared Redis server, or the session's Redis Cluster (`redis+cluster://`)."""
    if request.param == "cluster":
        cluster: PrivateRedisCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    if not _reachable(SHARED_REDIS):
        pytest.skip(f"coordinated admission needs Redis at {SHARED_REDIS}")
    return SHARED_REDIS


@pytest.fixture
def deployment(shared_url: str) -> Iterator[Deployment]:
    deployment = Deployment(shared_url)
    try:
        yield deployment
    finally:
        deployment.cleanup()


def run(deployment: Deployment, scenario: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    """Run a scenario on a fresh loop and close every coordinator on it afterwards."""

    async def main() -> Any:
        try:
            return await asyncio.wait_for(scenario(), timeout)
        finally:
            await deployment.close()

    return asyncio.run(main())


async def settle(deployment: Deployment) -> None:
    for process in deployment.processes:
        await process.coordinator.settle()


async def until(condition: Callable[[], bool], timeout: float = 5.0, step: float = 0.01) -> None:
    """Wait for an observable condition (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(step)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A Redis of the test's own, which the test may stop and start again."""
    server = PrivateRedis()
    try:
        yield server
    finally:
        server.destroy()
