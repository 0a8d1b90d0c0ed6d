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
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from admission.coordination.clients import (
    AsyncClient,
    SyncClient,
    async_client,
    call_keys,
    is_cluster,
    registry_key,
    route_key,
    slot_of,
    sync_client,
)
from admission.coordination.controller import CoordinatedController
from admission.coordination.protocol import (
    GRANT,
    Call,
    CoordinationUnavailable,
    Header,
    Heartbeat,
    HeartbeatResult,
    Message,
    Reassert,
    State,
    Withdraw,
)
from admission.coordination.scripts import function_name, is_missing_function, library_code
from admission.coordination.settings import CoordinationSettings
from admission.coordination.waiters import QUEUED, ProcessBook, Waiter
from admission.coordination.wire import Wire, command, supports

if TYPE_CHECKING:
    from admission.core.limits import Profile
    from admission.core.registry import AdmissionRegistry

logger = logging.getLogger(__name__)

# How long the grant listener blocks per read; it never polls faster than this when idle.
LISTEN_BLOCK_SECONDS = 1.0
# Blocking connections one process holds for grants, per node: one per hash slot where a waiter
# of the process waits, at most this many (a slot beyond it is listened to once one frees up;
# meanwhile its grants reach their waiters through the heartbeat's audit).
LISTEN_CONNECTIONS = 16
# A process that has not renewed its lease for this share of the TTL stops trusting it.
LEASE_DOUBT_SHARE = 0.8
# Connections one process opens for decisions (the heartbeat and the listener have their own).
POOL_CONNECTIONS = 32

StaleHandler = Callable[[str], Awaitable[None]]
R = TypeVar("R")


# What a cluster answers while a slot moves or has no primary: an outage, not a bug.
_MOVING = (
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
    redis.exceptions.ClusterDownError,
)
_MOVING_TEXT = ("non local key", "cluster is down", "tryagain")


def _is_moving(error: redis.ResponseError) -> bool:
    text = str(error).lower()
    return isinstance(error, _MOVING) or any(part in text for part in _MOVING_TEXT)


def _unavailable(name: str, error: redis.ResponseError) -> CoordinationUnavailable:
    """A function call's error as the refusal it is. A slot that moves between primaries or has
    none is an outage like any other; a function that fails otherwise is a bug: said loudly."""
    if _is_moving(error):
        logger.debug("admission function %s: slot unavailable: %s", name, error)
        return CoordinationUnavailable(f"{type(error).__name__}: {error}")
    logger.error("admission function %s failed: %s", name, error)
    return CoordinationUnavailable(f"function {name} failed: {error}")


def _unmet_node(error: AttributeError) -> redis.RedisError:
    """redis-py's cluster clients fail this way when a slot that moves sends them (ASK) to a
    primary they have not met yet (one just added to the cluster): the slot is moving, an
    outage like the others (the call would only be answered TRYAGAIN there)."""
    return redis.exceptions.ClusterError(f"redirected to a node not known yet: {error}")


