"""What each of a decision's Redis calls costs: the floor (`coordination.py`'s FLOOR_LIBRARY)
with one part taken out at a time.

    python benchmarks/coordination_floor.py [--redis redis://127.0.0.1:6379/8] [--seconds 3]
        [--callers 8]

The floor makes the Redis calls of a decision whose invocation is then forgotten, on the common
path with one lease given back, with a decision's 22 arguments, and decides nothing. Each
variant here leaves one part out (a call read from a constant instead, or a write not made) and
runs for `--seconds` with `--callers` callers in one process, through the connection Sluice's
decisions use; the whole floor runs first and last, so the drift of the machine shows. Prints
Redis µs per call (INFO commandstats, FCALL only) and what leaving the part out saved against
the mean of the two whole runs. The last variant makes no Redis call at all: what is left is
the function call itself, its arguments and the lease's text. A variant without one of the
deletes leaves behind what it would have deleted (a mark per call, a lease per call in the
state hash): what the growing keyspace or hash costs the other calls can outweigh the delete.
The first-admission marks each variant leaves are deleted before the next. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from coordination import FLOOR_LIBRARY, command_usec, floor_loop, forget_marks

TIME = "  local t = redis.call('TIME')\n"
PROFILE = (
    "  local prof = redis.call('HMGET', base .. 'prof', 'e:id', 'e:ready', 'e:wait', 'rev', 'dg')\n"
)
SCOPES = (
    "  redis.call('HMGET', base .. 's', 'W', 'P:' .. pid, 'V:' .. prov, 'X:' .. prov .. pid,\n"
    "    'L' .. a[17])\n"
)
FORGET = "  redis.call('DEL', base .. 'b:' .. a[22], base .. 'r:' .. a[22])\n"
MARK = "  redis.call('SET', base .. 'r:' .. a[8], prov, 'NX', 'PX', '86400000')\n"
WRITE = (
    "  redis.call('HSET', base .. 's', 'L' .. a[5], lease, 'W', '1,,' .. t[2] .. ',' .. t[1],\n"
    "    'V:' .. prov, '1,,' .. t[2] .. ',' .. t[1] .. ',' .. t[2] .. ',' .. t[1])\n"
)
GIVEN_BACK = "  redis.call('HDEL', base .. 's', 'L' .. a[17])\n"

# Each part: what it is, and the floor's lines it takes out or replaces.
PARTS: dict[str, tuple[str, dict[str, str]]] = {
    "time": ("TIME (a constant instead)", {TIME: "  local t = {'1796486551', '561830'}\n"}),
    "profile": (
        "the profile's five fields (a constant instead)",
        {PROFILE: "  local prof = {'epoch-1', '0', false, 'bench', 'dd'}\n"},
    ),
    "scopes": ("reading the four scopes and the lease given back", {SCOPES: ""}),
    "forget": ("deleting the forgotten invocation", {FORGET: ""}),
    "mark": ("the first-admission mark (SET NX PX)", {MARK: ""}),
    "write": ("writing the lease and two scopes", {WRITE: ""}),
    "given-back": ("deleting the lease given back", {GIVEN_BACK: ""}),
}
PARTS["calls"] = (
    "every Redis call (the call, its arguments, the lease's text)",
    {old: new for _, lines in PARTS.values() for old, new in lines.items()},
)


def variant(part: str) -> tuple[str, str]:
    """The floor library without `part`, under a name of its own; and its function's name."""
    code = FLOOR_LIBRARY
    for old, new in PARTS[part][1].items():
        assert code.count(old) == 1, (part, old)
        code = code.replace(old, new)
    name = f"sluice_bench_floor_no_{part.replace('-', '_')}"
    return code.replace("sluice_bench_floor", name), name


def measure(url: str, prefix: str, seconds: float, callers: int, part: str | None) -> float:
    """Redis µs per call of the floor, or of the floor without `part`."""
    client = redis.Redis.from_url(url)
    forget_marks(client, prefix)
    if part is None:
        library, function = FLOOR_LIBRARY, "sluice_bench_floor"
    else:
        library, function = variant(part)
    before = command_usec(client)
    result = asyncio.run(floor_loop(url, prefix, seconds, callers, library, function))
    after = command_usec(client)
    calls = after["fcall"][0] - before.get("fcall", (0, 0))[0]
    usec = after["fcall"][1] - before.get("fcall", (0, 0))[1]
    client.close()
    assert calls >= result["decisions"], (calls, result["decisions"])
    return usec / max(1, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis", default=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/8")
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--callers", type=int, default=8)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis)
    print(f"Redis {client.info('server')['redis_version']} at {args.redis}; {os.cpu_count()} cores")
    prefix = f"bench-floor-{uuid.uuid4().hex[:8]}"
    first = measure(args.redis, prefix, args.seconds, args.callers, None)
    rows = {part: measure(args.redis, prefix, args.seconds, args.callers, part) for part in PARTS}
    last = measure(args.redis, prefix, args.seconds, args.callers, None)
    whole = (first + last) / 2
    print(f"{'':<64}{'Redis µs per call':>18}{'saved':>8}")
    print(f"{'the whole floor (first run, last run)':<64}{f'{first:.1f}, {last:.1f}':>18}")
    for part, usec in rows.items():
        print(f"{'without ' + PARTS[part][0]:<64}{usec:>18.1f}{whole - usec:>8.1f}")
    print("(a negative saving: what a delete left behind cost the other calls more than it did)")
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    forget_marks(client, prefix)
    for key in client.scan_iter(f"{prefix}:*", count=5000):
        client.delete(key)
    for name in ["sluice_bench_floor", *(variant(part)[1] for part in PARTS)]:
        with contextlib.suppress(redis.ResponseError):
            client.function_delete(name)


if __name__ == "__main__":
    main()
