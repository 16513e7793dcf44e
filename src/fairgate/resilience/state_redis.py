"""The Redis :class:`~fairgate.resilience.state.ResilienceStore`: state shared by replicas.

Every gateway process that points at the same Redis and prefix sees a cooldown, a lockout, a
permanent block or a breaker transition within :data:`MAX_STALE_MS` of the writing process's
command returning. Updates that read before they write are Lua scripts (``resilience/lua``), so
two replicas racing to set a cooldown cannot shorten each other's deadline.

Reads: without a watcher every :meth:`~RedisResilienceStore.read_target` is one pipelined round
trip. A store whose watcher runs (:meth:`~RedisResilienceStore.start_watch`, as the gateway
starts it) answers it from memory instead: every write bumps a version counter and publishes the
new version in the same script or MULTI; the watcher subscribes to that channel (a message drops
the cached reads at once) and re-reads the counter every :data:`POLL_S` as a safety net for a
lost message. A cached read is used only while the watcher confirmed the version less than
:data:`MAX_STALE_MS` ago by the store's clock, or while Redis does not answer the watcher at
all (refused, or a read pending longer than that): then no replica can change the shared state
either, and the last view serves rather than every check waiting for a timeout (a target never
read before still goes to Redis and fails open). A check that finds the confirmation overdue (a
stalled watcher, or a loop too busy to run it on time) reads the version counter itself, one
``GET`` shared by every check overdue at that moment, which vouches for the cached reads exactly
as the watcher's read does; only when the version moved does the check read its target from
Redis. Writes are rare (failures, rate-limit lockouts, breaker transitions), so a write drops every
cached target rather than the one it touched. On a Redis Cluster the same: the version counter
and the scripts sit in the ``{rs}`` slot, the watcher subscribes on a client of its own to that
slot's primary (a ``PUBLISH`` reaches every node anyway) and reads the counter through the
cluster client.

Deadlines are absolute epoch ms from the caller's clock, and each key's TTL is its remaining
time plus the level memory (so Redis drops what the lazy reads already ignore).

Key layout (one hash tag, ``{rs}``, so a cluster keeps every resilience key in one slot and the
scripts may touch the index beside the entry)::

    <prefix>:{rs}:cd:<conn>                       HASH cooldown {until, level, reason, updated}
    <prefix>:{rs}:lk:<provider>:<conn>:<model>    HASH model lockout (same fields)
    <prefix>:{rs}:br:<provider>                   HASH breaker {state, until, cooldown, updated}
    <prefix>:{rs}:probe:<provider>                STRING half-open probe token (SET NX PX)
    <prefix>:{rs}:perm                            HASH scope -> JSON {reason, since_ms}
    <prefix>:{rs}:idx                             ZSET "cd:…" / "lk:…" / "br:…" -> forget_ms
    <prefix>:{rs}:ver                             STRING version, INCR by every write
    channel <prefix>:{rs}:changed                 PUBLISH of the new version

Provider and connection ids may not hold ``:`` (config ids never do), so a lockout key parses
back unambiguously; a model id may hold anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import logging
import time
from typing import Any, Final, cast

import orjson
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairgate.backends.redis_client import AsyncClient, async_client
from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.resilience.backoff import Cooldown
from fairgate.resilience.breaker import BreakerRecord
from fairgate.resilience.state import (
    DEFAULT_LEVEL_MEMORY_MS,
    LockoutKey,
    PermanentBlock,
    StoreSnapshot,
    TargetState,
    connection_scope,
    model_scope,
)

__all__ = ["RedisResilienceStore"]

log = logging.getLogger("fairgate.resilience")

#: The most index entries one health snapshot reads.
SNAPSHOT_LIMIT: Final = 10_000
#: Connections of the pool the store opens itself (callers beyond it wait up to the timeout).
DEFAULT_MAX_CONNECTIONS: Final = 64
POOL_TIMEOUT_S: Final = 5.0
#: Read timeout of the store's own connections (the connect timeout is half of it); the same as
#: the quota store's default (see ``fairgate.store.redis.store``).
SOCKET_TIMEOUT_S: Final = 1.0
#: A watched store answers reads from memory only while its watcher confirmed the shared version
#: this recently (by the store's clock): the bound on how late a replica honours another's write.
MAX_STALE_MS: Final = 100
#: How often the watcher re-reads the version counter (the safety net under pub/sub).
POLL_S: Final = 0.04
#: How often a watcher waiting for messages wakes to see whether it should stop.
WAKE_S: Final = 0.25
#: How long closing waits for the watcher to stop.
CLOSE_WAIT_S: Final = 2.0
#: The most targets one store keeps cached reads for (past it the cache starts over).
CACHE_LIMIT: Final = 10_000

_NOTHING: Final = TargetState()


@functools.cache
def _script_source(name: str) -> str:
    return (importlib.resources.files("fairgate.resilience") / "lua" / name).read_text(
        encoding="utf-8"
    )


def _text(value: object) -> str:
    """Reply values as str whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _check_id(kind: str, value: str) -> str:
    """Ids become parts of keys: refuse those that would make two keys alias or move the slot."""
    if not value or any(ch in "{}:" or ch.isspace() for ch in value):
        raise ValueError(
            f"invalid {kind} {value!r}: must be non-empty, without ':', braces or spaces"
        )
    return value


