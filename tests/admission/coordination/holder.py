"""A process that holds one permit until told to give it back (the release-bound test).

    python -m tests.admission.coordination.holder CONFIG.json

CONFIG holds: url, prefix, settings (CoordinationSettings overrides), profile (document),
workspace, ready (a file written once the permit is held), go (a file whose appearance says
"release now"), out (where the monotonic time of the release is written). After the release the
process stays up without settling or closing, so only the lean path's own flush sends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import AdmissionRegistry, AdmissionRequest, Estimate, Profile


async def main(config: dict[str, Any]) -> None:
    coordinator = RedisCoordinator(
        CoordinationSettings(url=config["url"], prefix=config["prefix"], **config["settings"])
    )
    registry = AdmissionRegistry(controller_factory=coordinator.controller)
    registry.register(
        Profile.from_dict(config["profile"], workspace_id=config["workspace"]), sequence=1
    )
    controller = registry.controller(config["workspace"])
    assert controller is not None
    lease = await controller.acquire(
        AdmissionRequest("hold", "alice", config["workspace"], "llm", Estimate(tokens=1))
    )
    Path(config["ready"]).write_text("held")
    go = Path(config["go"])
    while not go.exists():
        await asyncio.sleep(0.002)
    released_at = time.monotonic()
    lease.release(success=True)
    Path(config["out"]).write_text(json.dumps({"released_at": released_at}))
    # Up, but neither settling nor closing: the permit must go back by itself.
    await asyncio.sleep(config["linger_s"])
    await coordinator.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))))
