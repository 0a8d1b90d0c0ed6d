"""One ceiling for a real endpoint: every staged run of the deployment, in every worker process,
shares the capacity the endpoint's operator documented (`SLUICE_ADAPTERS.<id>.capacity`).

Each run's own admission keeps the run inside the manifest's ceilings, which `check_capacity`
holds at or below the capacity; runs started together would still add up. So each call to a
staged endpoint first takes a lease on one of its `concurrency` slots and gives it back when the
call ends. With a Redis for admission (`SLUICE_ADMISSION_REDIS_URL`) the slots live there, one
sorted set per adapter whose members expire with their call's timeout, so a killed process frees
its slots; without one the deployment runs a single worker process and the slots are counted in
it. A call waits for a slot (polling every few milliseconds) inside its own target timeout.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import threading
from typing import Any

from django.conf import settings

from evaluator.engine.adapters.base import (
    CONNECT_ERROR,
    AdapterCall,
    AdapterError,
    AdapterResponse,
)

__all__ = ["LeasedAdapter", "LocalSlots", "RedisSlots", "deployment_slots"]

# A slot outlives its call's timeout by this much before another process may take it.
LEASE_MARGIN_MS = 5_000
POLL_SECONDS = 0.005

_TAKE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
"""


class RedisSlots:
    """`limit` slots of one endpoint in Redis, shared by every process of the deployment."""

    def __init__(self, url: str, key: str, limit: int) -> None:
        self._url = url
        self._key = key
        self._limit = limit
        self._client: Any = None
        self._take: Any = None

    async def take(self, ttl_ms: int) -> str:
        if self._client is None:
            from admission.coordination.clients import async_client

            # Created on the run's own loop, where every call of the run awaits it (one Redis
            # or a Redis Cluster: the key names its slot).
            self._client = async_client(self._url)
            self._take = self._client.register_script(_TAKE)
        token = secrets.token_hex(8)
        while not await self._take(keys=[self._key], args=[self._limit, token, ttl_ms]):
            await asyncio.sleep(POLL_SECONDS * (1 + random.random()))
        return token

    async def give_back(self, token: str) -> None:
        await self._client.zrem(self._key, token)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class _LocalCount:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0


_LOCAL: dict[str, _LocalCount] = {}
_LOCAL_LOCK = threading.Lock()


class LocalSlots:
    """`limit` slots of one endpoint counted in this process, shared by its runs' threads."""

    def __init__(self, key: str, limit: int) -> None:
        with _LOCAL_LOCK:
            self._count = _LOCAL.setdefault(key, _LocalCount())
        self._limit = limit

    def _try(self) -> bool:
        with self._count.lock:
            if self._count.taken >= self._limit:
                return False
            self._count.taken += 1
            return True

    async def take(self, ttl_ms: int) -> str:
        while not self._try():
            await asyncio.sleep(POLL_SECONDS * (1 + random.random()))
        return ""

    async def give_back(self, token: str) -> None:
        with self._count.lock:
            self._count.taken -= 1

    async def aclose(self) -> None:
        return None


def deployment_slots(adapter_id: str, limit: int) -> RedisSlots | LocalSlots:
    """The slots of `adapter_id`'s endpoint for this deployment."""
    key = f"{settings.SLUICE_ADMISSION_KEY_PREFIX}:staged-capacity:{adapter_id}"
    url = settings.SLUICE_ADMISSION_REDIS_URL
    if url:
        return RedisSlots(url, key, limit)
    return LocalSlots(key, limit)


class LeasedAdapter:
    """An adapter whose every call holds one of its endpoint's deployment-wide slots."""

    def __init__(self, adapter: Any, slots: RedisSlots | LocalSlots) -> None:
        self._adapter = adapter
        self._slots = slots
        self.idempotent = bool(getattr(adapter, "idempotent", False))

    async def invoke(self, call: AdapterCall) -> AdapterResponse:
        try:
            token = await self._slots.take(int(call.target.timeout_ms) + LEASE_MARGIN_MS)
        except Exception as error:
            # No slot could be asked for (Redis unreachable): the call was not sent.
            raise AdapterError(
                CONNECT_ERROR,
                sent=False,
                retryable=True,
                provider_failure=None,
                detail=f"the endpoint's capacity slots are unavailable ({type(error).__name__})",
            ) from error
        try:
            response: AdapterResponse = await self._adapter.invoke(call)
            return response
        finally:
            await self._slots.give_back(token)

    async def aclose(self) -> None:
        close = getattr(self._adapter, "aclose", None)
        if close is not None:
            await close()
        await self._slots.aclose()
