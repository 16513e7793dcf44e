"""The one place that builds Redis clients: a single server, or a Redis Cluster by its URL.

Every Redis user of the gateway (the quota store, the resilience state, the admission log) asks
here, so choosing a cluster is one decision: a URL whose scheme is ``redis+cluster://`` (or
``rediss+cluster://`` with TLS) gets redis-py's ``redis.asyncio.cluster.RedisCluster``; any other
URL gets ``redis.asyncio.Redis`` on a blocking pool. The scheme, not a separate setting, so the
URL alone (``QUOTA_STORE_REDIS_URL`` or the ``quotaStore.redisUrl`` setting) says what it points
at and cannot disagree with a second knob. A cluster URL may list several startup nodes,
``redis+cluster://h1:6379,h2:6379,h3:6379``; one reachable node is enough, the client
discovers the others (``CLUSTER SLOTS``). A password goes in the URL as for a single server.

Keys: every multi-key command and script of fairgate names keys of one hash slot (``{pool}``,
``{rs}``, ``{slot:<connection>}`` tags; see the modules' key layouts), so nothing needs
cross-slot support from the cluster.

**The redis-py 8.1 race, and what avoids it.** A burst of concurrent commands on a fresh async
cluster client (a gateway that starts under traffic) failed some of them with
``AttributeError: 'NoneType' object has no attribute 'writelines'`` or "Connection closed by
server" (6 to 25 of 100 EVALSHA in a trial). The cause, traced here: the client discovers the
cluster lazily, and a command issued before that discovery picks its routing policy while the
client has no default node yet, so it is routed as keyless, to any primary, and comes back
``MOVED`` (90 of 100 in a trial). Every ``reinitialize_steps``-th ``MOVED`` (5 by default) makes
the client call ``aclose()``, which disconnects every connection of every node, including those
the burst's other commands are writing to or reading from. Two guards, each enough on its own
in the trials (0 failures in 300):

- :func:`prepare` discovers the cluster (``initialize()``) and opens the connections before
  traffic, so commands are routed by their keys' slot from the first one;
- ``reinitialize_steps=0``: a ``MOVED`` reply (a resharding) patches the slot it names instead
  of, every fifth time, closing the connections under the commands in flight. A lost node is
  still handled: a connection error makes the client rediscover the cluster.

Related upstream work on this client's connection handling: redis/redis-py#4057, #4110, #4247.
The cluster client also raises ``MaxConnectionsError`` as soon as a node's connections are all
busy; :class:`BoundedCluster` makes callers wait instead, as a single server's blocking pool
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, Final, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

__all__ = [
    "CLUSTER_SCHEMES",
    "AsyncClient",
    "async_client",
    "is_cluster_url",
    "prepare",
    "probe_client",
]

log = logging.getLogger("fairgate.store")

#: A client of either kind (both have the command methods fairgate uses).
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

#: Cluster URL scheme -> the scheme of one of its nodes.
CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def _node_urls(url: str) -> list[str]:
    """The plain ``redis://`` URL of each startup node of a cluster URL (credentials and query
    kept; the database path dropped: a cluster has only database 0)."""
    parts = urllib.parse.urlsplit(url)
    scheme = CLUSTER_SCHEMES[parts.scheme.lower()]
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes = [h.strip() for h in hosts.split(",") if h.strip()]
    if not nodes:
        raise ValueError("a redis+cluster:// URL needs at least one host:port")
    prefix = f"{userinfo}@" if userinfo else ""
    return [urllib.parse.urlunsplit((scheme, prefix + n, "", parts.query, "")) for n in nodes]


def _startup_nodes(url: str) -> tuple[str, list[redis.asyncio.cluster.ClusterNode]]:
    urls = _node_urls(url)
    nodes = []
    for node_url in urls:
        parts = urllib.parse.urlsplit(node_url)
        nodes.append(
            redis.asyncio.cluster.ClusterNode(parts.hostname or "127.0.0.1", parts.port or 6379)
        )
    return urls[0], nodes


#: Set while the current task holds a permit of a :class:`BoundedCluster` (a pipeline that
#: re-sends a redirected command through the client must not wait for a second one).
_HOLDING: ContextVar[bool] = ContextVar("fairgate_redis_cluster_permit", default=False)


class BoundedCluster(redis.asyncio.cluster.RedisCluster):
    """redis-py's async cluster client, with callers beyond ``max_connections`` waiting for a
    turn (up to ``pool_timeout_s``) as they do on a single server's blocking pool.

    The cluster client's per-node pools raise ``MaxConnectionsError`` as soon as a node's
    connections are all busy. Bounding the commands (and pipelines) in flight per client by the
    per-node limit keeps every node within it, whatever the slots they go to."""

    def __init__(self, *args: Any, pool_timeout_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._permits = asyncio.Semaphore(int(kwargs.get("max_connections", 100)))
        self._pool_timeout_s = pool_timeout_s

    @contextlib.asynccontextmanager
    async def permit(self) -> AsyncIterator[None]:
        """One command or pipeline in flight (re-entrant within a task)."""
        if _HOLDING.get():
            yield
            return
        try:
            await asyncio.wait_for(self._permits.acquire(), self._pool_timeout_s)
        except TimeoutError:
            # a symptom of load, not of an outage: a timeout, as the quota store's pool says
            msg = "no Redis Cluster connection became free"
            raise RedisTimeoutError(msg) from None
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)
            self._permits.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.permit():
            return await super().execute_command(*args, **kwargs)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> redis.asyncio.cluster.ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py refuses it
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py does


class _BoundedPipeline(redis.asyncio.cluster.ClusterPipeline):
    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = cast(BoundedCluster, self.cluster_client)
        async with client.permit():
            return await super().execute(raise_on_error, allow_redirections)


def async_client(
    url: str,
    *,
    max_connections: int,
    pool_timeout_s: float,
    connect_timeout_s: float,
    socket_timeout_s: float,
    keepalive: bool = False,
    pool_class: type[redis.asyncio.BlockingConnectionPool] = redis.asyncio.BlockingConnectionPool,
) -> AsyncClient:
    """A client with one immediate retry on a connection error only (a Redis restart then
    costs no failed command; retrying a timeout could apply a script twice).

    A single server gets a blocking pool of ``max_connections`` (``pool_class``, callers beyond
    it wait up to ``pool_timeout_s``); a cluster gets ``max_connections`` per node and the
    same wait (:class:`BoundedCluster`)."""
    retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    if not is_cluster_url(url):
        pool = pool_class.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            socket_keepalive=keepalive,
            retry=retry,
        )
        return redis.asyncio.Redis.from_pool(pool)
    first, nodes = _startup_nodes(url)
    return BoundedCluster.from_url(
        first,
        startup_nodes=nodes,
        max_connections=max_connections,
        pool_timeout_s=pool_timeout_s,
        reinitialize_steps=0,  # module docstring: MOVED patches a slot, never closes everything
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_keepalive=keepalive,
        retry=retry,
    )


def probe_client(url: str, *, connect_timeout_s: float, socket_timeout_s: float) -> redis.Redis:
    """A blocking one-connection client for an out-of-loop PING (see ``RedisQuotaStore``).
    For a cluster it talks to the first startup node: PING needs no slot, and the question it
    answers (is Redis there at all, or is this process too slow to read its replies) does not
    depend on which node answers."""
    target = _node_urls(url)[0] if is_cluster_url(url) else url
    return redis.Redis.from_url(
        target,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_keepalive=True,
        max_connections=1,
        retry=SyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


async def prepare(client: AsyncClient, connections: int) -> int:
    """Open up to ``connections`` connections per node (per server) now, one after the other,
    and put them back; for a cluster, discover it first. Returns how many were opened. Traffic
    then finds open connections and a settled topology: no storm of handshakes on the first
    burst, and no burst inside the cluster client's lazy discovery (module docstring). A
    failure is logged, never raised: the server may be back by the time traffic comes."""
    opened = 0
    try:
        if isinstance(client, redis.asyncio.cluster.RedisCluster):
            await client.initialize()
            for node in client.get_nodes():
                held = []
                try:
                    for _ in range(min(connections, node.max_connections)):
                        conn = node.acquire_connection()
                        held.append(conn)
                        await conn.connect()  # type: ignore[no-untyped-call]
                        opened += 1
                finally:
                    for conn in held:
                        node.release(conn)
        else:
            pool = client.connection_pool
            held_pool: list[Any] = []
            try:
                for _ in range(min(connections, pool.max_connections)):
                    held_pool.append(await pool.get_connection())  # type: ignore[no-untyped-call]
                    opened += 1
            finally:
                for conn in held_pool:
                    await pool.release(conn)
    except (RedisError, OSError) as exc:
        log.warning(
            "redis: opened %d of %d connections before traffic (%s)",
            opened,
            connections,
            type(exc).__name__,
        )
    return opened
