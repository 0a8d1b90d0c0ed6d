"""A pipelined connection to one Redis server for the process's function calls.

Every decision is one FCALL. Through redis-py's asyncio client each call checks a connection out
of the pool, packs its arguments one by one, writes them with a system call of its own and
reads its answer on that connection; with several callers in one process, most of the client's
CPU goes there. `Wire` keeps one connection instead: the calls made in one turn of the event loop
leave in one write, their answers come back in order on the same connection and each resolves
its caller's future. A call arrives already packed (`command`, or bytes a caller packed once and
keeps): nothing about it is encoded again.

What a call may raise is what redis-py raises: `redis.ResponseError` for an error answer,
`redis.ConnectionError` when the connection is lost or cannot be opened, and `TimeoutError` when
Redis does not answer within the timeout. A call that times out ends the connection (every call
behind it on that connection fails with it, as their answers would come after its own), and the
next call opens a new one. A caller cancelled while its call is in flight leaves it to run; its
answer is read and dropped. Only plain TCP and Unix sockets (`redis://`, `unix://`): TLS and Redis
Cluster URLs keep redis-py's clients (see `coordinator.py`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis
import redis
from redis.asyncio.connection import parse_url

__all__ = ["IN_FLIGHT", "Wire", "command", "supports"]

# Calls one process has on the wire at once; more wait their turn before they are sent (and
# before their timeout starts), so a burst of callers never queues more behind one call than
# Redis answers well within the timeout.
IN_FLIGHT = 128


def supports(url: str) -> bool:
    """Whether `Wire` can talk to the server the URL names."""
    return url.startswith(("redis://", "unix://"))


# Error answers that say the server cannot serve the connection yet (or at all), which callers
# treat as a lost connection, as redis-py does; every other error answer is a `ResponseError`.
_CONNECTION_ERRORS: dict[str, type[redis.ConnectionError]] = {
    "LOADING": redis.BusyLoadingError,
    "NOAUTH": redis.AuthenticationError,
    "WRONGPASS": redis.AuthenticationError,
}


def _error(reply: redis.ResponseError) -> redis.RedisError:
    message = str(reply)
    kind = _CONNECTION_ERRORS.get(message.partition(" ")[0])
    return reply if kind is None else kind(message)


def command(*args: str | bytes | int | float) -> bytes:
    """One command in Redis's protocol."""
    # (hiredis's stubs type the tuple as one item long.)
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


class _Connection(asyncio.Protocol):
    """One open connection: calls written and not yet answered, oldest first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._reader = hiredis.Reader(replyError=redis.ResponseError)
        self._transport: asyncio.Transport | None = None
        # (the caller's future, when its answer is due), in the order they were written.
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._outgoing: list[bytes] = []
        self._watchdog: asyncio.TimerHandle | None = None
        self.closed = False

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self.closed:
            transport.abort()  # given up on while it was being opened

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        pending = self._pending
        try:
            reader.feed(data)
            while True:
                reply = reader.gets()
                if reply is False:
                    return
                if not pending:
                    raise redis.ConnectionError("an answer nobody asked for")
                future = pending.popleft()[0]
                if future.done():
                    continue  # its caller was cancelled: the answer is dropped
                if isinstance(reply, redis.ResponseError):
                    future.set_exception(_error(reply))
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, redis.ConnectionError) as error:
            self.abort(redis.ConnectionError(f"protocol error: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(redis.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    # ---------------------------------------------------------------------- calls

    @property
    def unanswered(self) -> int:
        return len(self._pending)

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Queue one packed command; it leaves with the others of this loop turn."""
        if self.closed:
            raise redis.ConnectionError("connection to Redis closed")
        loop = self._loop
        future = loop.create_future()
        pending = self._pending
        due = loop.time() + self._timeout_s
        pending.append((future, due))
        outgoing = self._outgoing
        if len(pending) == 1:
            # Nothing else in flight: out at once. Calls made while others are in flight
            # leave together at the end of this loop turn.
            assert self._transport is not None
            self._transport.write(packed)
        else:
            outgoing.append(packed)
            if len(outgoing) == 1:
                loop.call_soon(self._flush)
        if self._watchdog is None:
            self._watchdog = loop.call_at(due, self._check)
        return future

    def _flush(self) -> None:
        outgoing = self._outgoing
        if not outgoing or self.closed:
            return
        self._outgoing = []
        assert self._transport is not None
        self._transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    def _check(self) -> None:
        """The oldest call unanswered past its time ends the connection."""
        self._watchdog = None
        pending = self._pending
        if not pending:
            return
        due = pending[0][1]
        if due <= self._loop.time():
            self.abort(TimeoutError("Redis did not answer in time"))
            return
        self._watchdog = self._loop.call_at(due, self._check)

    def abort(self, error: Exception) -> None:
        """End the connection now; every call still waiting on it fails with `error`."""
        self._fail(error)
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        self._outgoing = []
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending = self._pending
        while pending:
            future = pending.popleft()[0]
            if not future.done():
                # One exception per caller: each raises (and chains) its own.
                future.set_exception(type(error)(*error.args))


