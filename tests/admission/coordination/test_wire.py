"""The pipelined connection of admission's function calls (wire.py), against a server the test
controls: answers in order, errors, a server that stops answering, a lost connection, a caller
cancelled mid-call, and the connection's setup (password, database)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import hiredis
import pytest
import redis

from admission.coordination.wire import IN_FLIGHT, Wire, command, supports

# Calls wait at most this long; the tests never wait for it to pass except where a server is
# made silent on purpose, and then they assert what fails, not when.
TIMEOUT_S = 0.5

Answer = Callable[[list[bytes]], bytes | None]


def synchronous(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


def echo(request: list[bytes]) -> bytes | None:
    """Answer every command with its last argument (or +OK), as a bulk string."""
    if request[0].upper() in (b"AUTH", b"SELECT"):
        return b"+OK\r\n"
    value = request[-1]
    return b"$%d\r\n%b\r\n" % (len(value), value)


class FakeRedis:
    """A loopback server speaking Redis's protocol; `answer` decides each reply (None: stay
    silent), and every connection's commands are kept."""

    def __init__(self, answer: Answer = echo) -> None:
        self.answer = answer
        self.connections: list[list[list[bytes]]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.received = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for writer in self.writers:
            writer.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def url(self, db: int = 0, password: str = "") -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        commands: list[list[bytes]] = []
        self.connections.append(commands)
        parser = hiredis.Reader()
        while True:
            data = await reader.read(65536)
            if not data:
                return
            parser.feed(data)
            replies = []
            while (request := parser.gets()) is not False:
                commands.append(request)
                self.received.set()
                reply = self.answer(request)
                if reply is not None:
                    replies.append(reply)
            if replies:
                writer.write(b"".join(replies))
                await writer.drain()


@asynccontextmanager
async def fake(answer: Answer = echo) -> AsyncIterator[FakeRedis]:
    server = FakeRedis(answer)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def wire(server: FakeRedis, **options: Any) -> Wire:
    return Wire(server.url(**options), timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S)


def test_supports_single_servers_only() -> None:
    assert supports("redis://127.0.0.1:6379/0")
    assert supports("unix:///tmp/redis.sock")
    assert not supports("rediss://127.0.0.1:6379/0")
    assert not supports("redis+cluster://127.0.0.1:7000")


@synchronous
async def test_concurrent_calls_share_one_connection_and_get_their_own_answers() -> None:
    async with fake() as server:
        link = wire(server)
        answers = await asyncio.gather(
            *(link.call(command("ECHO", f"value-{i}")) for i in range(200))
        )
        assert answers == [f"value-{i}".encode() for i in range(200)]
        assert len(server.connections) == 1
        assert len(server.connections[0]) == 200
        await link.aclose()


@synchronous
async def test_calls_beyond_the_in_flight_bound_wait_for_a_turn_before_they_are_sent() -> None:
    held: list[list[bytes]] = []

    def hold(request: list[bytes]) -> None:
        held.append(request)

    async with fake(hold) as server:
        link = Wire(server.url(), timeout_s=30.0, connect_timeout_s=TIMEOUT_S)
        calls = [
            asyncio.ensure_future(link.call(command("ECHO", f"v{i}"))) for i in range(IN_FLIGHT + 5)
        ]
        while len(held) < IN_FLIGHT:
            await asyncio.sleep(0.01)
        assert link.in_flight == IN_FLIGHT
        server.answer = echo
        server.writers[0].write(b"".join(echo(request) or b"" for request in held))
        assert await asyncio.gather(*calls) == [f"v{i}".encode() for i in range(IN_FLIGHT + 5)]
        assert link.in_flight == 0
        await link.aclose()


@synchronous
async def test_an_error_answer_fails_its_own_call_only() -> None:
    def answer(request: list[bytes]) -> bytes:
        if request[-1] == b"bad":
            return b"-ERR Function not found\r\n"
        return echo(request) or b""

    async with fake(answer) as server:
        link = wire(server)
        results = await asyncio.gather(
            link.call(command("ECHO", "a")),
            link.call(command("ECHO", "bad")),
            link.call(command("ECHO", "c")),
            return_exceptions=True,
        )
        assert results[0] == b"a"
        assert isinstance(results[1], redis.ResponseError)
        assert "function not found" in str(results[1]).lower()
        assert results[2] == b"c"
        # The connection goes on.
        assert await link.call(command("ECHO", "d")) == b"d"
        assert len(server.connections) == 1
        await link.aclose()


@synchronous
async def test_a_server_still_loading_its_data_is_a_connection_error() -> None:
    async with fake(
        lambda request: b"-LOADING Redis is loading the dataset in memory\r\n"
    ) as server:
        link = wire(server)
        with pytest.raises(redis.ConnectionError):
            await link.call(command("ECHO", "x"))
        await link.aclose()


@synchronous
async def test_a_silent_server_times_calls_out_and_the_next_call_opens_a_new_connection() -> None:
    silent = True

    def answer(request: list[bytes]) -> bytes | None:
        return None if silent else echo(request)

    async with fake(answer) as server:
        link = wire(server)
        results = await asyncio.gather(
            link.call(command("ECHO", "a")),
            link.call(command("ECHO", "b")),
            return_exceptions=True,
        )
        assert all(isinstance(result, TimeoutError) for result in results)
        silent = False
        assert await link.call(command("ECHO", "c")) == b"c"
        assert len(server.connections) == 2
        await link.aclose()


@synchronous
async def test_a_lost_connection_fails_the_calls_on_it_and_the_next_call_reconnects() -> None:
    async with fake(lambda request: None) as server:
        link = wire(server)
        call = asyncio.ensure_future(link.call(command("ECHO", "a")))
        await server.received.wait()
        server.writers[0].close()
        with pytest.raises(redis.ConnectionError):
            await call
        server.answer = echo
        assert await link.call(command("ECHO", "b")) == b"b"
        assert len(server.connections) == 2
        await link.aclose()


@synchronous
async def test_a_cancelled_caller_leaves_its_answer_to_be_dropped() -> None:
    held: list[bytes] = []

    def answer(request: list[bytes]) -> bytes | None:
        if request[-1] == b"slow":
            held.append(request[-1])
            return None
        return echo(request)

    async with fake(answer) as server:
        link = wire(server)
        slow = asyncio.ensure_future(link.call(command("ECHO", "slow")))
        await server.received.wait()
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        # The server answers the slow call late, then the next one: each answer finds its call.
        server.answer = echo
        writer = server.writers[0]
        writer.write(b"$4\r\nslow\r\n")
        assert await link.call(command("ECHO", "next")) == b"next"
        assert held == [b"slow"]
        await link.aclose()


@synchronous
async def test_the_connection_authenticates_and_selects_its_database_first() -> None:
    async with fake() as server:
        link = Wire(
            server.url(db=9, password="secret"), timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S
        )
        assert await link.call(command("ECHO", "x")) == b"x"
        assert server.connections[0] == [
            [b"AUTH", b"secret"],
            [b"SELECT", b"9"],
            [b"ECHO", b"x"],
        ]
        await link.aclose()


@synchronous
async def test_a_refused_password_is_a_connection_error() -> None:
    def answer(request: list[bytes]) -> bytes | None:
        if request[0] == b"AUTH":
            return b"-WRONGPASS invalid username-password pair\r\n"
        return echo(request)

    async with fake(answer) as server:
        link = Wire(server.url(password="nope"), timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S)
        with pytest.raises(redis.ConnectionError):
            await link.call(command("ECHO", "x"))
        await link.aclose()


@synchronous
async def test_nothing_listening_is_a_connection_error() -> None:
    async with fake() as server:
        url = server.url()
    link = Wire(url, timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S)
    with pytest.raises(redis.ConnectionError):
        await link.call(command("ECHO", "x"))
    await link.aclose()
