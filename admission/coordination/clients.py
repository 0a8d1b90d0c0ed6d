"""Redis clients of the shared admission state: one Redis server, or a Redis Cluster.

`SLUICE_ADMISSION_REDIS_URL` names a single server as `redis://`, `rediss://` or `unix://`, and
a Redis Cluster as `redis+cluster://host:port` (or `rediss+cluster://` with TLS): any one node
of the cluster; the client learns the others from it. On a cluster every function call names one
key of the hash slot it acts in (`route_key`), so it runs on that slot's primary; the slots of a
workspace's keys follow its hash tag (`{workspace}`), so the deployment's admission state is
sharded by workspace.

On a cluster, a call that acts in a workspace's slot also names that slot's `fence_key`, a key
nobody ever writes. Redis counts missing keys only in a slot that is moving between primaries,
and then a call naming a missing key is never run: the old primary answers ASK, the new one
TRYAGAIN. So no function runs while a slot's keys may be split between two nodes (it would read
the part that has moved as empty, or fail half-way through its writes); the call is refused as
`coordination-unavailable` until the slot has settled on its new primary.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster, key_slot

__all__ = [
    "CLUSTER_SCHEMES",
    "SCHEMES",
    "AsyncClient",
    "SyncClient",
    "async_client",
    "call_keys",
    "fence_key",
    "is_cluster",
    "registry_key",
    "route_key",
    "slot_of",
    "sync_client",
]

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SCHEMES = ("redis://", "rediss://", "unix://", *CLUSTER_SCHEMES)

AsyncClient = aioredis.Redis | AsyncRedisCluster
SyncClient = redis.Redis | RedisCluster


def is_cluster(url: str) -> bool:
    """Whether the URL names a Redis Cluster."""
    return url.startswith(CLUSTER_SCHEMES)


def _node_url(url: str) -> str:
    # redis+cluster://h:p -> redis://h:p (one node to learn the cluster from).
    scheme, _, rest = url.partition("://")
    return f"{scheme.removesuffix('+cluster')}://{rest}"


def async_client(url: str, **options: Any) -> AsyncClient:
    """An asyncio client for the URL; `options` are connection options of redis-py.

    On a cluster `max_connections` bounds the connections per node.
    """
    if is_cluster(url):
        return AsyncRedisCluster.from_url(_node_url(url), **options)
    return aioredis.Redis.from_url(url, **options)


def sync_client(url: str, **options: Any) -> SyncClient:
    """A blocking client for the URL (operators' views, profile installs)."""
    if is_cluster(url):
        return RedisCluster.from_url(_node_url(url), **options)
    return redis.Redis.from_url(url, **options)


def route_key(prefix: str, workspace_id: str) -> str:
    """A key in the hash slot of a workspace's state (what a call names for routing)."""
    return f"{prefix}:{{{workspace_id}}}:prof"


def fence_key(key: str) -> str | None:
    """The never-written key of a key's hash slot (see the module's doc), or None for a key
    without a hash tag."""
    opening = key.find("{")
    closing = key.find("}", opening + 1)
    if opening < 0 or closing <= opening + 1:
        return None
    return f"{key[: closing + 1]}:fence"


def call_keys(key: str, *others: str) -> tuple[str, ...]:
    """The keys a function call names: `key` (routing), and the fence of its slot, taken from
    `key` or from the first of `others` (keys of the same slot) that has a hash tag."""
    for candidate in (key, *others):
        fence = fence_key(candidate)
        if fence is not None:
            return (key, fence)
    return (key,)


def registry_key(prefix: str) -> str:
    """The deployment's registry of live processes (a zset: process -> lease expiry, ms)."""
    return f"{prefix}:{{}}:procs"


def slot_of(key: str) -> int:
    """The cluster hash slot of a key."""
    return int(key_slot(key.encode("utf-8")))
