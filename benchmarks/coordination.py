"""Deployment-wide admission through Redis against the in-process controller.

    python benchmarks/coordination.py [--redis redis://127.0.0.1:6379/8] [--seconds 5]
    python benchmarks/coordination.py --anchors [--redis ...]   # against the anchors only
    python benchmarks/coordination.py --cluster [--redis redis+cluster://HOST:PORT]

Prints the latency one decision adds (acquire, one caller at a time, p50 and p99) through Redis
against the in-process controller; then, with several callers per process, for one process and
for four processes: admission decisions per second and acquire latency under that load;
script calls (round trips) per acquire and per release, counted by the client and by Redis's own
command statistics; and Redis memory per principal with a waiter, at 10 000 principals.

`--anchors` measures, interleaved in one run on one Redis: the round trip of a function that
does nothing (FCALL) through redis-py's asyncio client and through the pipelined connection
Sluice's decisions use (admission/coordination/wire.py), a hit of `limits`' sliding-window
counter (its Redis strategy, on redis-py's asyncio client), and a whole Sluice decision
(acquire, then release; then the same with each decision an invocation of its own, forgotten
after it as the evaluation engine does): acquire p50 with one caller, Redis time per hit or
decision (INFO commandstats), and hits or decisions per second with 1 process x 8 callers and
4 processes x 8 callers; function or script calls and the `redis.call`s inside them per hit or
decision, Sluice's round trips per decision, and the four ratios against their targets; and a
function that makes the same Redis calls with the same arguments as a decision whose invocation is
forgotten, and decides nothing (FLOOR_LIBRARY): what Redis time the calls alone take; and the
same calls for as many such decisions as there are callers in one function call, with what they
share made once (FLOOR_BATCH_LIBRARY): what the calls would take if a process's concurrent
acquires of one workspace went to Redis together.
`--cluster` measures on a Redis Cluster (one it starts on loopback unless `--redis` names one):
nodes touched per decision, and decisions per second with the load on one shard and spread over
three (see coordination_cluster.py). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import (
    AdmissionRegistry,
    AdmissionRequest,
    Estimate,
    Profile,
)

WORKSPACE = "bench"
WIDE = {"concurrency": 1_000_000, "requestsPerMinute": 1e12, "maxQueueLength": 1_000_000}


def profile(
    principals: int = 8, *, workspace: dict[str, Any] | None = None, budgets: bool = False
) -> Profile:
    """The benchmark's profile; with `budgets`, every principal keeps an invocation budget
    (attempts) too large to refuse anything, so only its bookkeeping costs."""
    limits: dict[str, Any] = {"concurrency": 1_000_000}
    if budgets:
        limits["maxAttempts"] = 1_000_000
    return Profile.from_dict(
        {
            "profileVersion": "bench",
            "workspace": workspace or WIDE,
            "providers": {"llm": {**WIDE, "tokensPerSecond": 1e12}},
            "principals": {f"p{i}": dict(limits) for i in range(principals)},
        },
        workspace_id=WORKSPACE,
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def coordinated(
    url: str, prefix: str, *, budgets: bool = False
) -> tuple[AdmissionRegistry, RedisCoordinator]:
    coordinator = RedisCoordinator(
        CoordinationSettings(url=url, prefix=prefix, recovery_grace_ms=0, timeout_ms=2000)
    )
    registry = AdmissionRegistry(controller_factory=coordinator.controller)
    registry.register(profile(budgets=budgets), sequence=1)
    return registry, coordinator


async def decide(
    registry: AdmissionRegistry, seconds: float, callers: int, tag: str, *, forget: bool = False
) -> dict:
    """`callers` coroutines each acquire and release in a loop for `seconds`; with `forget`,
    each decision is an invocation of its own, forgotten once its lease is back
    (`release_budget`), as the evaluation engine does when an invocation ends."""
    controller = registry.controller(WORKSPACE)
    assert controller is not None
    latencies: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller(index: int) -> None:
        nonlocal done
        principal = f"p{index % 8}"
        while time.perf_counter() < deadline:
            item = AdmissionRequest(
                f"{tag}-{index}-{done}", principal, WORKSPACE, "llm", Estimate(tokens=10)
            )
            started = time.perf_counter()
            lease = await controller.acquire(item)
            latencies.append((time.perf_counter() - started) * 1e6)
            lease.release(success=True, actual_tokens=8)
            if forget:
                controller.release_budget(item.budget_id)
            done += 1
            await asyncio.sleep(0)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.perf_counter() - started
    return {"decisions": done, "seconds": elapsed, "latencies": latencies}


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


def one_process(
    url: str,
    prefix: str,
    seconds: float,
    callers: int,
    queue: Any = None,
    *,
    budgets: bool = False,
    forget: bool = False,
) -> dict:
    async def main() -> dict:
        registry, coordinator = coordinated(url, prefix, budgets=budgets)
        try:
            tag = uuid.uuid4().hex[:6]
            result = await decide(registry, seconds, callers, tag, forget=forget)
            await coordinator.settle()
            result["round_trips"] = dict(coordinator.round_trips)
            return result
        finally:
            await coordinator.aclose()

    result = asyncio.run(main())
    if queue is not None:
        queue.put(result)
    return result


def in_process(seconds: float, callers: int) -> dict:
    async def main() -> dict:
        registry = AdmissionRegistry()
        registry.register(profile())
        return await decide(registry, seconds, callers, "local")

    return asyncio.run(main())


def summary(label: str, result: dict) -> str:
    latencies = result["latencies"]
    rate = result["decisions"] / result["seconds"]
    return (
        f"{label:<40} {rate:>10,.0f} decisions/s   acquire p50 {percentile(latencies, 0.5):8.1f} µs"
        f"   p99 {percentile(latencies, 0.99):8.1f} µs"
    )


def memory_per_waiting_principal(url: str, principals: int) -> tuple[float, float]:
    """Redis bytes per principal that has one waiter queued (and after they all leave)."""

    async def main() -> tuple[float, float]:
        prefix = f"bench-mem-{uuid.uuid4().hex[:8]}"
        client = redis.Redis.from_url(url)
        coordinator = RedisCoordinator(
            CoordinationSettings(url=url, prefix=prefix, recovery_grace_ms=0, timeout_ms=5000)
        )
        registry = AdmissionRegistry(controller_factory=coordinator.controller)
        tight = profile(principals, workspace={"concurrency": 1, "maxQueueLength": 1_000_000})
        registry.register(tight, sequence=1)
        controller = registry.controller(WORKSPACE)
        assert controller is not None
        holder = await controller.acquire(
            AdmissionRequest("hold", "p0", WORKSPACE, "llm", Estimate(tokens=1))
        )
        client.memory_purge() if hasattr(client, "memory_purge") else None
        before = client.info("memory")["used_memory"]
        waiters = [
            asyncio.ensure_future(
                controller.acquire(
                    AdmissionRequest(f"w{i}", f"p{i}", WORKSPACE, "llm", Estimate(tokens=1))
                )
            )
            for i in range(1, principals)
        ]
        while client.hlen(f"{prefix}:{{{WORKSPACE}}}:W") < principals - 1:
            await asyncio.sleep(0.05)
        during = client.info("memory")["used_memory"]
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        holder.release(success=True)
        await coordinator.settle()
        await asyncio.sleep(0.5)
        after = client.info("memory")["used_memory"]
        await coordinator.aclose()
        for key in client.scan_iter(f"{prefix}:*", count=5000):
            client.delete(key)
        return (during - before) / (principals - 1), (after - before) / (principals - 1)

    return asyncio.run(main())


NOOP_LIBRARY = """#!lua name=sluice_bench_noop
redis.register_function('sluice_bench_noop', function(keys, args) return 1 end)
"""


# What a decision whose invocation is then forgotten asks of Redis on the common path (one lease
# given back and one invocation forgotten with the acquire), with arguments like a decision's and
# no decision at all: the time, the profile's five fields, the request's four scopes and the
# lease given back, the forget, the first-admission mark, the new lease and two scopes, and the
# lease given back deleted. What a decision costs beyond this is its own work.
FLOOR_LIBRARY = """#!lua name=sluice_bench_floor
redis.register_function('sluice_bench_floor', function(keys, a)
  local t = redis.call('TIME')
  local base = keys[1]
  local pid, prov = a[6], a[7]
  local prof = redis.call('HMGET', base .. 'prof', 'e:id', 'e:ready', 'e:wait', 'rev', 'dg')
  redis.call('HMGET', base .. 's', 'W', 'P:' .. pid, 'V:' .. prov, 'X:' .. prov .. pid,
    'L' .. a[17])
  redis.call('DEL', base .. 'b:' .. a[22], base .. 'r:' .. a[22])
  redis.call('SET', base .. 'r:' .. a[8], prov, 'NX', 'PX', '86400000')
  local lease = '{"proc":"' .. a[5] .. '","pid":"' .. pid .. '","prov":"' .. prov
    .. '","bud":"' .. a[8] .. '","gen":0,"probe":0,"at":' .. t[1] .. ',"tok":' .. a[9] .. '}'
  redis.call('HSET', base .. 's', 'L' .. a[5], lease, 'W', '1,,' .. t[2] .. ',' .. t[1],
    'V:' .. prov, '1,,' .. t[2] .. ',' .. t[1] .. ',' .. t[2] .. ',' .. t[1])
  redis.call('HDEL', base .. 's', 'L' .. a[17])
  return '{"st":"admit","a":1,"q":0,"rp":0,"bs":"closed","ep":"' .. prof[1]
    .. '","rel":[{"st":"released"}]}'
end)
"""


# The same calls for a batch of such decisions in one function call, as a process's acquires of
# one workspace made in the same turn of its loop could go together: the time, the profile and
# the workspace's and provider's scopes once; each decision's principal scopes and lease given back
# in the same read, every forget in one delete, a mark each, the leases and the two scopes in one
# write, the leases given back in one delete. Each decision has the 18 arguments it has alone,
# after the same 4 of the header.
FLOOR_BATCH_LIBRARY = """#!lua name=sluice_bench_floor_batch
redis.register_function('sluice_bench_floor_batch', function(keys, a)
  local t = redis.call('TIME')
  local base = keys[1]
  local n = (#a - 4) / 18
  local prof = redis.call('HMGET', base .. 'prof', 'e:id', 'e:ready', 'e:wait', 'rev', 'dg')
  local read, gone, forget = {'W', 'V:' .. a[7]}, {}, {}
  for i = 0, n - 1 do
    local o = 4 + 18 * i
    local pid, prov = a[o + 2], a[o + 3]
    read[#read + 1] = 'P:' .. pid
    read[#read + 1] = 'X:' .. prov .. pid
    read[#read + 1] = 'L' .. a[o + 13]
    gone[#gone + 1] = 'L' .. a[o + 13]
    forget[#forget + 1] = base .. 'b:' .. a[o + 18]
    forget[#forget + 1] = base .. 'r:' .. a[o + 18]
  end
  redis.call('HMGET', base .. 's', unpack(read))
  redis.call('DEL', unpack(forget))
  local write, out = {'W', '1,,' .. t[2] .. ',' .. t[1],
    'V:' .. a[7], '1,,' .. t[2] .. ',' .. t[1] .. ',' .. t[2] .. ',' .. t[1]}, {}
  for i = 0, n - 1 do
    local o = 4 + 18 * i
    local pid, prov = a[o + 2], a[o + 3]
    redis.call('SET', base .. 'r:' .. a[o + 4], prov, 'NX', 'PX', '86400000')
    write[#write + 1] = 'L' .. a[o + 1]
    write[#write + 1] = '{"proc":"' .. a[o + 1] .. '","pid":"' .. pid .. '","prov":"' .. prov
      .. '","bud":"' .. a[o + 4] .. '","gen":0,"probe":0,"at":' .. t[1] .. ',"tok":'
      .. a[o + 5] .. '}'
    out[i + 1] = '{"st":"admit","a":1,"q":0,"rp":0,"bs":"closed","ep":"' .. prof[1]
      .. '","rel":[{"st":"released"}]}'
  end
  redis.call('HSET', base .. 's', unpack(write))
  redis.call('HDEL', base .. 's', unpack(gone))
  return '[' .. table.concat(out, ',') .. ']'
end)
"""


async def timed_calls(
    seconds: float, callers: int, call: Callable[[int, int], Awaitable[object]]
) -> dict:
    """`callers` concurrent callers, each awaiting `call(its index, calls made so far)` until
    `seconds` have passed: how many calls, how long, and each call's latency in microseconds."""
    latencies: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller(index: int) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await call(index, done)
            latencies.append((time.perf_counter() - started) * 1e6)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return {"decisions": done, "seconds": time.perf_counter() - started, "latencies": latencies}


def floor_arguments(request: str, principal: str, previous: str) -> list[str]:
    """A floor decision's 18 arguments after the header: an acquire of `request` by `principal`
    that gives back the lease of `previous` and forgets its invocation."""
    return [
        request, principal, "llm", request, "10", "", "1", "", "", "1", "1", "1",
        previous, principal, "llm", "1,,8,", "1", previous,
    ]  # fmt: skip


async def floor_link(url: str, prefix: str, library: str, base: str) -> tuple[Any, list[str]]:
    """Loads a floor library and the profile fields its function reads under `base`; returns
    the connection Sluice's decisions use and the header's four arguments."""
    import redis.asyncio as aioredis

    from admission.coordination.wire import Wire

    client = aioredis.Redis.from_url(url)
    await client.function_load(library, replace=True)
    await client.hset(
        base + "prof", mapping={"e:id": "epoch-1", "e:ready": "0", "rev": "bench", "dg": "d" * 16}
    )
    await client.aclose()
    link = Wire(url, timeout_s=5.0, connect_timeout_s=5.0)
    settings = f'["{prefix}",600000,"{uuid.uuid4().hex}",30000,0,86400000]'
    return link, [settings, "bench", "epoch-1", "bench"]


async def floor_loop(
    url: str,
    prefix: str,
    seconds: float,
    callers: int,
    library: str = FLOOR_LIBRARY,
    function: str = "sluice_bench_floor",
) -> dict:
    """Calls of the floor function (FLOOR_LIBRARY, or `library`'s `function`, which takes the
    same arguments) through the connection Sluice's decisions use, each with a request, budget
    and lease id of its own."""
    from admission.coordination.wire import command

    base = f"{prefix}:{{floor}}:"
    link, header = await floor_link(url, prefix, library, base)
    previous = ["none"] * callers

    async def call(index: int, done: int) -> None:
        request = f"floor-{index}-{done}-{uuid.uuid4().hex[:8]}"
        arguments = floor_arguments(request, f"p{index % 8}", previous[index])
        await link.call(command("FCALL", function, 1, base, *header, *arguments))
        previous[index] = request

    result = await timed_calls(seconds, callers, call)
    await link.aclose()
    return result


async def floor_batch_loop(url: str, prefix: str, seconds: float, batch: int) -> dict:
    """One caller making FLOOR_BATCH_LIBRARY's calls, `batch` decisions each, through the
    connection Sluice's decisions use; counts decisions, not calls."""
    from admission.coordination.wire import command

    base = f"{prefix}:{{floorb}}:"
    link, header = await floor_link(url, prefix, FLOOR_BATCH_LIBRARY, base)
    previous = ["none"] * batch

    async def call(index: int, done: int) -> None:
        arguments = list(header)
        for slot in range(batch):
            request = f"floorb-{slot}-{done}-{uuid.uuid4().hex[:8]}"
            arguments += floor_arguments(request, f"p{slot % 8}", previous[slot])
            previous[slot] = request
        await link.call(command("FCALL", "sluice_bench_floor_batch", 1, base, *arguments))

    result = await timed_calls(seconds, 1, call)
    await link.aclose()
    result["decisions"] *= batch
    return result


def command_usec(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Calls and microseconds per command, as Redis counts them."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(v.get("calls", 0)), int(v.get("usec", 0)))
        for name, v in stats.items()
    }


def redis_usec_between(before: dict, after: dict, names: tuple[str, ...]) -> int:
    total = 0
    for name in names:
        total += after.get(name, (0, 0))[1] - before.get(name, (0, 0))[1]
    return total


async def noop_loop(url: str, seconds: float, callers: int, *, wire: bool = False) -> dict:
    """No-op FCALLs through redis-py's asyncio client, or (`wire`) through the pipelined
    connection Sluice's decisions use (admission/coordination/wire.py)."""
    import redis.asyncio as aioredis

    from admission.coordination.wire import Wire, command

    client = aioredis.Redis.from_url(url)
    await client.function_load(NOOP_LIBRARY, replace=True)
    link = Wire(url, timeout_s=5.0, connect_timeout_s=5.0)
    packed = command("FCALL", "sluice_bench_noop", 0)

    async def call(index: int, done: int) -> None:
        if wire:
            await link.call(packed)
        else:
            await client.fcall("sluice_bench_noop", 0)

    result = await timed_calls(seconds, callers, call)
    await client.aclose()
    await link.aclose()
    return result


async def limits_loop(url: str, seconds: float, callers: int) -> dict:
    from limits import RateLimitItemPerMinute
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import SlidingWindowCounterRateLimiter

    storage = RedisStorage(url.replace("redis://", "async+redis://", 1), implementation="redispy")
    limiter = SlidingWindowCounterRateLimiter(storage)
    item = RateLimitItemPerMinute(10**12)

    async def call(index: int, done: int) -> None:
        await limiter.hit(item, "bench", f"p{index % 8}")

    return await timed_calls(seconds, callers, call)


def anchor_process(
    kind: str, url: str, prefix: str, seconds: float, callers: int, queue: Any
) -> None:
    cpu = time.process_time()
    if kind in ("sluice", "sluice-forget"):
        result = one_process(url, prefix, seconds, callers, forget=kind == "sluice-forget")
    elif kind == "limits":
        result = asyncio.run(limits_loop(url, seconds, callers))
    elif kind == "floor":
        result = asyncio.run(floor_loop(url, prefix, seconds, callers))
    elif kind == "floor-batch":
        result = asyncio.run(floor_batch_loop(url, prefix, seconds, callers))
    else:
        result = asyncio.run(noop_loop(url, seconds, callers, wire=kind == "noop-wire"))
    # The client's CPU (user and system) for the whole run, setup and teardown included.
    result["cpu"] = time.process_time() - cpu
    queue.put(result)


def run_kind(
    kind: str, url: str, prefix: str, seconds: float, callers: int, processes: int
) -> dict:
    context = multiprocessing.get_context("spawn")
    queue: Any = context.Queue()
    workers = [
        context.Process(target=anchor_process, args=(kind, url, prefix, seconds, callers, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=seconds * 10 + 60) for _ in workers]
    for worker in workers:
        worker.join()
    trips: dict[str, int] = {}
    for r in results:
        for name, n in (r.get("round_trips") or {}).items():
            trips[name] = trips.get(name, 0) + n
    return {
        "decisions": sum(r["decisions"] for r in results),
        "seconds": max(r["seconds"] for r in results),
        "latencies": [v for r in results for v in r["latencies"]],
        "round_trips": trips,
        "cpu": sum(r.get("cpu", 0.0) for r in results),
    }


# Commands whose Redis time a hit or a decision costs (the functions and the scripts).
SCRIPT_COMMANDS = ("fcall", "evalsha", "eval", "fcall_ro", "evalsha_ro")
# Commands a benchmark's clients send for themselves, not for a hit or a decision.
OWN_COMMANDS = ("info", "function|load", "hello", "ping", "select", "config|resetstat")


def redis_calls_between(before: dict, after: dict) -> int:
    """Commands run inside functions and scripts (Redis counts them apart from the FCALL)."""
    total = 0
    for name, (calls, _) in after.items():
        if name in SCRIPT_COMMANDS or name in OWN_COMMANDS or name.startswith("client|"):
            continue
        total += calls - before.get(name, (0, 0))[0]
    return total


def script_calls_between(before: dict, after: dict) -> int:
    return sum(after.get(name, (0, 0))[0] - before.get(name, (0, 0))[0] for name in SCRIPT_COMMANDS)


# Targets: acquire p50 <= 2x the no-op FCALL; Redis time per decision <= 3x the anchor's per hit;
# decisions/s >= 0.5x the anchor's hits/s with 1 x callers and with 4 x callers.
TARGETS = {"p50": 2.0, "redis": 3.0, "one": 0.5, "four": 0.5}


def forget_marks(client: redis.Redis, prefix: str) -> None:
    """Deletes the first-admission marks (`r:<budget>`) under `prefix`."""
    batch: list[bytes] = []
    for key in client.scan_iter(f"{prefix}:*:r:*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def anchors(url: str, seconds: float, callers: int) -> None:
    client = redis.Redis.from_url(url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    rows: dict[str, dict[str, float]] = {}
    for kind in ("noop", "noop-wire", "limits", "sluice", "sluice-forget", "floor", "floor-batch"):
        # Each kind starts without the first-admission marks an earlier one left (decisions that
        # are never forgotten leave one per decision, for a day): a larger keyspace slows every
        # key Redis looks up, and the anchors ran without them.
        forget_marks(client, prefix)
        alone = run_kind(kind, url, prefix, seconds, 1, 1)
        before = command_usec(client)
        loaded = run_kind(kind, url, prefix, seconds, callers, 1)
        after = command_usec(client)
        spread = run_kind(kind, url, prefix, seconds, callers, 4)
        usec = redis_usec_between(before, after, SCRIPT_COMMANDS)
        ops = max(1, loaded["decisions"])
        trips = loaded["round_trips"]
        rows[kind] = {
            "p50": percentile(alone["latencies"], 0.5),
            "redis_us": usec / ops,
            "client_us": loaded["cpu"] * 1e6 / ops,
            "one": loaded["decisions"] / loaded["seconds"],
            "four": spread["decisions"] / spread["seconds"],
            "scripts": script_calls_between(before, after) / ops,
            "calls": redis_calls_between(before, after) / ops,
            "acquire": trips.get("acquire", 0) / ops,
            "release": trips.get("release", 0) / ops,
            "heartbeat": trips.get("heartbeat", 0) / ops,
        }
    for key in client.scan_iter(f"{prefix}:*", count=5000):
        client.delete(key)
    for key in client.scan_iter("LIMITS*", count=5000):
        client.delete(key)
    print(
        f"{'':<34}{'p50 µs (1 caller)':>18}{'Redis µs/op':>13}{'client CPU µs/op':>18}"
        f"{f'ops/s 1x{callers}':>14}{f'ops/s 4x{callers}':>14}"
        f"{'FCALLs/op':>11}{'redis.calls/op':>16}"
    )
    labels = {
        "noop": "no-op FCALL",
        "noop-wire": "no-op FCALL, Sluice's connection",
        "limits": "limits sliding-window counter hit",
        "sluice": "Sluice decision (acquire+release)",
        "sluice-forget": "the same, invocation then forgotten",
        "floor": "its Redis calls, no decision",
        "floor-batch": f"the same, batches of {callers}",
    }
    for kind, row in rows.items():
        print(
            f"{labels[kind]:<34}{row['p50']:>18,.0f}{row['redis_us']:>13,.1f}"
            f"{row['client_us']:>18,.1f}"
            f"{row['one']:>14,.0f}{row['four']:>14,.0f}"
            f"{row['scripts']:>11.2f}{row['calls']:>16.2f}"
        )
    sluice, noop, anchor = rows["sluice"], rows["noop"], rows["limits"]
    print(
        f"Sluice round trips per decision (1x{callers}): acquire {sluice['acquire']:.3f}, "
        f"release {sluice['release']:.3f} (the rest ride on the next acquire), "
        f"heartbeat {sluice['heartbeat']:.4f}"
    )
    forgetting = rows["sluice-forget"]
    print(
        f"  with each invocation forgotten after its decision (release_budget): acquire "
        f"{forgetting['acquire']:.3f}, release {forgetting['release']:.3f} (the forgets ride "
        "along too)"
    )
    ratios = {
        "p50": sluice["p50"] / noop["p50"],
        "redis": sluice["redis_us"] / anchor["redis_us"],
        "one": sluice["one"] / anchor["one"],
        "four": sluice["four"] / anchor["four"],
    }

    def verdict(name: str, higher_is_better: bool) -> str:
        met = ratios[name] >= TARGETS[name] if higher_is_better else ratios[name] <= TARGETS[name]
        sign = ">=" if higher_is_better else "<="
        outcome = "met" if met else "not met"
        return f"{ratios[name]:.2f}x (target {sign} {TARGETS[name]}x: {outcome})"

    print(f"ratio acquire p50 / no-op FCALL p50:             {verdict('p50', False)}")
    print(
        f"  (on Sluice's own connection the no-op takes {rows['noop-wire']['p50']:,.0f} µs: "
        f"{sluice['p50'] / rows['noop-wire']['p50']:.2f}x)"
    )
    print(f"ratio Redis time per decision / per limits hit:  {verdict('redis', False)}")
    print(f"ratio decisions/s / limits hits/s, 1x{callers}:          {verdict('one', True)}")
    print(f"ratio decisions/s / limits hits/s, 4x{callers}:          {verdict('four', True)}")
    floor = rows["floor"]
    print(
        "the same Redis calls and arguments as a forgotten invocation's decision, deciding "
        f"nothing: {floor['redis_us']:.1f} Redis µs, {floor['redis_us'] / anchor['redis_us']:.2f}x "
        f"a limits hit; the decision's own work: "
        f"{forgetting['redis_us'] - floor['redis_us']:.1f} µs"
    )
    batched = rows["floor-batch"]
    print(
        f"the same calls for {callers} such decisions in one function call (one caller; its "
        f"'1 caller' p50 is a batch of one): {batched['redis_us']:.1f} Redis µs per decision, "
        f"{batched['redis_us'] / anchor['redis_us']:.2f}x a limits hit"
    )
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/8")
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--principals", type=int, default=10_000)
    parser.add_argument("--anchors", action="store_true", help="only the anchors' comparison")
    parser.add_argument("--cluster", action="store_true", help="on a Redis Cluster")
    args = parser.parse_args()
    if args.cluster:
        from coordination_cluster import run

        given = args.redis if args.redis.startswith("redis+cluster://") else None
        run(given, args.seconds, args.callers)
        return
    client = redis.Redis.from_url(args.redis)
    print(f"Redis {client.info('server')['redis_version']} at {args.redis}; {os.cpu_count()} cores")
    if args.anchors:
        anchors(args.redis, args.seconds, args.callers)
        return

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    alone_local = in_process(args.seconds, 1)
    alone = one_process(args.redis, prefix, args.seconds, 1)
    print(summary("in-process, one caller", alone_local))
    print(summary("Redis, one caller", alone))
    for q in (0.5, 0.99):
        added = percentile(alone["latencies"], q) - percentile(alone_local["latencies"], q)
        print(f"{'':<40} added latency per decision p{round(q * 100)} {added / 1000:.3f} ms")

    local = in_process(args.seconds, args.callers)
    print(summary(f"in-process, 1 process, {args.callers} callers", local))

    calls_before = evalsha_calls(client)
    single = one_process(args.redis, prefix, args.seconds, args.callers)
    calls = evalsha_calls(client) - calls_before
    print(summary(f"Redis, 1 process, {args.callers} callers", single))
    trips = single["round_trips"]
    decisions = single["decisions"]
    print(
        f"{'':<40} round trips per decision: acquire {trips.get('acquire', 0) / decisions:.3f}, "
        f"release {trips.get('release', 0) / decisions:.3f}; Redis counted {calls / decisions:.3f}"
        f" script calls per decision (heartbeats included)"
    )

    queue: Any = multiprocessing.get_context("spawn").Queue()
    workers = [
        multiprocessing.get_context("spawn").Process(
            target=one_process, args=(args.redis, prefix, args.seconds, args.callers, queue)
        )
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=args.seconds * 10 + 60) for _ in workers]
    for worker in workers:
        worker.join()
    total = sum(r["decisions"] for r in results)
    span = max(r["seconds"] for r in results)
    latencies = [value for r in results for value in r["latencies"]]
    label = f"Redis, 4 processes, {args.callers} callers each"
    print(
        f"{label:<40} {total / span:>10,.0f} decisions/s   acquire p50 "
        f"{percentile(latencies, 0.5):8.1f} µs   p99 {percentile(latencies, 0.99):8.1f} µs"
    )
    per_process = [r["decisions"] / r["seconds"] for r in results]
    print(
        f"{'':<40} per process: {', '.join(f'{x:,.0f}' for x in per_process)} /s "
        f"(spread {statistics.pstdev(per_process):,.0f})"
    )
    for key in client.scan_iter(f"{prefix}:*", count=5000):
        client.delete(key)

    during, after = memory_per_waiting_principal(args.redis, args.principals)
    print(
        f"Redis memory with {args.principals:,} principals each waiting: {during:,.0f} B per "
        f"principal; after they left: {after:,.0f} B"
    )


if __name__ == "__main__":
    main()