def _cooldown(raw: list[object]) -> Cooldown | None:
    """A Cooldown from HMGET until, level, reason (None when the hash is absent)."""
    if raw[0] is None:
        return None
    return Cooldown(int(_text(raw[0])), int(_text(raw[1] or "0")), _text(raw[2] or ""))


def _breaker(raw: list[object]) -> BreakerRecord | None:
    """A BreakerRecord from HMGET state, until, cooldown, updated."""
    if raw[0] is None:
        return None
    return BreakerRecord(
        state=_text(raw[0]),
        until_ms=int(_text(raw[1] or "0")),
        cooldown_ms=int(_text(raw[2] or "0")),
        updated_ms=int(_text(raw[3] or "0")),
    )


def _permanent(scope: str, raw: object) -> PermanentBlock | None:
    if raw is None:
        return None
    data = orjson.loads(_text(raw))
    key_id, request_id = data.get("key_id"), data.get("request_id")
    return PermanentBlock(
        scope,
        str(data.get("reason", "")),
        int(data.get("since_ms", 0)),
        key_id if isinstance(key_id, str) else None,
        request_id if isinstance(request_id, str) else None,
    )


_BLOCK_FIELDS: Final = ("until", "level", "reason")
_BREAKER_FIELDS: Final = ("state", "until", "cooldown", "updated")


class _ReadCache:
    """The last state read per target, and whether it may still be trusted (module docstring).

    ``generation`` moves on every invalidation: a read that was in flight across one is not
    kept, so a write is never hidden behind an answer that Redis gave before it."""

    __slots__ = (
        "confirmed_ms",
        "entries",
        "failing",
        "generation",
        "pending_since",
        "seen",
        "version",
    )

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str, str], TargetState] = {}
        self.version: int | None = None  # None: no watcher has read the counter yet
        self.confirmed_ms = 0  # when (store clock) the last counter read was sent
        self.generation = 0
        self.seen = asyncio.Event()  # set and replaced whenever a new version is seen
        self.pending_since: int | None = None  # when the counter read in flight was sent
        self.failing = False  # the last counter read failed: Redis is unreachable

    def fresh(self, now_ms: int) -> bool:
        """Confirmed within :data:`MAX_STALE_MS`, or Redis does not answer the watcher (refused,
        or a read pending longer than that): then no replica can change the shared state
        either, and the last view serves instead of every check waiting for a timeout."""
        if self.version is None:
            return False
        if now_ms - self.confirmed_ms <= MAX_STALE_MS or self.failing:
            return True
        return self.pending_since is not None and now_ms - self.pending_since > MAX_STALE_MS

    def invalidate(self) -> None:
        self.generation += 1
        self.entries.clear()

    def observe(self, version: int, asked_ms: int | None) -> None:
        """A version read from the counter (``asked_ms``: when the read was sent; the counter is
        the authority, even when it went back after a Redis restart) or from a message (only
        a newer one counts)."""
        if asked_ms is None and self.version is not None and version <= self.version:
            return
        if version != self.version:
            self.version = version
            self.invalidate()
            self.seen.set()
            self.seen = asyncio.Event()
        if asked_ms is not None:
            self.confirmed_ms = max(self.confirmed_ms, asked_ms)

    def keep(self, key: tuple[str, str, str], state: TargetState, generation: int) -> None:
        if self.version is None or generation != self.generation:
            return
        if len(self.entries) >= CACHE_LIMIT:
            self.entries.clear()
        self.entries[key] = state


