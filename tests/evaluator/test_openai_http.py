"""The OpenAI-compatible HTTP adapter against a real loopback server."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from admission.core import AdmissionRegistry
from evaluator.engine.adapters import (
    AdapterCall,
    AdapterError,
    OpenAIChatAdapter,
    SharedClients,
    parse_retry_after_ms,
)
from evaluator.engine.outputs import OutputSpec
from evaluator.engine.rulesets import Target
from evaluator.engine.scheduler import evaluate_decision_ruleset
from tests.evaluator.builders import decision_doc, profile, request
from tests.evaluator.loopback import LoopbackServer, Reply

SECRET = "sk-test-loopback-credential-1234"


def call(**target):
    spec = {"adapter": "http", "model": "gpt-test", "timeoutMs": 2_000, **target}
    return AdapterCall(
        decision_id="d0",
        prompt="Is water wet?",
        target=Target.from_dict(spec, "target"),
        output=OutputSpec(allowed_outputs=("yes", "no")),
        attempt=1,
    )


def invoke(server, *, target=None):
    async def main():
        adapter = OpenAIChatAdapter(base_url=server.base_url, api_key_env="SLUICE_TEST_KEY")
        try:
            return await adapter.invoke(call(**(target or {})))
        finally:
            await adapter.aclose()

    return asyncio.run(main())


@pytest.fixture
def server():
    with LoopbackServer() as running:
        yield running


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("SLUICE_TEST_KEY", SECRET)


def test_answer_usage_and_request_shape(server, caplog):
    caplog.set_level(logging.DEBUG)
    server.replies.append(Reply(content="yes", total_tokens=17))
    response = invoke(server)
    assert response.answer == "yes" and response.total_tokens == 17
    (seen,) = server.requests
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["authorization"] == f"Bearer {SECRET}"
    assert seen["body"]["model"] == "gpt-test"
    assert seen["body"]["messages"][-1] == {"role": "user", "content": "Is water wet?"}
    assert "yes, no" in seen["body"]["messages"][0]["content"]
    assert seen["body"]["max_tokens"] == 256
    assert SECRET not in caplog.text


def test_credentials_never_reach_a_repr():
    adapter = OpenAIChatAdapter(base_url="http://127.0.0.1:9", api_key_env="SLUICE_TEST_KEY")
    assert SECRET not in repr(adapter) and "SLUICE_TEST_KEY" in repr(adapter)


def test_a_missing_credential_sends_nothing(server, monkeypatch):
    monkeypatch.delenv("SLUICE_TEST_KEY")
    with pytest.raises(AdapterError) as caught:
        invoke(server)
    assert caught.value.kind == "misconfigured" and caught.value.sent is False
    assert server.requests == []


@pytest.mark.parametrize(
    ("headers", "expected_ms"),
    [
        ({"Retry-After": "2"}, 2000.0),
        ({"Retry-After": "0.5"}, 500.0),
        ({"retry-after-ms": "150", "Retry-After": "9"}, 150.0),
        ({}, None),
        ({"Retry-After": "soon"}, None),
    ],
)
def test_429_is_rate_limited_with_the_requested_pause(server, headers, expected_ms):
    server.replies.append(Reply(status=429, headers=headers))
    with pytest.raises(AdapterError) as caught:
        invoke(server)
    error = caught.value
    assert error.kind == "rate-limited" and error.sent and error.retryable
    assert error.provider_failure is None
    assert error.retry_after_ms == expected_ms
    assert error.reason == "http-429"


def test_retry_after_as_an_http_date():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    ms = parse_retry_after_ms({"Retry-After": later}, now_epoch_ms=now.timestamp() * 1000)
    assert ms == pytest.approx(30_000)
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after_ms({"Retry-After": past}, now_epoch_ms=now.timestamp() * 1000) == 0
    assert parse_retry_after_ms({"retry-after-ms": "-5"}, now_epoch_ms=0) is None
    assert parse_retry_after_ms({"Retry-After": "999999999"}, now_epoch_ms=0) == 3_600_000


@pytest.mark.parametrize(
    ("status", "kind", "retryable", "failure"),
    [
        (500, "server-error", True, True),
        (503, "server-error", True, True),
        (408, "server-error", True, True),
        (400, "client-error", False, False),
        (401, "client-error", False, False),
    ],
)
def test_error_statuses_map_to_typed_outcomes(server, status, kind, retryable, failure):
    server.replies.append(Reply(status=status, headers={"Retry-After": "1"}))
    with pytest.raises(AdapterError) as caught:
        invoke(server)
    error = caught.value
    assert (error.kind, error.retryable, error.provider_failure) == (kind, retryable, failure)
    assert error.status_code == status and error.sent


@pytest.mark.parametrize(
    "body", [b"not json", {"choices": []}, {"choices": [{"message": {"content": 7}}]}]
)
def test_malformed_success_is_a_bad_response(server, body):
    server.replies.append(Reply(body=body))
    with pytest.raises(AdapterError) as caught:
        invoke(server)
    assert caught.value.kind == "bad-response" and caught.value.provider_failure is True


def test_read_timeout_after_dispatch_is_uncertain(server):
    release = threading.Event()
    server.replies.append(Reply(hold=release))
    try:
        with pytest.raises(AdapterError) as caught:
            invoke(server, target={"timeoutMs": 200})
    finally:
        release.set()
    assert caught.value.kind == "uncertain" and caught.value.sent is True
    assert caught.value.provider_failure is None
    assert len(server.requests) == 1


def test_connection_refused_is_not_sent():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def main():
        adapter = OpenAIChatAdapter(base_url=f"http://127.0.0.1:{port}")
        try:
            return await adapter.invoke(call())
        finally:
            await adapter.aclose()

    with pytest.raises(AdapterError) as caught:
        asyncio.run(main())
    assert caught.value.kind == "connect-error" and caught.value.sent is False


def test_evaluator_honours_retry_after_ms_and_reconciles_actual_tokens(server):
    server.replies.append(Reply(status=429, headers={"retry-after-ms": "200"}))
    server.default = Reply(content="no", total_tokens=10)

    async def main():
        registry = AdmissionRegistry()
        # Two estimates of ~260 tokens do not fit 400; the real usage of 10 tokens does.
        registry.register(
            profile(
                providers={"http": {"concurrency": 2}},
                principals={"principal-7d2e": {"concurrency": 2, "maxTokens": 400}},
            )
        )
        adapter = OpenAIChatAdapter(base_url=server.base_url, api_key_env="SLUICE_TEST_KEY")
        ruleset = {
            "id": "http",
            "decisions": [
                decision_doc("d0", adapter="http", retry={"maxAttempts": 2, "initialBackoffMs": 0}),
                decision_doc("d1", adapter="http"),
            ],
        }
        try:
            started = time.monotonic()
            result = await evaluate_decision_ruleset(
                request(ruleset), registry=registry, adapters={"http": adapter}
            )
            return result, time.monotonic() - started
        finally:
            await adapter.aclose()

    result, elapsed = asyncio.run(main())
    d0, d1 = result.decisions
    assert [a.outcome for a in d0.attempts] == ["rate-limited", "succeeded"]
    assert d0.attempts[0].retry_after_ms == 200
    assert d0.output == "no" and d1.status == "succeeded"
    assert d0.attempts[1].tokens == 10
    assert elapsed >= 0.2
    assert len(server.requests) == 3


def test_shared_clients_keep_one_connection_across_adapters_of_a_loop(server):
    """Adapters made afresh for each run reuse one kept-alive connection through
    `SharedClients`: closing an adapter leaves it open, closing the clients closes it, and the
    next loop opens its own."""
    clients = SharedClients()

    async def runs(count):
        for _ in range(count):
            adapter = OpenAIChatAdapter(
                base_url=server.base_url, api_key_env="SLUICE_TEST_KEY", clients=clients
            )
            try:
                response = await adapter.invoke(call())
                assert response.answer == "yes"
            finally:
                await adapter.aclose()

    async def loop_of_runs():
        await runs(3)
        await clients.aclose()

    asyncio.run(loop_of_runs())
    asyncio.run(loop_of_runs())
    peers = [entry["peer"] for entry in server.requests]
    assert len(peers) == 6
    assert len(set(peers[:3])) == 1 and len(set(peers[3:])) == 1
    assert peers[0] != peers[3]


def test_an_adapter_of_its_own_opens_a_connection_per_adapter(server):
    async def main():
        for _ in range(2):
            adapter = OpenAIChatAdapter(base_url=server.base_url, api_key_env="SLUICE_TEST_KEY")
            try:
                await adapter.invoke(call())
            finally:
                await adapter.aclose()

    asyncio.run(main())
    assert len({entry["peer"] for entry in server.requests}) == 2


def test_shared_clients_never_queue_a_call_behind_a_connection_cap(server):
    """Admission bounds the calls in flight: runs sharing a client together send every call at
    once, even past one adapter's `max_connections`."""
    server.default = Reply(delay=0.3)
    clients = SharedClients()

    async def main():
        adapters = [
            OpenAIChatAdapter(
                base_url=server.base_url,
                api_key_env="SLUICE_TEST_KEY",
                max_connections=2,
                clients=clients,
            )
            for _ in range(2)
        ]
        try:
            await asyncio.gather(*(adapters[i % 2].invoke(call()) for i in range(5)))
        finally:
            await clients.aclose()

    asyncio.run(main())
    assert len(server.requests) == 5
    assert server.max_in_flight == 5
