"""Deployment-wide admission on a Redis Cluster (`benchmarks/coordination.py --cluster`).

    python benchmarks/coordination.py --cluster [--redis redis+cluster://HOST:PORT] [--seconds 5]

Without a cluster URL it starts a cluster of its own on loopback (three primaries with a replica
each, as the tests do). Prints:
- nodes touched per decision: decisions (acquire, then release) in one workspace one at a time,
  each between two readings of every primary's command statistics (FCALL calls);
- decisions per second with 3 processes x `callers` callers, first all in one workspace (one
  shard), then spread over three workspaces whose slots three different primaries serve, with
  each primary's share of the calls and Redis time per decision (INFO commandstats), from which
  decisions per second per Redis core follow; and the same load on one Redis server of its own
  (no cluster), in the same run, for comparison.
Asserts nothing.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.coordination.clients import is_cluster, route_key, slot_of
from admission.core import AdmissionRegistry, AdmissionRequest, Estimate, Profile

WIDE = {"concurrency": 1_000_000, "requestsPerMinute": 1e12, "maxQueueLength": 1_000_000}
# Heartbeats are rare here so that the calls counted are the decisions' own.
SETTINGS = {"recovery_grace_ms": 0, "timeout_ms": 2000, "lease_ttl_ms": 60_000}


def profile(workspace: str) -> Profile:
    return Profile.from_dict(
        {
            "profileVersion": "bench",
            "workspace": WIDE,
            "providers": {"llm": {**WIDE, "tokensPerSecond": 1e12}},
            "principals": {f"p{i}": {"concurrency": 1_000_000} for i in range(8)},
        },
        workspace_id=workspace,
    )


def primaries(url: str) -> dict[str, tuple[redis.Redis, list[tuple[int, int]]]]:
    """Each primary ("host:port") with a plain client to it and the slot ranges it serves (a
    single server serves them all)."""
    if not is_cluster(url):
        return {"server": (redis.Redis.from_url(url), [(0, 16383)])}
    host, _, port = url.split("://", 1)[1].rsplit("/", 1)[0].partition(":")
    seed = redis.Redis(host=host, port=int(port or 6379))
    found: dict[str, tuple[redis.Redis, list[tuple[int, int]]]] = {}
    for low, high, primary, *_ in seed.execute_command("CLUSTER", "SLOTS"):
        node_host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
        name = f"{node_host}:{primary[1]}"
        if name not in found:
            found[name] = (redis.Redis(host=node_host, port=int(primary[1])), [])
        found[name][1].append((int(low), int(high)))
    seed.close()
    return found


def node_of(nodes: dict[str, Any], key: str) -> str:
    slot = slot_of(key)
    for name, (_, spans) in nodes.items():
        if any(low <= slot <= high for low, high in spans):
            return name
    raise LookupError(slot)


def fcall_stats(nodes: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """FCALL calls and microseconds per primary, as each counts them."""
    out = {}
    for name, (client, _) in nodes.items():
        stat = client.info("commandstats").get("cmdstat_fcall", {})
        out[name] = (int(stat.get("calls", 0)), int(stat.get("usec", 0)))
    return out


def coordinator(url: str, prefix: str, workspaces: list[str]) -> Any:
    coordinator = RedisCoordinator(CoordinationSettings(url=url, prefix=prefix, **SETTINGS))
    registry = AdmissionRegistry(controller_factory=coordinator.controller)
    for workspace in workspaces:
        registry.register(profile(workspace), sequence=1)
    return registry, coordinator


def nodes_per_decision(url: str, prefix: str, workspace: str, decisions: int) -> list[int]:
    """How many primaries each decision (acquire, release) of one workspace called."""
    nodes = primaries(url)

    async def main() -> list[int]:
        registry, coord = coordinator(url, prefix, [workspace])
        controller = registry.controller(workspace)
        assert controller is not None
        touched = []
        try:
            # The first call registers the process and installs the profile.
            (await controller.acquire(_request(workspace, "warm"))).release(success=True)
            await coord.settle()
            for index in range(decisions):
                before = fcall_stats(nodes)
                lease = await controller.acquire(_request(workspace, f"d{index}"))
                lease.release(success=True, actual_tokens=8)
                await coord.settle()
                after = fcall_stats(nodes)
                touched.append(sum(after[n][0] > before[n][0] for n in nodes))
        finally:
            await coord.aclose()
        return touched

    return asyncio.run(main())


def _request(workspace: str, request_id: str, principal: str = "p0") -> AdmissionRequest:
    return AdmissionRequest(request_id, principal, workspace, "llm", Estimate(tokens=10))


def load_process(
    url: str, prefix: str, workspaces: list[str], seconds: float, callers: int, queue: Any
) -> None:
    async def main() -> dict[str, Any]:
        registry, coord = coordinator(url, prefix, workspaces)
        done = 0
        tag = uuid.uuid4().hex[:6]
        try:
            controllers = [registry.controller(ws) for ws in workspaces]
            for controller, ws in zip(controllers, workspaces, strict=True):
                assert controller is not None
                (await controller.acquire(_request(ws, f"{tag}-warm-{ws}"))).release()
            await coord.settle()
            deadline = time.perf_counter() + seconds

            async def caller(index: int) -> None:
                nonlocal done
                ws = workspaces[index % len(workspaces)]
                controller = controllers[index % len(workspaces)]
                assert controller is not None
                while time.perf_counter() < deadline:
                    item = _request(ws, f"{tag}-{index}-{done}", f"p{index % 8}")
                    lease = await controller.acquire(item)
                    lease.release(success=True, actual_tokens=8)
                    done += 1
                    await asyncio.sleep(0)

            started = time.perf_counter()
            await asyncio.gather(*(caller(i) for i in range(callers)))
            elapsed = time.perf_counter() - started
            await coord.settle()
        finally:
            await coord.aclose()
        return {"decisions": done, "seconds": elapsed}

    queue.put(asyncio.run(main()))


def load(
    url: str, prefix: str, workspaces: list[str], seconds: float, callers: int, processes: int
) -> tuple[float, dict[str, tuple[int, int]], int]:
    nodes = primaries(url)
    context = multiprocessing.get_context("spawn")
    queue: Any = context.Queue()
    before = fcall_stats(nodes)
    workers = [
        context.Process(
            target=load_process, args=(url, prefix, workspaces, seconds, callers, queue)
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=seconds * 10 + 120) for _ in workers]
    for worker in workers:
        worker.join()
    after = fcall_stats(nodes)
    decisions = sum(r["decisions"] for r in results)
    rate = decisions / max(r["seconds"] for r in results)
    delta = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in nodes}
    return rate, delta, decisions


def spread_workspaces(url: str, prefix: str, count: int) -> list[str]:
    """`count` workspace names whose slots `count` different primaries serve."""
    nodes = primaries(url)
    chosen: dict[str, str] = {}
    index = 0
    while len(chosen) < count:
        name = f"bench-{index}"
        node = node_of(nodes, route_key(prefix, name))
        chosen.setdefault(node, name)
        index += 1
    return list(chosen.values())


def run(url: str | None, seconds: float, callers: int) -> None:
    from tests.private_services import PrivateRedis, PrivateRedisCluster

    cluster = None
    if url is None:
        cluster = PrivateRedisCluster()
        url = cluster.url
    server = PrivateRedis()
    try:
        _run(url, seconds, callers, server.url)
    finally:
        server.destroy()
        if cluster is not None:
            cluster.destroy()


def _run(url: str, seconds: float, callers: int, single: str) -> None:
    nodes = primaries(url)
    version = next(iter(nodes.values()))[0].info("server")["redis_version"]
    print(f"Redis Cluster {version} at {url}: {len(nodes)} primaries ({', '.join(nodes)})")
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    spread = spread_workspaces(url, prefix, min(3, len(nodes)))
    touched = nodes_per_decision(url, prefix, spread[0], 200)
    print(
        f"nodes touched per decision (acquire + release, {len(touched)} decisions one at a time"
        f" in workspace {spread[0]}): min {min(touched)}, max {max(touched)}, "
        f"mean {sum(touched) / len(touched):.3f}"
    )
    for label, target, workspaces in (
        ("one Redis server, one workspace", single, spread[:1]),
        ("one workspace (one shard)", url, spread[:1]),
        (f"{len(spread)} workspaces on {len(spread)} shards", url, spread),
        ("one Redis server, 3 workspaces", single, spread),
    ):
        rate, delta, decisions = load(target, prefix, workspaces, seconds, callers, 3)
        usec = sum(u for _, u in delta.values())
        calls = sum(c for c, _ in delta.values())
        shares = ", ".join(
            f"{name} {c / max(1, calls):.0%}" for name, (c, _) in sorted(delta.items())
        )
        print(
            f"3 processes x {callers} callers, {label:<32} {rate:>9,.0f} decisions/s; "
            f"FCALLs per primary: {shares}"
        )
        print(
            f"{'':<48} Redis time per decision {usec / max(1, decisions):.1f} µs "
            f"(≈ {decisions / max(1, usec) * 1e6:,.0f} decisions/s per Redis core); "
            f"{calls / max(1, decisions):.2f} FCALLs per decision"
        )
    for client, _ in nodes.values():
        for key in client.scan_iter(f"{prefix}:*", count=5000):
            client.delete(key)
