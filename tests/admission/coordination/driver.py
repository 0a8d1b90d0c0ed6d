"""A worker-like process for the multi-process tests: it admits calls through coordinated
admission and sends each admitted one to an HTTP provider, writing one JSON line per decision.

    python -m tests.admission.coordination.driver CONFIG.json

CONFIG holds: url, prefix, settings (CoordinationSettings overrides), profile (document),
workspace, sequence, principal, provider, base_url, concurrency, count, seconds, out,
deadline_ms (per request, optional), ready (a file written once the first decision is made),
complete (optional: stop once this many calls have completed at the provider, whatever was
refused meanwhile; `count` then bounds the attempts).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    AdmissionRequest,
    CancelSignal,
    Estimate,
    Profile,
)


def _dump_tasks() -> None:
    # SIGUSR1: every task's stack on stderr, to see where a stuck process waits.
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)


async def main(config: dict[str, Any]) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
    coordinator = RedisCoordinator(
        CoordinationSettings(url=config["url"], prefix=config["prefix"], **config["settings"])
    )
    registry = AdmissionRegistry(controller_factory=coordinator.controller)
    profile = Profile.from_dict(config["profile"], workspace_id=config["workspace"])
    registry.register(profile, sequence=config["sequence"])
    controller = registry.controller(config["workspace"])
    assert controller is not None
    out_path = Path(config["out"])
    deadline = time.monotonic() + config["seconds"]
    remaining = config["count"]
    complete = config.get("complete")
    completed = 0
    ready = Path(config["ready"]) if config.get("ready") else None
    client = httpx.AsyncClient(base_url=config["base_url"], timeout=30)

    def record(line: dict[str, Any]) -> None:
        with out_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({**line, "at": time.time()}) + "\n")
        if ready is not None and not ready.exists():
            ready.write_text("ready")

    async def one_call() -> None:
        nonlocal completed
        signal = CancelSignal()
        wait = config.get("deadline_ms")
        item = AdmissionRequest(
            uuid.uuid4().hex,
            config["principal"],
            config["workspace"],
            config["provider"],
            Estimate(tokens=10),
            deadline_ms=registry.clock.monotonic_ms() + wait if wait else None,
            signal=signal,
        )
        try:
            lease = await controller.acquire(item)
        except AdmissionRejected as refusal:
            record({"decision": "reject", "reason": refusal.reason})
            await asyncio.sleep(0.05)
            return
        record({"decision": "admit", "active": lease.evidence.active, "id": item.budget_id})
        call = asyncio.ensure_future(
            client.post("/v1/chat/completions", json={"id": item.budget_id})
        )
        fired = asyncio.ensure_future(_fired(signal))
        done, _ = await asyncio.wait({call, fired}, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            fired.cancel()
            lease.release(success=call.exception() is None)
            completed += call.exception() is None
            record({"decision": "done", "id": item.budget_id})
        else:
            call.cancel()
            lease.release(success=None)
            record({"decision": "aborted", "why": signal.reason, "id": item.budget_id})

    async def loop() -> None:
        nonlocal remaining
        while remaining > 0 and time.monotonic() < deadline:
            if complete is not None and completed >= complete:
                break
            remaining -= 1
            await one_call()

    await asyncio.gather(*(loop() for _ in range(config["concurrency"])))
    await coordinator.settle()
    await coordinator.aclose()
    await client.aclose()


async def _fired(signal: CancelSignal) -> None:
    await signal


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))))