class Wire:
    """The process's pipelined connection to one Redis server (opened on first use, and again
    after it was lost or timed out)."""

    def __init__(self, url: str, *, timeout_s: float, connect_timeout_s: float) -> None:
        if not supports(url):
            raise ValueError(f"not a single-server Redis URL: {url!r}")
        self._options = parse_url(url)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._connection: _Connection | None = None
        self._opening: asyncio.Lock | None = None
        self._turns = asyncio.Semaphore(IN_FLIGHT)
        self._closed = False

    async def call(self, packed: bytes) -> Any:
        """Send one packed command and wait for its answer."""
        async with self._turns:
            connection = self._connection
            if connection is None or connection.closed:
                connection = await self._open()
            return await connection.send(packed)

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered yet."""
        connection = self._connection
        return 0 if connection is None or connection.closed else connection.unanswered

    def drop(self) -> None:
        """Abandon the current connection (the next call opens a new one)."""
        connection = self._connection
        self._connection = None
        if connection is not None and not connection.closed:
            connection.abort(redis.ConnectionError("connection dropped"))

    async def aclose(self) -> None:
        self._closed = True
        self.drop()

    async def _open(self) -> _Connection:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            connection = self._connection
            if connection is not None and not connection.closed:
                return connection
            if self._closed:
                raise redis.ConnectionError("this connection to Redis was closed")
            connection = await self._connect()
            self._connection = connection
            return connection

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        options = self._options
        connection = _Connection(loop, self._timeout_s)
        try:
            if "path" in options:
                opening = loop.create_unix_connection(lambda: connection, options["path"])
            else:
                opening = loop.create_connection(
                    lambda: connection, options.get("host", "localhost"), options.get("port", 6379)
                )
            await asyncio.wait_for(opening, self._connect_timeout_s)
        except (OSError, TimeoutError) as error:
            connection.abort(redis.ConnectionError(str(error)))
            raise redis.ConnectionError(
                f"cannot connect to Redis: {type(error).__name__}: {error}"
            ) from error
        handshake = []
        password = options.get("password")
        if password:
            username = options.get("username")
            auth = ("AUTH", username, password) if username else ("AUTH", password)
            handshake.append(command(*auth))
        if options.get("db"):
            handshake.append(command("SELECT", int(options["db"])))
        try:
            for reply in [connection.send(packed) for packed in handshake]:
                await reply
        except redis.ResponseError as error:
            connection.abort(redis.ConnectionError(str(error)))
            raise redis.ConnectionError(f"Redis refused the connection: {error}") from error
        except BaseException:
            connection.abort(redis.ConnectionError("connection setup interrupted"))
            raise
        return connection
