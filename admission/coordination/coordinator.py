"""One process's link to the shared admission state in Redis.

The coordinator owns the Redis clients, the process's identity and lease, the heartbeat and the
listener that receives grants for this process's waiters. The waiters and permits themselves are
kept in a `ProcessBook` (waiters.py) that the coordinator and the controllers both use.
Controllers (one per workspace, see `controller.py`) make their decisions through it, one
function call per decision (`protocol.py`), and see it only as a `CoordinationLink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from admission.coordination.controller import CoordinatedController
from admission.coordination.protocol import (
    GRANT,
    Call,
    CoordinationUnavailable,
    Header,
    Heartbeat,
    Message,
    Reassert,
    State,
    Withdraw,
)
from admission.coordination.scripts import function_name, is_missing_function, library_code
from admission.coordination.settings import CoordinationSettings
from admission.coordination.waiters import ProcessBook, Waiter

if TYPE_CHECKING:
    from admission.core.limits import Profile
    from admission.core.registry import AdmissionRegistry

logger = logging.getLogger(__name__)

# How long the grant listener blocks per read; it never polls faster than this when idle.
LISTEN_BLOCK_SECONDS = 1.0
# A process that has not renewed its lease for this share of the TTL stops trusting it.
LEASE_DOUBT_SHARE = 0.8
# Connections one process opens for decisions (the heartbeat and the listener have their own).
POOL_CONNECTIONS = 32

StaleHandler = Callable[[str], Awaitable[None]]
R = TypeVar("R")


def count_key(field: str) -> str:
    """A stored count field (`<len>:<provider>decision|reason`) as `provider|decision|reason`."""
    length, _, rest = field.partition(":")
    size = int(length)
    return f"{rest[:size]}|{rest[size:]}"


class RedisCoordinator:
    """The process-wide coordinator; `controller` is the registry's controller factory."""

    def __init__(
        self,
        settings: CoordinationSettings,
        *,
        on_stale: StaleHandler | None = None,
        process_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.process_id = process_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        )
        self.on_stale = on_stale
        self.epoch = ""
        self.live_processes: int | None = None
        self.last_renewal = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: aioredis.Redis | None = None
        self._listen_client: aioredis.Redis | None = None
        self._sync_client: redis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._resync_lock: asyncio.Lock | None = None
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS)
        self.book = ProcessBook()
        self.controllers: dict[str, CoordinatedController] = {}
        # Decisions made without a round trip, reported with the next heartbeat.
        self.local_counts: dict[str, Counter[tuple[str, str, str]]] = {}
        # Function calls by name (benchmarks and tests count round trips per decision).
        self.round_trips: Counter[str] = Counter()
        # Heartbeat has registered this process; workspaces it is registered in (P:pw).
        self._announced = False
        self._registered: set[str] = set()
        # The header of every call, encoded once per (workspace, epoch).
        self._headers: dict[tuple[str, str], list[bytes]] = {}
        self._closed = False

    @property
    def waiters(self) -> dict[str, Waiter]:
        """This process's waiters by id (a copy, for tests and views)."""
        return {waiter.id: waiter for waiter in self.book.waiters()}

    @property
    def leases(self) -> set[str]:
        """Ids of the permits this process holds (a copy, for tests and views)."""
        return self.book.lease_ids()

    def is_registered(self, workspace_id: str) -> bool:
        return workspace_id in self._registered

    def note_registered(self, workspace_id: str) -> None:
        self._registered.add(workspace_id)

    # ------------------------------------------------------------------ factory

    def controller(self, registry: AdmissionRegistry, profile: Profile) -> CoordinatedController:
        controller = CoordinatedController(registry, profile, self)
        self.controllers[profile.workspace_id] = controller
        return controller

    # ---------------------------------------------------------------- lifecycle

    def _header(self, workspace_id: str, epoch: str) -> list[bytes]:
        key = (workspace_id, epoch)
        packed = self._headers.get(key)
        if packed is None:
            s = self.settings
            packed = Header(
                s.prefix,
                workspace_id,
                s.idle_ttl_ms,
                self.process_id,
                s.lease_ttl_ms,
                epoch,
                s.recovery_grace_ms,
                s.budget_ttl_ms,
            ).pack()
            if len(self._headers) > 4096:
                self._headers.clear()
            self._headers[key] = packed
        return packed

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._closed:
            raise RuntimeError("this coordinator was closed")
        timeout = self.settings.timeout_ms / 1000.0
        no_retry = Retry(NoBackoff(), 0)
        self._client = aioredis.Redis.from_url(
            self.settings.url,
            max_connections=POOL_CONNECTIONS,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=no_retry,
        )
        # Callers beyond the pool's size wait their turn here (cheaper than a blocking pool).
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS)
        self._listen_client = aioredis.Redis.from_url(
            self.settings.url,
            socket_timeout=LISTEN_BLOCK_SECONDS + max(timeout, 1.0),
            socket_connect_timeout=timeout,
            retry=no_retry,
        )
        self._resync_lock = asyncio.Lock()
        self._loop = loop
        self._tasks = [
            loop.create_task(self._heartbeat_loop(), name="sluice-admission-heartbeat"),
            loop.create_task(self._listen_loop(), name="sluice-admission-grants"),
        ]

    async def aclose(self) -> None:
        """Stop the heartbeat and the listener and close the clients (tests, shutdown)."""
        if self._loop is not None and not self._closed:
            # Releases not sent yet go now; decisions counted here are reported (bounded).
            self._flush_releases()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.push_counts(), self._close_grace_s())
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._background:
            # Writes in flight get a bounded time to land; a shutdown never waits on Redis forever
            # (a lease left behind lapses by itself).
            pending = list(self._background)
            _, unfinished = await asyncio.wait(pending, timeout=self._close_grace_s())
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for client in (self._client, self._listen_client):
            if client is not None:
                await client.aclose()
        self._client = self._listen_client = None
        if self._sync_client is not None:
            self._sync_client.close()
            self._sync_client = None
        self._loop = None

    def _close_grace_s(self) -> float:
        return max(1.0, 4 * self.settings.timeout_ms / 1000.0)

    def background(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run a coroutine on the process loop, kept referenced until it finishes.

        Called from the loop's thread (running or not); before the coordinator ever ran on a
        loop there is nothing in Redis to act on, and the coroutine is dropped.
        """
        loop: asyncio.AbstractEventLoop | None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
        if loop is None or loop.is_closed():
            coroutine.close()
            return None
        task = loop.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _flush_releases(self) -> None:
        for controller in list(self.controllers.values()):
            controller.flush_releases()

    async def settle(self) -> None:
        """Wait for the releases and other writes this process has started, then report the
        decisions counted here (operators' views read them from Redis)."""
        self._flush_releases()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await self.push_counts()

    async def push_counts(self) -> None:
        """Report the decisions counted since the last heartbeat now (a heartbeat)."""
        if not any(self.local_counts.values()) or self._loop is None or self._closed:
            return
        with contextlib.suppress(CoordinationUnavailable):
            await self._heartbeat()

    # -------------------------------------------------------------------- calls

    async def call(self, workspace_id: str, call: Call[R]) -> R:
        """Run one function; one round trip. Raises `CoordinationUnavailable`."""
        raw = await self._call_raw(workspace_id, call)
        return call.parse(raw)

    async def write(self, workspace_id: str, call: Call[R]) -> R | None:
        """A call that must land (a release, a withdrawal, a grant taken or handed back):
        retried every heartbeat interval until Redis answers, however long it is away, or the
        coordinator closes (then None). Every function is safe to repeat. Never giving up is
        what keeps the shared state free of permits nobody holds: a live process renews its
        lease, so nothing else would ever free them."""
        delay = self.settings.heartbeat_ms / 1000.0
        while True:
            try:
                return await self.call(workspace_id, call)
            except CoordinationUnavailable:
                if self._closed:
                    return None
                await asyncio.sleep(delay)

    async def _call_raw(self, workspace_id: str, call: Call[Any]) -> dict[str, Any]:
        name = call.entry
        self._bind()
        if not self._announced and name != "heartbeat":
            # The process is known to the deployment (alive, reapable) before its first decision.
            await self._heartbeat()
        assert self._client is not None
        self.round_trips[name] += 1
        try:
            raw = await self._fcall(workspace_id, call)
        except redis.ResponseError as error:
            # A function that fails is a bug, not an outage: say so loudly, and fail closed.
            logger.error("admission function %s failed: %s", name, error)
            raise CoordinationUnavailable(f"function {name} failed: {error}") from error
        except (TimeoutError, redis.RedisError, OSError, EOFError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error
        result: dict[str, Any] = json.loads(raw)
        self.last_renewal = time.monotonic()
        if result.get("st") == "epoch":
            await self.resync(str(result["ep"]))
            return await self._call_raw(workspace_id, call)
        self._note_epoch(result)
        return result

    async def _fcall(self, workspace_id: str, call: Call[Any]) -> Any:
        client = self._client
        assert client is not None
        name = function_name(call.entry)
        header = self._header(workspace_id, self.epoch)
        reconnected = loaded = False
        while True:
            try:
                async with self._slots:
                    return await client.fcall(name, 0, *header, *call.pack())
            except (redis.ConnectionError, ConnectionError):
                if reconnected:
                    raise
                # Pooled connections die together (Redis restarted, the network blinked): drop
                # them all and try once more on a fresh one. Every function is safe to repeat
                # (the first copy may have run: the call says so when it matters).
                reconnected = True
                call = call.repeated()
                await client.connection_pool.disconnect()
            except redis.ResponseError as error:
                if loaded or not is_missing_function(error):
                    raise
                # A Redis that restarted has lost the library: load it, then call again.
                loaded = True
                await client.function_load(library_code(), replace=True)

    def _sync(self) -> redis.Redis:
        if self._sync_client is None:
            timeout = max(self.settings.timeout_ms / 1000.0, 1.0)
            self._sync_client = redis.Redis.from_url(
                self.settings.url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        return self._sync_client

    def call_sync(self, workspace_id: str, call: Call[R]) -> R:
        """Run one function from outside the event loop (profile installs, operator views)."""
        client = self._sync()
        name = call.entry
        # A synchronous caller cannot re-assert permits; it speaks for no epoch.
        header = self._header(workspace_id, "")
        args = call.pack()
        try:
            try:
                raw = client.fcall(function_name(name), 0, *header, *args)
            except redis.ResponseError as error:
                if not is_missing_function(error):
                    raise
                client.function_load(library_code(), replace=True)
                raw = client.fcall(function_name(name), 0, *header, *args)
        except (redis.RedisError, OSError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error
        return call.parse(json.loads(raw))

    def live_processes_sync(self) -> int:
        """How many processes hold an unexpired lease on the shared state now (operators'
        views). Raises `CoordinationUnavailable`."""
        client = self._sync()
        try:
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros / 1000.0
            return int(client.zcount(f"{self.settings.prefix}:procs", f"({now_ms}", "+inf"))
        except (redis.RedisError, OSError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error

    def state_sync(
        self, workspace_id: str, *, principal_id: str = "", minutes: int = 0
    ) -> dict[str, Any]:
        """What Redis holds for a workspace now, from outside any event loop (operators' views,
        metrics): every scope's active and queued figures, limits, breakers, pauses, waiters,
        leases, per-minute decision counts for the last `minutes` and running totals. Count
        keys are `provider|decision|reason` (see `count_key`). Raises `CoordinationUnavailable`.
        """
        result = self.call_sync(workspace_id, State(principal_id, minutes))
        for name in ("counts", "totals"):
            if name == "counts":
                result[name] = {
                    minute: {count_key(k): v for k, v in counts.items()}
                    for minute, counts in (result.get(name) or {}).items()
                }
            else:
                result[name] = {count_key(k): v for k, v in (result.get(name) or {}).items()}
        result["transitions"] = [json.loads(item) for item in result.get("transitions") or ()]
        return result

    def _note_epoch(self, result: dict[str, Any]) -> None:
        epoch = result.get("ep")
        if epoch and not self.epoch:
            self.epoch = str(epoch)

    async def resync(self, epoch: str) -> None:
        """The shared state was lost (or this process was given up for dead): put back the
        permits this process still holds and queue its waiters again, then go on."""
        assert self._resync_lock is not None
        async with self._resync_lock:
            if epoch == self.epoch:
                return
            logger.warning(
                "admission state in Redis was reset (epoch %s -> %s); re-asserting %d lease(s) "
                "and %d waiter(s)",
                self.epoch or "-",
                epoch,
                self.book.lease_count,
                self.book.waiter_count,
            )
            self.epoch = epoch
            self._registered.clear()
            await self._reassert()
            self.book.requeue_all()

    async def _reassert(self) -> None:
        for workspace_id, records in self.book.lease_records().items():
            await self.call(workspace_id, Reassert(tuple(records)))

    # ---------------------------------------------------------------- background

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_ms / 1000.0
        # A cancellation swallowed by a client timeout must not keep a closed loop alive.
        while not self._closed:
            try:
                await self._heartbeat()
            except CoordinationUnavailable as error:
                self._doubt_leases()
                logger.debug("admission heartbeat failed: %s", error)
            except Exception:
                logger.exception("admission heartbeat failed")
            await asyncio.sleep(interval)

    async def _heartbeat(self) -> None:
        counts = {ws: dict(counter) for ws, counter in self.local_counts.items() if counter}
        self.local_counts = {}
        settled_before = time.monotonic() - 2 * self.settings.heartbeat_ms / 1000.0
        audit = self.book.auditable(settled_before)
        try:
            result = await self.call("", Heartbeat(counts, audit))
        except CoordinationUnavailable:
            # Keep what was not reported for the next beat.
            for ws, counter in counts.items():
                self.local_counts.setdefault(ws, Counter()).update(counter)
            raise
        self._announced = True
        self.live_processes = result.live
        for entry in result.audit:
            waiter = self.book.waiter(entry.waiter_id)
            if waiter is None or not waiter.auditable(settled_before):
                continue
            if entry.kind == GRANT:
                logger.warning("admission grant for waiter %s was lost; taking it", waiter.id)
                waiter.owner.on_message(waiter, entry)
            else:
                logger.warning("waiter %s is no longer queued in Redis; queueing again", waiter.id)
                waiter.owner.requeue(waiter)
        if result.reborn:
            self._registered.clear()
        if result.reborn and self.book.lease_count:
            # This process had been given up for dead (its lease lapsed): its permits were
            # returned to the pool, so it puts back the ones it still holds.
            logger.warning("admission lease of this process had lapsed; re-asserting permits")
            await self._reassert()

    def _doubt_leases(self) -> None:
        """Without a renewal for most of the lease TTL, stop the calls those permits cover."""
        silent_ms = (time.monotonic() - self.last_renewal) * 1000.0
        if silent_ms < self.settings.lease_ttl_ms * LEASE_DOUBT_SHARE:
            return
        self.book.doubt_leases()

    async def _listen_loop(self) -> None:
        key = f"{self.settings.prefix}:g:{self.process_id}"
        # A cancellation swallowed by a client timeout must not keep a closed loop alive.
        while not self._closed:
            client = self._listen_client
            if client is None:
                return
            try:
                item = await client.blpop([key], timeout=LISTEN_BLOCK_SECONDS)
            except Exception as error:
                # Whatever broke the connection, the listener must live on: waiters depend on it.
                logger.debug("admission grant listener: %s: %s", type(error).__name__, error)
                await asyncio.sleep(self.settings.heartbeat_ms / 1000.0)
                continue
            if item is None:
                continue
            try:
                self._deliver(Message.decode(item[1]))
            except Exception:
                logger.exception("admission grant could not be handled")

    def _deliver(self, message: Message) -> None:
        if self.book.deliver(message):
            return
        if message.kind == GRANT and not self.book.holds_lease(message.waiter_id):
            # A grant for a waiter this process no longer has (it gave up, or its acquire's
            # answer was lost): back to the pool at once, not after the grant lapses.
            logger.info("grant for waiter %s that left; handing it back", message.waiter_id)
            self.background(
                self.write(message.workspace_id, Withdraw(message.waiter_id, "cancelled"))
            )

    # ------------------------------------------------------------------- counts

    def count_local(self, workspace_id: str, provider_id: str, decision: str, reason: str) -> None:
        counter = self.local_counts.get(workspace_id)
        if counter is None:
            counter = self.local_counts[workspace_id] = Counter()
        counter[(provider_id, decision, reason)] += 1

    async def refresh(self, workspace_id: str) -> None:
        """Ask the host to bring this process's profile of the workspace up to date."""
        if self.on_stale is not None:
            await self.on_stale(workspace_id)