def _slot_keys(prefix: str, call: Call[Any]) -> tuple[str, ...]:
    """Keys of the slot a heartbeat acts in, to take its fence from (its routing key may be the
    registry's, which has no hash tag)."""
    if isinstance(call, Heartbeat):
        named = [*call.epochs, *call.counts, *call.audit]
        return tuple(route_key(prefix, ws) for ws in named[:1])
    return ()


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
        # The epoch of each workspace's shared state this process knows (see lib.lua).
        self.epochs: dict[str, str] = {}
        self.live_processes: int | None = None
        self.last_renewal = time.monotonic()
        # When each workspace's hash slot last answered (on a cluster, shards fail apart).
        self._renewed: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cluster = is_cluster(settings.url)
        self._client: AsyncClient | None = None
        # Function calls to one Redis server go through one pipelined connection (wire.py);
        # a cluster (or TLS) keeps redis-py's client.
        self._wire: Wire | None = None
        self._listen_client: AsyncClient | None = None
        self._sync_client: SyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Grant listeners by hash slot (one slot, None, on a single Redis), while a waiter of
        # this process waits there, and the grant lists each one blocks on now.
        self._listeners: dict[int | None, asyncio.Task[None]] = {}
        self._heard: dict[int | None, set[str]] = {}
        self._groups: dict[str, int | None] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # Set while no heartbeat is under way: one under way holds the counts it reports.
        self._beat_idle: asyncio.Event | None = None
        self._resync_lock: asyncio.Lock | None = None
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS)
        self.book = ProcessBook()
        self.controllers: dict[str, CoordinatedController] = {}
        # Decisions made without a round trip, reported with the next heartbeat.
        self.local_counts: dict[str, Counter[tuple[str, str, str]]] = {}
        # Function calls by name (benchmarks and tests count round trips per decision).
        self.round_trips: Counter[str] = Counter()
        # Heartbeat has registered this process; workspaces it is registered in (P:{ws}:procs),
        # and every workspace it has acted in (its heartbeat renews its lease in each).
        self._announced = False
        self._registered: set[str] = set()
        self._acting: set[str] = set()
        # Calls under way and the last call's time, by workspace (see `_retire_idle`).
        self._inflight: Counter[str] = Counter()
        self._active_at: dict[str, float] = {}
        # The header of every call, encoded once per (workspace, epoch).
        self._headers: dict[tuple[str, str], list[bytes]] = {}
        # (entry, key, workspace, epoch) -> the call's constant part in Redis's protocol (all
        # but the count of its arguments and its own arguments).
        self._heads: dict[tuple[str, str, str, str], bytes] = {}
        self._route_keys: dict[str, str] = {}
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
        self._acting.add(workspace_id)

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

    def _route_key(self, workspace_id: str) -> str:
        key = self._route_keys.get(workspace_id)
        if key is None:
            if len(self._route_keys) > 4096:
                self._route_keys.clear()
            key = self._route_keys[workspace_id] = route_key(self.settings.prefix, workspace_id)
        return key

    def _packed(
        self, name: str, key: str, workspace_id: str, epoch: str, arguments: list[Any]
    ) -> bytes:
        """The whole FCALL in Redis's protocol: its constant head (function, key, header) is
        encoded once per entry, workspace and epoch; only the call's own arguments are new."""
        head_key = (name, key, workspace_id, epoch)
        head = self._heads.get(head_key)
        if head is None:
            whole = command(
                "FCALL", function_name(name), 1, key, *self._header(workspace_id, epoch)
            )
            head = whole[whole.index(b"\r\n") + 2 :]
            if len(self._heads) > 4096:
                self._heads.clear()
            self._heads[head_key] = head
        count = 4 + Header.SIZE + len(arguments)
        if not arguments:
            return b"*%d\r\n%b" % (count, head)
        body = command(*arguments)
        return b"*%d\r\n%b%b" % (count, head, body[body.index(b"\r\n") + 2 :])

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._closed:
            raise RuntimeError("this coordinator was closed")
        timeout = self.settings.timeout_ms / 1000.0
        no_retry = AsyncRetry(NoBackoff(), 0)
        if supports(self.settings.url):
            self._wire = Wire(self.settings.url, timeout_s=timeout, connect_timeout_s=timeout)
        else:
            self._client = async_client(
                self.settings.url,
                max_connections=POOL_CONNECTIONS,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=no_retry,
            )
        # Callers beyond the pool's size wait their turn here (cheaper than a blocking pool).
        self._slots = asyncio.Semaphore(POOL_CONNECTIONS)
        self._listen_client = async_client(
            self.settings.url,
            max_connections=LISTEN_CONNECTIONS,
            client_name=f"sluice-grants:{self.process_id}",
            socket_timeout=LISTEN_BLOCK_SECONDS + max(timeout, 1.0),
            socket_connect_timeout=timeout,
            retry=no_retry,
        )
        self._resync_lock = asyncio.Lock()
        self._loop = loop
        self._tasks = [
            loop.create_task(self._heartbeat_loop(), name="sluice-admission-heartbeat"),
        ]
        self._listeners = {}
        self._heard = {}
        for group in {self._group_of(ws) for ws in self._waiting_workspaces()}:
            self._start_listener(group)

    async def aclose(self) -> None:
        """Stop the heartbeat and the listener and close the clients (tests, shutdown); closing
        a closed coordinator does nothing."""
        if self._closed and self._loop is None:
            return
        if self._loop is not None and not self._closed:
            # Releases not sent yet go now; decisions counted here are reported (bounded).
            self._flush_releases()
            await self._beat_ended(self._close_grace_s())
            self.push_counts()
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._listeners = {}
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
        if self._wire is not None:
            await self._wire.aclose()
            self._wire = None
        if self._sync_client is not None:
            self._sync_client.close()
            self._sync_client = None
        self._loop = None

    def _close_grace_s(self) -> float:
        return max(1.0, 4 * self.settings.timeout_ms / 1000.0)

    def background(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any] | None:
        """Run a coroutine on the process loop, kept referenced until it finishes.

        Called from the loop's thread (running or not); before the coordinator ever ran on a
        loop there is nothing in Redis to act on, and after it was closed there is no client to
        act with: either way the coroutine is dropped (a lease it would have given back lapses).
        """
        if self._closed and self._loop is None:
            coroutine.close()
            return None
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
        # A heartbeat under way carries counts taken from `local_counts`; they are in Redis, or
        # back here for the push below, once it ends.
        await self._beat_ended(None)
        self.push_counts()

    async def _beat_ended(self, timeout: float | None) -> None:
        idle = self._beat_idle
        if idle is not None and not idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(idle.wait(), timeout)

    def push_counts(self) -> None:
        """Report the decisions counted here since the last heartbeat now: counts only (no
        renewal, no audit), one call per hash slot, on the synchronous client so that nothing
        else of this process moves meanwhile (settling is a quiet point)."""
        if self._closed:
            return
        counts = {ws: dict(counter) for ws, counter in self.local_counts.items() if counter}
        if not counts:
            return
        self.local_counts = {}
        groups: dict[int | None, Heartbeat] = {}
        for ws, by_label in counts.items():
            key = route_key(self.settings.prefix, ws)
            slot = self._group(key)
            beat = groups.get(slot)
            if beat is None:
                beat = groups[slot] = Heartbeat({}, {}, {}, registry=False, key=key)
            beat.counts[ws] = by_label
        for beat in groups.values():
            try:
                self._call_sync(beat.key, self._header("", ""), beat)
            except CoordinationUnavailable:
                # Kept for the next beat.
                for ws, by_label in beat.counts.items():
                    self.local_counts.setdefault(ws, Counter()).update(by_label)

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
        self.round_trips[name] += 1
        if name == "reassert":
            self._acting.add(workspace_id)
        epoch = self.epochs.get(workspace_id, "")
        self._inflight[workspace_id] += 1
        self._active_at[workspace_id] = time.monotonic()
        try:
            raw = await self._fcall(
                name, self._route_key(workspace_id), workspace_id, epoch, call.pack(), call
            )
        except redis.ResponseError as error:
            raise _unavailable(name, error) from error
        except (TimeoutError, redis.RedisError, OSError, EOFError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error
        finally:
            self._inflight[workspace_id] -= 1
            self._active_at[workspace_id] = time.monotonic()
        result: dict[str, Any] = json.loads(raw)
        self.last_renewal = self._renewed[workspace_id] = time.monotonic()
        if result.get("st") == "epoch":
            await self.resync(workspace_id, str(result["ep"]))
            return await self._call_raw(workspace_id, call)
        self._note_epoch(workspace_id, result)
        return result

    async def _fcall(
        self,
        name: str,
        key: str,
        workspace_id: str,
        epoch: str,
        arguments: list[Any],
        call: Call[Any] | None = None,
        fence_from: tuple[str, ...] = (),
    ) -> Any:
        """One function call naming `key` (the hash slot it acts in, for a cluster's routing),
        with the header of `workspace_id` at `epoch`, then `arguments`; `call`, when given,
        says what to send again if the first copy may have run. On a cluster the call names
        the slot's fence too (`call_keys`; `fence_from` are keys of the same slot to take it
        from when `key` has no hash tag)."""
        wire = self._wire
        reconnected = loaded = False
        while True:
            try:
                if wire is not None:
                    return await wire.call(self._packed(name, key, workspace_id, epoch, arguments))
                client = self._client
                assert client is not None
                async with self._slots:
                    keys = call_keys(key, *fence_from) if self._cluster else (key,)
                    return await client.fcall(
                        function_name(name),
                        len(keys),
                        *keys,
                        *self._header(workspace_id, epoch),
                        *arguments,
                    )
            except AttributeError as error:
                if not self._cluster:
                    raise
                raise _unmet_node(error) from error
            except (redis.ConnectionError, ConnectionError):
                if reconnected:
                    raise
                # Connections die together (Redis restarted, the network blinked): drop them
                # and try once more on a fresh one. Every function is safe to repeat (the first
                # copy may have run: the call says so when it matters). A cluster client renews
                # its connections (and its map of the slots) by itself.
                reconnected = True
                if call is not None:
                    arguments = call.repeated().pack()
                # (A lost wire opens a new connection by itself on the next call.)
                if wire is None and isinstance(self._client, redis.asyncio.Redis):
                    await self._client.connection_pool.disconnect()
            except redis.ResponseError as error:
                if loaded or not is_missing_function(error):
                    raise
                # A Redis that restarted has lost the library: load it (on a cluster, on every
                # primary), then call again.
                loaded = True
                if wire is not None:
                    await wire.call(command("FUNCTION", "LOAD", "REPLACE", library_code()))
                else:
                    assert self._client is not None
                    await self._client.function_load(library_code(), replace=True)

    def _sync(self) -> SyncClient:
        if self._sync_client is None:
            timeout = max(self.settings.timeout_ms / 1000.0, 1.0)
            self._sync_client = sync_client(
                self.settings.url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),
            )
        return self._sync_client

    def call_sync(self, workspace_id: str, call: Call[R]) -> R:
        """Run one function from outside the event loop (profile installs, operator views)."""
        # A synchronous caller cannot re-assert permits; it speaks for no epoch.
        key = route_key(self.settings.prefix, workspace_id)
        return self._call_sync(key, self._header(workspace_id, ""), call)

    def _call_sync(self, key: str, header: list[bytes], call: Call[R]) -> R:
        client = self._sync()
        name = function_name(call.entry)
        args = call.pack()
        keys: tuple[str, ...] = (key,)
        if self._cluster:
            keys = call_keys(key, *_slot_keys(self.settings.prefix, call))
        try:
            try:
                raw = client.fcall(name, len(keys), *keys, *header, *args)
            except AttributeError as error:
                if not self._cluster:
                    raise
                raise _unmet_node(error) from error
            except redis.ResponseError as error:
                if not is_missing_function(error):
                    raise
                client.function_load(library_code(), replace=True)
                raw = client.fcall(name, len(keys), *keys, *header, *args)
        except (redis.RedisError, OSError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error
        return call.parse(json.loads(raw))

    def live_processes_sync(self) -> int:
        """How many processes hold an unexpired lease on the shared state now (operators'
        views). Raises `CoordinationUnavailable`."""
        client = self._sync()
        key = registry_key(self.settings.prefix)
        try:
            if isinstance(client, redis.Redis):
                seconds, micros = client.time()
            else:
                # The server clock of the registry's own node.
                node = client.get_node_from_key(key)
                seconds, micros = client.time(target_nodes=node)
            now_ms = seconds * 1000 + micros / 1000.0
            return int(client.zcount(key, f"({now_ms}", "+inf"))
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

    def _note_epoch(self, workspace_id: str, result: dict[str, Any]) -> None:
        epoch = result.get("ep")
        if epoch and workspace_id and workspace_id not in self.epochs:
            self.epochs[workspace_id] = str(epoch)

    async def resync(self, workspace_id: str, epoch: str) -> None:
        """A workspace's shared state was lost (Redis restarted, or a replica took over from a
        failed primary): put back the permits this process still holds there and queue its
        waiters there again, then go on."""
        assert self._resync_lock is not None
        async with self._resync_lock:
            known = self.epochs.get(workspace_id)
            if epoch == known:
                return
            records = self.book.lease_records().get(workspace_id, [])
            waiters = [w for w in self.book.waiters() if w.owner.workspace_id == workspace_id]
            logger.warning(
                "admission state of workspace %s in Redis was reset (epoch %s -> %s); "
                "re-asserting %d lease(s) and %d waiter(s)",
                workspace_id,
                known or "-",
                epoch,
                len(records),
                len(waiters),
            )
            self.epochs[workspace_id] = epoch
            self._registered.discard(workspace_id)
            # Always called: it also gives back what the state kept of permits this process
            # released meanwhile (a promoted replica may lack the release).
            await self.call(workspace_id, Reassert(tuple(records)))
            for waiter in waiters:
                waiter.owner.requeue(waiter)

    async def _reassert(self, workspace_id: str) -> None:
        records = self.book.lease_records().get(workspace_id)
        if records:
            await self.call(workspace_id, Reassert(tuple(records)))

    # ---------------------------------------------------------------- background

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_ms / 1000.0
        # A cancellation swallowed by a client timeout must not keep a closed loop alive.
        self._beat_idle = idle = asyncio.Event()
        idle.set()
        while not self._closed:
            idle.clear()
            try:
                await self._heartbeat()
            except CoordinationUnavailable as error:
                self._doubt_leases()
                logger.debug("admission heartbeat failed: %s", error)
            except Exception:
                logger.exception("admission heartbeat failed")
            finally:
                idle.set()
            await asyncio.sleep(interval)

    def _group(self, key: str) -> int | None:
        """The hash slot of a key on a cluster; None on a single Redis (one group for all)."""
        return slot_of(key) if self._cluster else None

    def _retire_idle(self) -> None:
        """Stop renewing this process's lease in workspaces where it holds nothing, waits for
        nothing, has no call under way and has made no call for a whole lease TTL: the
        heartbeat's cost follows the workspaces in use, not every one ever touched. Its lease
        there lapses (a reaper finds nothing to free); its next decision there registers again.
        """
        now = time.monotonic()
        idle_s = self.settings.lease_ttl_ms / 1000.0
        holding = set(self.book.lease_records())
        holding.update(waiter.owner.workspace_id for waiter in self.book.waiters())
        for ws in list(self._acting):
            if ws in holding or self._inflight[ws] > 0:
                continue
            if now - self._active_at.get(ws, now) < idle_s:
                continue
            self._acting.discard(ws)
            self._registered.discard(ws)

    async def _heartbeat(self) -> None:
        self._retire_idle()
        prefix = self.settings.prefix
        counts = {ws: dict(counter) for ws, counter in self.local_counts.items() if counter}
        self.local_counts = {}
        settled_before = time.monotonic() - 2 * self.settings.heartbeat_ms / 1000.0
        audit = self.book.auditable(settled_before)
        # One call per hash slot (one call in all on a single Redis).
        groups: dict[int | None, Heartbeat] = {}

        def group(key: str) -> Heartbeat:
            slot = self._group(key)
            beat = groups.get(slot)
            if beat is None:
                beat = groups[slot] = Heartbeat({}, {}, {}, registry=False, key=key)
            return beat

        group(registry_key(prefix)).registry = True
        for ws in sorted(self._acting):
            group(route_key(prefix, ws)).epochs[ws] = self.epochs.get(ws, "")
        for ws, by_label in counts.items():
            group(route_key(prefix, ws)).counts[ws] = by_label
        for ws, ids in audit.items():
            group(route_key(prefix, ws)).audit[ws] = ids
        outcomes = await asyncio.gather(
            *(self._heartbeat_call(beat) for beat in groups.values()), return_exceptions=True
        )
        failure: BaseException | None = None
        for beat, outcome in zip(groups.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failure = outcome
                # Keep what was not reported for the next beat.
                for ws, by_label in beat.counts.items():
                    self.local_counts.setdefault(ws, Counter()).update(by_label)
                continue
            await self._heartbeat_answered(outcome, settled_before)
        if failure is not None:
            raise failure
        self._announced = True

    async def _heartbeat_call(self, beat: Heartbeat) -> HeartbeatResult:
        self._bind()
        self.round_trips["heartbeat"] += 1
        try:
            raw = await self._fcall(
                "heartbeat",
                beat.key,
                "",
                "",
                beat.pack(),
                fence_from=_slot_keys(self.settings.prefix, beat),
            )
        except redis.ResponseError as error:
            raise _unavailable("heartbeat", error) from error
        except (TimeoutError, redis.RedisError, OSError, EOFError) as error:
            raise CoordinationUnavailable(f"{type(error).__name__}: {error}") from error
        self.last_renewal = time.monotonic()
        for ws in beat.epochs:
            self._renewed[ws] = self.last_renewal
        return beat.parse(json.loads(raw))

    async def _heartbeat_answered(self, result: HeartbeatResult, settled_before: float) -> None:
        if result.live is not None:
            self.live_processes = result.live
        for ws, (epoch, reborn) in result.workspaces.items():
            known = self.epochs.get(ws)
            if known is None:
                self.epochs[ws] = epoch
            elif known != epoch:
                await self.resync(ws, epoch)
            elif reborn and self.book.lease_records().get(ws):
                # This process had been given up for dead here (its lease lapsed): its permits
                # were returned to the pool, so it puts back the ones it still holds.
                logger.warning(
                    "admission lease of this process in workspace %s had lapsed; "
                    "re-asserting permits",
                    ws,
                )
                await self._reassert(ws)
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

    def _doubt_leases(self) -> None:
        """Without a renewal for most of the lease TTL, stop the calls those permits cover (on a
        cluster, per workspace: one shard out of reach leaves the others' permits alone)."""
        now = time.monotonic()
        limit_s = self.settings.lease_ttl_ms * LEASE_DOUBT_SHARE / 1000.0
        silent = {
            ws
            for ws in self.book.lease_records()
            if now - self._renewed.get(ws, self.last_renewal) >= limit_s
        }
        if silent:
            self.book.doubt_leases(silent)

    # ------------------------------------------------------------------ grants

    def _grant_key(self, workspace_id: str) -> str:
        return f"{self.settings.prefix}:{{{workspace_id}}}:g:{self.process_id}"

    @property
    def listening(self) -> set[int | None]:
        """The hash slots where this process listens for grants now (None: a single Redis)."""
        return {group for group, task in self._listeners.items() if not task.done()}

    def _group_of(self, workspace_id: str) -> int | None:
        group = self._groups.get(workspace_id, -1)
        if group == -1:
            if len(self._groups) > 4096:
                self._groups.clear()
            group = self._groups[workspace_id] = self._group(
                route_key(self.settings.prefix, workspace_id)
            )
        return group

    def _waiting_workspaces(self) -> set[str]:
        """Workspaces where a waiter of this process is queued (waits for a grant)."""
        return {w.owner.workspace_id for w in self.book.waiters() if w.state == QUEUED}

    def _waiting_in(self, group: int | None) -> set[str]:
        """Workspaces of one hash slot where a waiter of this process waits."""
        return {ws for ws in self._waiting_workspaces() if self._group_of(ws) == group}

    def listen(self, workspace_id: str) -> None:
        """A waiter of this process waits in the workspace: its grant list is listened to (on
        the loop's thread). The listener of the workspace's hash slot starts if none runs, or is
        woken to take the list in; it stops once no waiter of this process waits in its slot,
        so a process holds a blocking connection per slot where it waits, not per slot of every
        workspace it ever decided in."""
        if self._closed or self._loop is None:
            return
        group = self._group_of(workspace_id)
        task = self._listeners.get(group)
        if task is None or task.done():
            self._start_listener(group)
            return
        heard = self._heard.get(group)
        if heard and self._grant_key(workspace_id) not in heard:
            # The listener blocks on the lists it knew: an empty item wakes it to take the new
            # one in.
            self.background(self._poke(next(iter(heard))))

    async def _poke(self, key: str) -> None:
        client = self._listen_client
        if client is None:
            return
        with contextlib.suppress(redis.RedisError, OSError):
            await client.rpush(key, "")
            await client.pexpire(key, 2 * self.settings.lease_ttl_ms)

    def _start_listener(self, group: int | None) -> None:
        loop = self._loop
        assert loop is not None
        task = loop.create_task(self._listen_loop(group), name="sluice-admission-grants")
        self._listeners[group] = task
        # (Listeners come and go with waiters: the ones that ended are dropped here.)
        self._tasks = [*(t for t in self._tasks if not t.done()), task]

    async def _listen_loop(self, group: int | None) -> None:
        # A cancellation swallowed by a client timeout must not keep a closed loop alive.
        while not self._closed:
            client = self._listen_client
            if client is None:
                return
            spaces = self._waiting_in(group)
            if not spaces:
                # No waiter of this process waits in this slot: stop listening there (the
                # connection goes back to the pool). A waiter that comes starts it again.
                if self._listeners.get(group) is asyncio.current_task():
                    del self._listeners[group]
                self._heard.pop(group, None)
                return
            keys = [self._grant_key(ws) for ws in sorted(spaces)]
            self._heard[group] = set(keys)
            try:
                item = await client.blpop(keys, timeout=LISTEN_BLOCK_SECONDS)
            except Exception as error:
                # Whatever broke the connection, the listener must live on: waiters depend on it.
                logger.debug("admission grant listener: %s: %s", type(error).__name__, error)
                await asyncio.sleep(self.settings.heartbeat_ms / 1000.0)
                continue
            if item is None or not item[1]:
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
