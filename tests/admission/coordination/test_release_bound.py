"""A permit given back in one process serves a waiter in another within the documented bound.

A release is sent with the next acquire of its workspace if one starts within two turns of the
event loop, else on its own right after them (batched with the releases of those turns): the
permit is back in the pool one round trip later (docs/admission-coordination.md, "What a
decision costs"). A waiter in another process then hears of its grant at once (its listener)
and takes it in one more round trip. With a round trip bounded by `timeout_ms`, the waiter has
the permit within three round trips of the release, far below the heartbeat interval here (so a
release carried by the heartbeat, or by the holder's next decision, would fail the test).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import AdmissionRegistry, AdmissionRequest, Estimate, Profile
from tests.admission.coordination.conftest import Deployment

ROOT = Path(__file__).resolve().parents[3]
# A round trip may take up to two seconds (a loaded CI machine stalls a process for hundreds of
# milliseconds; the 250 ms default would refuse the first decision as coordination-unavailable),
# which still keeps the bound (three round trips, 6 s) far below the heartbeat (30 s).
SETTINGS = {
    "lease_ttl_ms": 90_000,
    "heartbeat_ms": 30_000,
    "recovery_grace_ms": 0,
    "timeout_ms": 2_000,
}
DOCUMENT = {
    "profileVersion": "bound-v1",
    "workspace": {"concurrency": 1, "maxQueueLength": 4},
    "providers": {"llm": {"concurrency": 1}},
    "principals": {"alice": {"concurrency": 1}, "bob": {"concurrency": 1}},
}


def _wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.01)


def test_a_released_permit_reaches_a_waiter_in_another_process_within_the_bound(
    tmp_path: Path, deployment: Deployment
) -> None:
    ready, go, out = tmp_path / "ready", tmp_path / "go", tmp_path / "released.json"
    config = tmp_path / "holder.json"
    config.write_text(
        json.dumps(
            {
                "url": deployment.url,
                "prefix": deployment.prefix,
                "settings": SETTINGS,
                "profile": DOCUMENT,
                "workspace": "ws",
                "ready": str(ready),
                "go": str(go),
                "out": str(out),
                "linger_s": 10,
            }
        )
    )
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.admission.coordination.holder", str(config)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        _wait_for_file(ready, 30)

        async def wait_in_this_process() -> tuple[float, int]:
            coordinator = RedisCoordinator(
                CoordinationSettings(url=deployment.url, prefix=deployment.prefix, **SETTINGS)
            )
            registry = AdmissionRegistry(controller_factory=coordinator.controller)
            registry.register(Profile.from_dict(DOCUMENT, workspace_id="ws"), sequence=1)
            controller = registry.controller("ws")
            assert controller is not None
            try:
                waiting = asyncio.ensure_future(
                    controller.acquire(
                        AdmissionRequest("wait", "bob", "ws", "llm", Estimate(tokens=1))
                    )
                )
                while not coordinator.waiters:
                    assert not waiting.done(), "the waiter was decided while the permit was held"
                    await asyncio.sleep(0.005)
                go.write_text("go")
                lease = await asyncio.wait_for(waiting, 10)
                granted_at = time.monotonic()
                active = lease.evidence.active
                lease.release(success=True)
                return granted_at, active
            finally:
                await coordinator.aclose()

        granted_at, active = asyncio.run(wait_in_this_process())
        _wait_for_file(out, 10)
        released_at = json.loads(out.read_text())["released_at"]
    finally:
        holder.terminate()
        holder.wait(10)
    waited = granted_at - released_at
    bound = 3 * SETTINGS["timeout_ms"] / 1000
    print(f"released in one process, granted in the other {waited * 1000:.1f} ms later")
    assert 0 < waited <= bound, (waited, bound)
    assert active == 1
