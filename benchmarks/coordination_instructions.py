"""The Redis server's own work per decision, counted in instructions, against the same anchors.

    python benchmarks/coordination_instructions.py [--seconds 3] [--callers 8] [--budgets]
        [--forget]

Redis time per call (INFO commandstats) is wall time on the server: on a shared machine it grows
with the load average, whenever Redis waits for a core. This benchmark counts what does not:
the instructions the Redis server executes per call, under valgrind's callgrind, for the same
three kinds as `coordination.py --anchors` (a no-op FCALL, a hit of `limits`' sliding-window
counter, a Sluice decision: acquire, then release), each from one caller at a time with the same
redis-py asyncio client. `--callers N` makes the decisions with N callers in one process (their
releases then ride together on the next acquire, often of another principal's); `--budgets`
gives every principal an invocation budget (such decisions go the general way); `--forget` makes
each decision an invocation of its own, forgotten after it (`release_budget`), as the evaluation
engine does, and prints the instructions per decision as well as per call. It starts its
own `redis-server` under `valgrind --tool=callgrind` on a free loopback port (about 50 times
slower than natively: the figures are counts, not speeds) and stops it at the end. Needs
`valgrind` (with `callgrind_control`) and `redis-server` on the PATH. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from coordination import (
    command_usec,
    limits_loop,
    noop_loop,
    one_process,
    script_calls_between,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def counted_instructions(folder: Path, pid: int) -> int:
    """Instructions since the last zeroing: dumps the counts and reads the newest dump."""
    before = set(folder.iterdir())
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    for _ in range(200):
        new = [p for p in set(folder.iterdir()) - before if p.stat().st_size > 0]
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("summary:"):
                    return int(line.split()[1])
        time.sleep(0.05)
    raise RuntimeError("callgrind wrote no dump")


def run(
    kind: str,
    url: str,
    prefix: str,
    seconds: float,
    callers: int = 1,
    budgets: bool = False,
    forget: bool = False,
) -> int:
    """Runs one kind for `seconds`; returns how many hits or decisions it made."""
    if kind == "sluice":
        result = one_process(url, prefix, seconds, callers, budgets=budgets, forget=forget)
    elif kind == "limits":
        result = asyncio.run(limits_loop(url, seconds, 1))
    else:
        result = asyncio.run(noop_loop(url, seconds, 1))
    return int(result["decisions"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per kind")
    parser.add_argument("--callers", type=int, default=1, help="Sluice's callers in one process")
    parser.add_argument(
        "--budgets", action="store_true", help="every principal keeps an invocation budget"
    )
    parser.add_argument(
        "--forget", action="store_true", help="each decision's invocation is forgotten after it"
    )
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not on the PATH")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="sluice-callgrind-") as tmp:
        folder = Path(tmp)
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.%p"]
        command += ["redis-server", "--bind", "127.0.0.1", "--port", str(port)]
        command += ["--save", "", "--appendonly", "no"]
        server = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis.from_url(url)
            for _ in range(600):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            rows = {}
            for kind in ("noop", "limits", "sluice"):
                # Warm: library loaded, profile in.
                run(
                    kind,
                    url,
                    prefix,
                    min(1.0, args.seconds),
                    args.callers,
                    args.budgets,
                    args.forget,
                )
                subprocess.run(
                    ["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True
                )
                before = command_usec(client)
                made = run(kind, url, prefix, args.seconds, args.callers, args.budgets, args.forget)
                after = command_usec(client)
                instructions = counted_instructions(folder, server.pid)
                ops = script_calls_between(before, after)
                # The statistics' own commands (INFO) are counted too; they are few and alike.
                rows[kind] = instructions / max(1, ops)
                line = f"{kind:8} {ops:7d} calls  {rows[kind]:12,.0f} instructions per call"
                if kind == "sluice" and args.forget:
                    line += f"; {made} decisions, {instructions / max(1, made):,.0f} per decision"
                print(line)
            print(
                f"decision / limits hit: {rows['sluice'] / rows['limits']:.2f}x; "
                f"decision / no-op FCALL: {rows['sluice'] / rows['noop']:.2f}x"
            )
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
