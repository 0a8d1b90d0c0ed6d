"""Evaluator benchmark: scheduler + admission overhead per adapter call, a 1 000-decision ruleset
at concurrency 8, and the HTTP adapter against bare httpx on the same local server.

Run with `python benchmarks/evaluator.py`. Prints figures and the targets; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from admission.core import AdmissionRegistry, Profile
from evaluator.engine.adapters import AdapterCall, FakeAdapter, OpenAIChatAdapter
from evaluator.engine.invocation import DecisionEvaluationRequest
from evaluator.engine.scheduler import evaluate_decision_ruleset

WORKSPACE = "bench-workspace"
PRINCIPAL = "bench-principal"
ROUNDS = 5

# A keep-alive HTTP/1.1 server answering every request with one chat completion, in its own
# process so that its CPU time is not charged to either client.
SERVER = r"""
import asyncio, json, sys
BODY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "yes"}}],
                   "usage": {"total_tokens": 12}}).encode()
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(BODY)).encode() + b"\r\n\r\n")
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(HEAD + BODY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def ruleset(count: int, adapter: str) -> dict:
    return {
        "id": "bench",
        "decisions": [
            {
                "id": f"d{i}",
                "prompt": "Is ${text} acceptable?",
                "allowedOutputs": ["yes", "no"],
                "binding": {"primary": {"adapter": adapter, "model": "bench-model"}},
            }
            for i in range(count)
        ],
    }


def registry_for(adapter: str) -> AdmissionRegistry:
    registry = AdmissionRegistry()
    wide = {"concurrency": 10_000, "requestsPerMinute": 1e12, "tokensPerSecond": 1e12}
    registry.register(
        Profile.from_dict(
            {
                "profileVersion": "bench",
                "workspace": wide,
                "providers": {adapter: wide},
                "principals": {PRINCIPAL: wide},
            },
            workspace_id=WORKSPACE,
        )
    )
    return registry


def request_for(count: int, adapter: str, concurrency: int) -> DecisionEvaluationRequest:
    return DecisionEvaluationRequest.from_dict(
        {
            "ruleset": ruleset(count, adapter),
            "input": {"text": "the benchmark input"},
            "scheduler": {"enabled": concurrency > 1, "bindingConcurrency": concurrency},
        },
        principal_id=PRINCIPAL,
        workspace_id=WORKSPACE,
    )


async def time_evaluation(count: int, concurrency: int) -> float:
    registry = registry_for("fake")
    request = request_for(count, "fake", concurrency)
    fake = FakeAdapter()
    gc.collect()
    started = time.perf_counter()
    result = await evaluate_decision_ruleset(request, registry=registry, adapters={"fake": fake})
    elapsed = time.perf_counter() - started
    assert result.succeeded and len(fake.calls) == count
    return elapsed


async def time_bare_fake(count: int) -> float:
    request = request_for(1, "fake", 1)
    decision = request.ruleset.decisions[0]
    call = AdapterCall(decision.id, "prompt", decision.binding.primary, decision.output, 1)
    fake = FakeAdapter()
    gc.collect()
    started = time.perf_counter()
    for _ in range(count):
        await fake.invoke(call)
    return time.perf_counter() - started


def fake_figures(calls: int) -> None:
    serial, scheduled, bare, thousand = [], [], [], []
    for _ in range(ROUNDS):
        serial.append(asyncio.run(time_evaluation(calls, 1)))
        scheduled.append(asyncio.run(time_evaluation(calls, 8)))
        bare.append(asyncio.run(time_bare_fake(calls)))
        thousand.append(asyncio.run(time_evaluation(1000, 8)))
    # The best round is the one least disturbed by other work on a shared machine.
    bare_us = min(bare) / calls * 1e6
    print(f"fake adapter, zero latency, {calls} calls, best and median of {ROUNDS} rounds")
    print(f"  bare adapter call                       {bare_us:8.1f} us/call")
    for label, times in (("serial", serial), ("scheduled (8)", scheduled)):
        best = min(times) / calls * 1e6 - bare_us
        median = statistics.median(times) / calls * 1e6 - bare_us
        print(
            f"  overhead per call, {label:<20} {best:8.1f} us/call best, "
            f"{median:.1f} median   (target <= 100)"
        )
    print(
        f"  1 000 decisions at concurrency 8        {min(thousand):8.3f} s best, "
        f"{statistics.median(thousand):.3f} median   (target <= 0.5)"
    )


async def http_round(base_url: str, calls: int, concurrency: int) -> tuple[float, float]:
    """One evaluator run and one bare-httpx run of ``calls`` requests, same pool settings."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    adapter = OpenAIChatAdapter(base_url=base_url, max_connections=concurrency)
    registry = registry_for("http")
    request = request_for(calls, "http", concurrency)
    decision = request.ruleset.decisions[0]
    prompt = decision.render(request.input)
    body = OpenAIChatAdapter.request_body(
        AdapterCall(decision.id, prompt, decision.binding.primary, decision.output, 1)
    )
    try:
        await evaluate_decision_ruleset(  # warm the pool
            request_for(concurrency, "http", concurrency),
            registry=registry,
            adapters={"http": adapter},
        )
        started = time.perf_counter()
        result = await evaluate_decision_ruleset(
            request, registry=registry, adapters={"http": adapter}
        )
        evaluator_s = time.perf_counter() - started
        assert result.succeeded, result.decisions[0]
    finally:
        await adapter.aclose()

    async with httpx.AsyncClient(limits=limits) as client:
        url = base_url + "/v1/chat/completions"
        headers = {"content-type": "application/json", "accept": "application/json"}

        async def worker(requests: int) -> None:
            # The leanest client: a fixed set of workers, each posting back to back.
            for _ in range(requests):
                response = await client.post(url, json=body, headers=headers)
                response.json()["choices"][0]["message"]["content"]

        await asyncio.gather(*(worker(1) for _ in range(concurrency)))  # warm the pool
        shares = [calls // concurrency + (i < calls % concurrency) for i in range(concurrency)]
        gc.collect()
        started = time.perf_counter()
        await asyncio.gather(*(worker(share) for share in shares))
        bare_s = time.perf_counter() - started
    return evaluator_s, bare_s


def http_figures(calls: int, concurrency: int) -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        base_url = f"http://127.0.0.1:{port}"
        evaluator_times, bare_times, ratios = [], [], []
        for _ in range(ROUNDS):
            evaluator_s, bare_s = asyncio.run(http_round(base_url, calls, concurrency))
            evaluator_times.append(evaluator_s)
            bare_times.append(bare_s)
            ratios.append(evaluator_s / bare_s)
    finally:
        server.terminate()
        server.wait(5)
    print(
        f"HTTP adapter vs bare httpx, {calls} requests at concurrency {concurrency}, "
        f"local server in its own process, {ROUNDS} paired rounds"
    )
    bare_us = min(bare_times) / calls * 1e6
    print(f"  bare httpx                              {bare_us:8.1f} us/request best")
    print(
        f"  evaluator + HTTP adapter                {min(evaluator_times) / calls * 1e6:8.1f}"
        " us/request best"
    )
    print(
        f"  ratio of bests                          {min(evaluator_times) / min(bare_times):8.2f} x"
        f"      median of paired ratios {statistics.median(ratios):.2f} x   (target <= 1.2)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="fake-adapter calls per round")
    parser.add_argument("--http-calls", type=int, default=400, help="HTTP requests per round")
    parser.add_argument("--http-concurrency", type=int, default=8)
    args = parser.parse_args()
    fake_figures(args.calls)
    http_figures(args.http_calls, args.http_concurrency)


if __name__ == "__main__":
    main()