class RedisResilienceStore:
    """Resilience state in Redis; see the module docstring for the key layout.

    Build it from a URL (it then owns and closes its client, whose blocking pool of
    ``max_connections`` makes bursts wait instead of failing) or share an existing
    ``redis.asyncio.Redis`` client (bytes or decoded responses both work; size its pool for the
    number of concurrent checks, or use a ``BlockingConnectionPool``).
    """

    name = "redis"
    #: errors that mean Redis is unreachable or hung: the manager then leaves the store alone
    #: for a moment instead of paying a timeout on every request (see ``RateLimitManager._safe``)
    unavailable_errors: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError)

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str = "fairgate",
        client: AsyncClient | None = None,
        clock: Clock = SYSTEM_CLOCK,
        level_memory_ms: int = DEFAULT_LEVEL_MEMORY_MS,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        socket_timeout_s: float = SOCKET_TIMEOUT_S,
    ) -> None:
        if client is None and not url:
            raise ValueError("RedisResilienceStore needs a url or a client")
        if not prefix or any(ch in "{}" or ch.isspace() for ch in prefix):
            raise ValueError(f"invalid prefix {prefix!r}")
        self._base = f"{prefix}:{{rs}}"
        self._owns_client = client is None
        self._client: AsyncClient = (
            client
            if client is not None
            else self._own_client(cast(str, url), max_connections, socket_timeout_s)
        )
        self._clock = clock
        self._memory = level_memory_ms
        self._idx = f"{self._base}:idx"
        self._perm = f"{self._base}:perm"
        self._ver = f"{self._base}:ver"
        self._channel = f"{self._base}:changed"
        self._cache = _ReadCache()
        self._watch_task: asyncio.Task[None] | None = None
        self._closing = False
        #: reads answered from memory (for tests and the benchmark: each one saved a round trip)
        self.cache_hits = 0
        #: version reads by checks that found the watcher overdue (:meth:`_reconfirm`)
        self.reconfirms = 0
        self._reconfirming: asyncio.Future[None] | None = None
        self._set_block = self._register("set_block.lua")
        self._clear_block = self._register("clear_block.lua")
        self._put_breaker = self._register("put_breaker.lua")

    @staticmethod
    def _own_client(url: str, max_connections: int, socket_timeout_s: float) -> AsyncClient:
        """A client whose pool waits for a free connection under a burst of checks (the
        default pool raises "Too many connections" past its size instead). Short socket
        timeouts: every request reads this state, so a hung Redis without them would hang every
        request; one immediate retry on a connection error reconnects after a Redis restart. A
        ``redis+cluster://`` URL gets a cluster client (:mod:`fairgate.backends.redis_client`):
        every key here shares the ``{rs}`` tag, so each script and pipeline goes to one node."""
        return async_client(
            url,
            max_connections=max_connections,
            pool_timeout_s=POOL_TIMEOUT_S,
            connect_timeout_s=socket_timeout_s / 2,
            socket_timeout_s=socket_timeout_s,
        )

    def _register(self, name: str) -> AsyncScript:
        # register_script only hashes the text; the server loads it on the first NOSCRIPT.
        return self._client.register_script(_script_source(name))

    # -- keys -----------------------------------------------------------------------------------

    @staticmethod
    def _cd_member(conn_id: str) -> str:
        return f"cd:{_check_id('connection id', conn_id)}"

    @staticmethod
    def _lk_member(provider: str, conn_id: str, model: str) -> str:
        if not model:
            raise ValueError("model must be non-empty")
        return f"lk:{_check_id('provider', provider)}:{_check_id('connection id', conn_id)}:{model}"

    @staticmethod
    def _br_member(provider: str) -> str:
        return f"br:{_check_id('provider', provider)}"

    def _key(self, member: str) -> str:
        return f"{self._base}:{member}"

    def _probe_key(self, provider: str) -> str:
        return f"{self._base}:probe:{_check_id('provider', provider)}"

    def _forget_before(self) -> int:
        return self._clock.now_ms() - self._memory

    def _live(self, cd: Cooldown | None) -> Cooldown | None:
        """Lazy expiry by the caller's clock (Redis may not have dropped the key yet)."""
        if cd is None or cd.until_ms <= self._forget_before():
            return None
        return cd

    def _live_breaker(self, rec: BreakerRecord | None) -> BreakerRecord | None:
        if rec is None or max(rec.until_ms, rec.updated_ms) <= self._forget_before():
            return None
        return rec

    # -- cooldowns and lockouts -----------------------------------------------------------------

    async def _get_block(self, member: str) -> Cooldown | None:
        raw = await self._client.hmget(self._key(member), list(_BLOCK_FIELDS))
        return self._live(_cooldown(cast(list[object], raw)))

    async def _set(self, member: str, until_ms: int, level: int, reason: str) -> Cooldown:
        reply = await self._set_block(
            keys=[self._key(member), self._idx, self._ver],
            args=[
                self._clock.now_ms(),
                int(until_ms),
                int(level),
                reason,
                self._memory,
                member,
                self._channel,
            ],
        )
        self._cache.invalidate()
        until, lvl, why = cast(list[object], reply)
        return Cooldown(int(_text(until)), int(_text(lvl)), _text(why))

    async def _clear(self, member: str, unless_active_at: int | None) -> bool:
        reply = await self._clear_block(
            keys=[self._key(member), self._idx, self._ver],
            args=[
                member,
                "" if unless_active_at is None else int(unless_active_at),
                self._forget_before(),
                self._channel,
            ],
        )
        self._cache.invalidate()
        return int(cast(int, reply)) == 1

    async def get_cooldown(self, conn_id: str) -> Cooldown | None:
        return await self._get_block(self._cd_member(conn_id))

    async def set_cooldown(self, conn_id: str, until_ms: int, level: int, reason: str) -> Cooldown:
        return await self._set(self._cd_member(conn_id), until_ms, level, reason)

    async def clear_cooldown(self, conn_id: str, *, unless_active_at: int | None = None) -> bool:
        return await self._clear(self._cd_member(conn_id), unless_active_at)

    async def get_lockout(self, provider: str, conn_id: str, model: str) -> Cooldown | None:
        return await self._get_block(self._lk_member(provider, conn_id, model))

    async def set_lockout(
        self, provider: str, conn_id: str, model: str, until_ms: int, level: int, reason: str
    ) -> Cooldown:
        return await self._set(self._lk_member(provider, conn_id, model), until_ms, level, reason)

    async def clear_lockout(
        self, provider: str, conn_id: str, model: str, *, unless_active_at: int | None = None
    ) -> bool:
        return await self._clear(self._lk_member(provider, conn_id, model), unless_active_at)

    # -- permanent blocks -----------------------------------------------------------------------

    async def set_permanent(
        self,
        scope: str,
        reason: str,
        *,
        since_ms: int | None = None,
        key_id: str | None = None,
        request_id: str | None = None,
    ) -> PermanentBlock:
        if not scope:
            raise ValueError("scope must be non-empty")
        since = self._clock.now_ms() if since_ms is None else since_ms
        value = orjson.dumps(
            {"reason": reason, "since_ms": since, "key_id": key_id, "request_id": request_id}
        )
        pipe = self._client.pipeline(transaction=True)
        pipe.hsetnx(self._perm, scope, value)
        pipe.hget(self._perm, scope)
        self._bump(pipe)
        _, stored, *_ = cast(list[object], await pipe.execute())
        self._cache.invalidate()
        block = _permanent(scope, stored)
        if block is None:
            block = PermanentBlock(scope, reason, since, key_id, request_id)
        return block

    async def clear_permanent(self, scope: str) -> bool:
        pipe = self._client.pipeline(transaction=True)
        pipe.hdel(self._perm, scope)
        self._bump(pipe)
        removed, *_ = cast(list[object], await pipe.execute())
        self._cache.invalidate()
        return int(cast(int, removed)) == 1

    async def list_permanent(self) -> list[PermanentBlock]:
        raw = cast(dict[object, object], await self._client.hgetall(self._perm))
        blocks = [_permanent(_text(k), v) for k, v in raw.items()]
        return sorted((b for b in blocks if b is not None), key=lambda b: (b.since_ms, b.scope))

    # -- breakers -------------------------------------------------------------------------------

    async def get_breaker(self, provider: str) -> BreakerRecord | None:
        raw = await self._client.hmget(self._key(self._br_member(provider)), list(_BREAKER_FIELDS))
        return self._live_breaker(_breaker(cast(list[object], raw)))

    async def put_breaker(self, provider: str, record: BreakerRecord) -> bool:
        member = self._br_member(provider)
        reply = await self._put_breaker(
            keys=[self._key(member), self._idx, self._ver],
            args=[
                self._clock.now_ms(),
                record.state,
                record.until_ms,
                record.cooldown_ms,
                record.updated_ms,
                self._memory,
                member,
                self._channel,
            ],
        )
        self._cache.invalidate()
        return int(cast(int, reply)) == 1

    async def try_probe(self, provider: str, lease_ms: int) -> bool:
        ok = await self._client.set(self._probe_key(provider), "1", nx=True, px=max(1, lease_ms))
        return bool(ok)

    async def release_probe(self, provider: str) -> None:
        await self._client.delete(self._probe_key(provider))

    # -- reads ----------------------------------------------------------------------------------

    def _bump(self, pipe: Any) -> None:
        """Queue the version bump and its message on a MULTI (the Lua scripts do the same)."""
        pipe.eval(
            "return redis.call('PUBLISH', ARGV[1], redis.call('INCR', KEYS[1]))",
            1,
            self._ver,
            self._channel,
        )

    async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState:
        """Cooldown, lockout, permanent blocks and breaker of one target: from memory while the
        watcher vouches for it (module docstring), else one round trip."""
        key = (provider, conn_id, model)
        cache = self._cache
        hit = cache.entries.get(key)
        if hit is not None:
            if not cache.fresh(self._clock.now_ms()):
                await self._reconfirm()  # the watcher is overdue: confirm the version here
                hit = cache.entries.get(key)  # gone when the version moved
            if hit is not None and cache.fresh(self._clock.now_ms()):
                self.cache_hits += 1
                return self._alive(hit)
        generation = cache.generation
        state = await self._fetch_target(provider, conn_id, model)
        cache.keep(key, state, generation)
        return self._alive(state)

    async def _reconfirm(self) -> None:
        """Read the version counter as the watcher does, for a check that found the watcher's
        confirmation overdue (a loop too busy to run the watcher on time): one ``GET`` shared by
        every check waiting for it, instead of each reading its target's four hashes. It
        vouches for the cached reads as of when it was sent, exactly as the watcher's read
        would; a moved version drops them (the check then reads its target from Redis)."""
        pending = self._reconfirming
        if pending is None or pending.done():
            pending = self._reconfirming = asyncio.ensure_future(self._read_version())
        await asyncio.shield(pending)

    async def _read_version(self) -> None:
        asked = self._clock.now_ms()
        version = await self.shared_version()
        self.reconfirms += 1
        self._cache.observe(version, asked)

    def _alive(self, state: TargetState) -> TargetState:
        """``state`` with what its deadlines have let go of by now dropped (lazy expiry)."""
        if state is _NOTHING:
            return state
        return TargetState(
            cooldown=self._live(state.cooldown),
            lockout=self._live(state.lockout),
            permanent=state.permanent,
            breaker=self._live_breaker(state.breaker),
        )

    async def _fetch_target(self, provider: str, conn_id: str, model: str) -> TargetState:
        """The target's records as stored (no expiry applied): one pipelined round trip."""
        pipe = self._client.pipeline(transaction=False)
        pipe.hmget(self._key(self._cd_member(conn_id)), list(_BLOCK_FIELDS))
        pipe.hmget(self._key(self._lk_member(provider, conn_id, model)), list(_BLOCK_FIELDS))
        conn_scope, m_scope = connection_scope(conn_id), model_scope(provider, conn_id, model)
        pipe.hmget(self._perm, [conn_scope, m_scope])
        pipe.hmget(self._key(self._br_member(provider)), list(_BREAKER_FIELDS))
        cd, lk, perm, br = cast(list[list[object]], await pipe.execute())
        state = TargetState(
            cooldown=_cooldown(cd),
            lockout=_cooldown(lk),
            permanent=_permanent(conn_scope, perm[0]) or _permanent(m_scope, perm[1]),
            breaker=_breaker(br),
        )
        return _NOTHING if state == _NOTHING else state

    # -- the watcher ----------------------------------------------------------------------------

    async def start_watch(self, *, poll_s: float = POLL_S) -> None:
        """Answer :meth:`read_target` from memory from now on, kept current by a background
        task (module docstring); :meth:`close` stops it. Idempotent."""
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(self._watch(poll_s), name="resilience-watch")

    @property
    def version(self) -> int | None:
        """The shared version this store last saw (None before its watcher read it)."""
        return self._cache.version

    async def wait_version(self, version: int) -> None:
        """Return once the watcher has seen ``version`` or a later one (tests, benchmarks)."""
        while self._cache.version is None or self._cache.version < version:
            await self._cache.seen.wait()

    async def shared_version(self) -> int:
        """The version counter in Redis now."""
        return int(cast(Any, await self._client.get(self._ver)) or 0)

    async def _watch(self, poll_s: float) -> None:
        # stopped by ``_closing``, not by a cancel: redis-py may turn a cancel that lands in a
        # read into its own TimeoutError (or swallow it), and the loop would go on
        while not self._closing:
            try:
                await self._follow(poll_s)
            except (RedisError, OSError) as exc:
                self._cache.pending_since = None
                self._cache.failing = True
                if not self._closing:
                    log.debug("resilience watcher: %s; retrying", exc)
                    await asyncio.sleep(poll_s)
            except Exception as exc:  # e.g. a client without pub/sub: checks read Redis again
                log.warning("resilience watcher stopped (%s): checks read Redis", exc)
                self._cache.version = None
                self._cache.invalidate()
                return

    async def _follow(self, poll_s: float) -> None:
        """Subscribe, then read the counter every ``poll_s`` (and right after a message), and
        wait for messages in between, waking every :data:`WAKE_S` to see whether to stop."""
        subscriber = await self._subscriber()
        pubsub = (subscriber or self._client).pubsub()
        try:
            await pubsub.subscribe(self._channel)
            next_poll = 0.0
            while not self._closing:
                if time.monotonic() >= next_poll:
                    asked = self._cache.pending_since = self._clock.now_ms()
                    version = await self.shared_version()
                    self._cache.pending_since, self._cache.failing = None, False
                    self._cache.observe(version, asked)
                    next_poll = time.monotonic() + poll_s
                wait = min(WAKE_S, max(0.0, next_poll - time.monotonic()))
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                if msg is not None:
                    self._cache.observe(int(msg["data"]), None)
                    next_poll = 0.0  # confirm the new version at once
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]  # untyped before redis 8
            finally:
                if subscriber is not None:
                    await subscriber.aclose()

    async def _subscriber(self) -> redis.asyncio.Redis | None:
        """On a Redis Cluster, a client of its own for the subscription: one connection to the
        primary of the ``{rs}`` slot (asked anew on every restart of the watcher, so a failover
        moves it along). The cluster client's own pub/sub would hold a node connection outside
        its bounded permits (:mod:`fairgate.backends.redis_client`). A ``PUBLISH`` reaches every
        node of a cluster, so the scripts' messages arrive whichever node published them; the
        slot's primary is the one that runs the scripts, so they arrive without a hop. The
        version counter is still read through the cluster client (routed by its slot).
        None on a single server: its client's pool serves the subscription."""
        if not isinstance(self._client, RedisCluster):
            return None
        try:
            await self._client.initialize()  # discovers the cluster once (a no-op after that)
            node = self._client.get_node_from_key(self._ver)
        except RedisClusterException as exc:  # not a RedisError: the watcher retries this too
            raise RedisConnectionError(f"cluster unavailable: {exc}") from exc
        if node is None:  # pragma: no cover - a primary always covers a slot of a healthy cluster
            raise RedisConnectionError("no cluster node serves the resilience keys' slot")
        pool = redis.asyncio.ConnectionPool(
            connection_class=node.connection_class, max_connections=1, **node.connection_kwargs
        )
        return redis.asyncio.Redis.from_pool(pool)

    async def _stop_watch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is None:
            return
        self._closing = True
        with contextlib.suppress(RedisError, OSError):
            await self._client.publish(self._channel, 0)  # wakes the watcher now (ignored)
        done, _ = await asyncio.wait({task}, timeout=CLOSE_WAIT_S)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_WAIT_S)

    async def snapshot(self) -> StoreSnapshot:
        """Every remembered entry, found through the index (never a SCAN); the index is pruned
        of forgotten members on the way."""
        now = self._clock.now_ms()
        members = [
            _text(m)
            for m in cast(
                list[object],
                await self._client.zrangebyscore(
                    self._idx, f"({now}", "+inf", start=0, num=SNAPSHOT_LIMIT
                ),
            )
        ]
        await self._client.zremrangebyscore(self._idx, "-inf", now)
        pipe = self._client.pipeline(transaction=False)
        for member in members:
            fields = _BREAKER_FIELDS if member.startswith("br:") else _BLOCK_FIELDS
            pipe.hmget(self._key(member), list(fields))
        replies = cast(list[list[object]], await pipe.execute()) if members else []
        out = StoreSnapshot(permanent=await self.list_permanent())
        for member, raw in zip(members, replies, strict=True):
            kind, _, rest = member.partition(":")
            if kind == "br":
                rec = self._live_breaker(_breaker(raw))
                if rec is not None:
                    out.breakers[rest] = rec
                continue
            cd = self._live(_cooldown(raw))
            if cd is None:
                continue
            if kind == "cd":
                out.cooldowns[rest] = cd
            elif kind == "lk":
                provider, _, tail = rest.partition(":")
                conn_id, _, model = tail.partition(":")
                out.lockouts[LockoutKey(provider, conn_id, model)] = cd
        return out

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self._stop_watch()
        if self._owns_client:
            await self._client.aclose()

    def info(self) -> dict[str, Any]:
        return {"driver": self.name, "base": self._base}
