"""CNC-ADMIT-012: a real loopback server holds a slow response; overflow is shed before dispatch."""

from __future__ import annotations

import asyncio
import threading

from admission.core import AdmissionRegistry
from evaluator.engine.adapters import OpenAIChatAdapter
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import WORKSPACE, decision_doc, profile, request
from tests.evaluator.loopback import LoopbackServer, Reply

FIRST, SECOND, THIRD = "principal-first", "principal-second", "principal-third"


def test_CNC_ADMIT_012_queue_overflow_is_shed_before_network_dispatch():
    release = threading.Event()
    with LoopbackServer() as server:
        server.replies.append(Reply(hold=release, content="yes"))
        server.default = Reply(content="no")

        async def main():
            loop = asyncio.get_running_loop()
            registry = AdmissionRegistry()
            registry.register(
                profile(
                    workspace={"concurrency": 4},
                    providers={"http": {"concurrency": 1, "maxQueueLength": 1}},
                    principals={name: {"concurrency": 1} for name in (FIRST, SECOND, THIRD)},
                )
            )
            controller = registry.controller(WORKSPACE)
            adapter = OpenAIChatAdapter(base_url=server.base_url)
            ruleset = {"id": "slow", "decisions": [decision_doc("d0", adapter="http")]}

            def run(principal):
                return asyncio.ensure_future(
                    evaluate_decision_ruleset(
                        request(ruleset, principal_id=principal),
                        registry=registry,
                        adapters={"http": adapter},
                    )
                )

            try:
                first = run(FIRST)
                # The slow request is on the wire and held by the server.
                assert await loop.run_in_executor(None, server.received.acquire, True, 10)
                second = run(SECOND)
                # Real HTTP, real loop: wait until the second request is parked in the queue.
                for _ in range(500):
                    if controller.snapshot(SECOND).queued == 1:
                        break
                    await asyncio.sleep(0.01)
                third = await run(THIRD)
                held = {
                    "requests": len(server.requests),
                    "first": controller.snapshot(FIRST),
                    "second": controller.snapshot(SECOND),
                }
                release.set()
                results = (await first, await second, third)
                return results, held
            finally:
                release.set()
                await adapter.aclose()

        (first, second, third), held = asyncio.run(main())

    # While the slow response was held: one request on the wire, one waiter, overflow shed.
    assert held["requests"] == 1
    assert (held["first"].active, held["first"].queued) == (1, 0)
    assert (held["second"].active, held["second"].queued) == (0, 1)
    (shed,) = third.decisions[0].attempts
    assert shed.sent is False and shed.reason == "queue-full" and shed.outcome == "overloaded"
    assert shed.evidence["decision"] == "reject"
    # After the release the queued request went out; the shed one never did.
    assert first.decisions[0].output == "yes" and second.decisions[0].output == "no"
    assert len(server.requests) == 2
    assert server.max_in_flight == 1
