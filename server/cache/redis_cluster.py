"""Redis Cluster embedding cache: hash-tagged keys, MGET / SET EX pipelined per node.

Keys (:func:`.codec.make_cluster_keys`) carry a hash tag of namespace and bucket
(``node_id % buckets``), so one lookup's keys fall into at most ``buckets`` slots whatever
its size; the docstring there explains the trade-off. A lookup sends one MGET per slot (at
most ``chunk_keys`` keys each), a store one ``SET key value EX ttl`` per row, and
redis-py's cluster pipeline groups the commands by the master that owns their slot and
sends each master its share in one round trip, all masters at once.

Failures: everything :class:`~.redis_base.RedisBackedCache` does for a single Redis (the
same envelope, turns, metrics and circuit breaker; a failure is a miss or a dropped store,
never a failed request), with the cluster's own errors counted as "unreachable" too:
``CLUSTERDOWN``, an uncovered slot, no seed answering. redis-py's retries are off, so a
killed master costs the calls in flight at that moment one error each (a refused
connection is immediate; a silent host costs ``timeout_s``), then the breaker opens. Its
probe re-discovers the topology from the seeds and the nodes known so far and asks every
master for ``CLUSTER INFO``: only when all slots are covered, every master answers and
each says ``cluster_state:ok`` do calls go to the cluster again, i.e. after a replica was
promoted in the dead master's place or the master came back. One breaker for the whole
cluster: while one master is down every lookup misses, not only a third of them, but the
cache never flaps between a half-dead cluster and a WARNING per probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ClusterError, RedisClusterException

from hopserve.config.types import SecretUrl, redact_url
from hopserve.server.cache.base import CacheNamespace, CacheObserver
from hopserve.server.cache.codec import make_cluster_keys
from hopserve.server.cache.redis_base import CLIENT_EXTRAS, RedisBackedCache

__all__ = ["DEFAULT_BUCKETS", "RedisClusterEmbeddingCache", "split_address"]

DEFAULT_BUCKETS = 256
"""Hash-tag buckets per namespace: at most 256 MGETs per lookup, and a namespace spread
over 256 of the 16384 slots (about 85 per master of three)."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` as ``(host, port)``.

    Raises:
        ValueError: no port, or a port outside 1-65535.
    """
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected 'host:port' (got {address!r})")
    return host.removeprefix("[").removesuffix("]"), int(port)


class RedisClusterEmbeddingCache(RedisBackedCache):
    """Embedding cache in a Redis Cluster (``redis.asyncio.cluster``), safe when it fails.

    Args:
        url: One node of the cluster, ``redis://[[user]:password@]host:port`` or
            ``rediss://...`` (TLS); its user, password and TLS apply to every node. Its
            password is never logged.
        nodes: More seed nodes (``"host:port"``), tried when ``url``'s node does not
            answer while the topology is discovered.
        ttl_s: Expiry set on every stored row; 0 stores without expiry.
        prefix: First key component.
        timeout_s: Socket connect and read timeout.
        backoff_s: Time between availability probes while the cluster is unavailable.
        chunk_keys: Most keys per MGET command.
        max_connections: Round trips at once (and pooled connections per node); more
            wait up to ``timeout_s`` for a turn.
        buckets: Hash-tag buckets per namespace (see :func:`.codec.make_cluster_keys`);
            front-ends sharing a cluster share rows only with the same value.
        integrity_key: Secret keying the values' MAC (see :mod:`.codec`).
        observer: Optional receiver of cache events.

    Raises:
        ValueError: a malformed seed address, a URL with a database other than 0 or a
            unix socket (a cluster has neither), or an invalid setting.
    """

    name = "redis-cluster"
    label = "Redis Cluster"
    unreachable = (*RedisBackedCache.unreachable, ClusterError, RedisClusterException)
    """Also ``CLUSTERDOWN`` and ``MASTERDOWN`` replies (:class:`ClusterError`), an
    uncovered slot and a topology no seed could describe (:class:`RedisClusterException`)."""

    def __init__(
        self,
        url: str | SecretUrl,
        *,
        nodes: Sequence[str] = (),
        ttl_s: int = 3600,
        prefix: str = "hopserve",
        timeout_s: float = 0.25,
        backoff_s: float = 1.0,
        chunk_keys: int = 10_000,
        max_connections: int = 64,
        buckets: int = DEFAULT_BUCKETS,
        integrity_key: bytes | None = None,
        observer: CacheObserver | None = None,
    ) -> None:
        secret = url.get_secret_value() if isinstance(url, SecretUrl) else url
        seeds = [split_address(node) for node in nodes]
        where = ",".join([redact_url(secret), *nodes])
        super().__init__(
            where,
            ttl_s=ttl_s,
            prefix=prefix,
            timeout_s=timeout_s,
            backoff_s=backoff_s,
            chunk_keys=chunk_keys,
            max_connections=max_connections,
            integrity_key=integrity_key,
            observer=observer,
        )
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1 (got {buckets})")
        self.buckets = buckets
        self.url = redact_url(secret)
        """The seed URL with its password redacted (safe to log)."""
        self.nodes = list(nodes)
        """The other seed nodes."""
        try:
            self._client = RedisCluster.from_url(
                secret,
                startup_nodes=[ClusterNode(host, port) for host, port in seeds],
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),  # the breaker decides when to try again
                max_connections=max_connections,
                health_check_interval=0,
                **CLIENT_EXTRAS,
            )
        except (RedisClusterException, ValueError) as err:  # db != 0, unix socket, bad query
            raise ValueError(f"cannot use {self.url!r} for a Redis Cluster: {err}") from None

    def _keys(self, namespace: CacheNamespace, ids: np.ndarray) -> list[str]:
        return make_cluster_keys(self.prefix, namespace, ids, self.buckets)

    def _slot_groups(self, keys: list[str]) -> dict[int, list[int]]:
        """Positions of ``keys`` by hash slot (one slot lookup per distinct hash tag)."""
        slot_of: dict[str, int] = {}
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            tag = key[: key.find("}") + 1]
            slot = slot_of.get(tag)
            if slot is None:
                slot = slot_of[tag] = key_slot(tag.encode())
            groups.setdefault(slot, []).append(i)
        return groups

    async def _fetch(self, keys: list[str]) -> list[bytes | None]:
        """One MGET per slot (and chunk), sent to each master in one round trip."""
        parts: list[list[int]] = []
        async with self._client.pipeline() as pipe:
            for positions in self._slot_groups(keys).values():
                for first in range(0, len(positions), self.chunk_keys):
                    part = positions[first : first + self.chunk_keys]
                    pipe.execute_command("MGET", *[keys[i] for i in part])  # .mget is blocked
                    parts.append(part)
            replies = await pipe.execute()
        values: list[bytes | None] = [None] * len(keys)
        for part, reply in zip(parts, replies, strict=True):
            for i, value in zip(part, reply, strict=True):
                values[i] = value
        return values

    async def _store(self, keys: list[str], values: list[bytes], expiry: tuple[Any, ...]) -> None:
        """``SET key value EX ttl`` per row, sent to each master in one round trip."""
        async with self._client.pipeline() as pipe:
            for key, value in zip(keys, values, strict=True):
                pipe.execute_command("SET", key, value, *expiry)
            await pipe.execute()

    async def _ping(self) -> None:
        """Re-discover the topology, then require ``cluster_state:ok`` from every master."""
        client = self._client
        await client.aclose()  # forget the slot map: the next command discovers it again
        await client.initialize()  # all 16384 slots covered, or RedisClusterException
        primaries = client.get_primaries()
        infos = await asyncio.gather(*(client.cluster_info(target_nodes=p) for p in primaries))
        for primary, info in zip(primaries, infos, strict=True):
            state = info.get("cluster_state") if isinstance(info, dict) else None
            if state != "ok":
                raise ClusterError(f"{primary.name} reports cluster_state:{state}")

    async def _close_client(self) -> None:
        await self._client.aclose()
