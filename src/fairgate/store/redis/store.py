"""The Redis driver of :class:`~fairgate.quota.ports.QuotaStore`: counters shared by replicas.

Every multi-step update is one Lua script (``store/lua/*.lua``) run with EVALSHA, so an admission
is one round trip and atomic across every gateway process that shares the server. Time is an
argument of the scripts, never Redis ``TIME``: the caller's clock is the one the decision and the
SQLite driver use, and tests can pin it.

Key layout (the pool id is the hash tag, so a cluster keeps a pool's keys in one slot and a
script may touch all of them)::

    <prefix>:{<pool>}:c:<key id>:<counter>:<bucket>   counter bucket (key id "*" = pool total)
    <prefix>:{<pool>}:r:<reservation id>              reservation parts (JSON)
    <prefix>:{<pool>}:rz                              ZSET reservation id -> expires_ms
    <prefix>:{<pool>}:act                             ZSET key id -> last admission ms
    <prefix>:{<pool>}:cum                             HASH counter -> cumulative use
    <prefix>:{<pool>}:anchor                          HASH counter -> provider-anchored window
                                                      ("<reset_ms>|<bucket index>|<source>")
    <prefix>:{slot:<connection>}:leases               ZSET concurrency lease id -> expires_ms
                                                      (per connection; see redis_slots.py)

Worked example: with prefix ``fairgate``, pool ``p1``, key ``k1``, counter ``requests/hourly`` at
``T0 = 1_700_002_800_000`` (bucket ``T0 // 3_600_000 = 472223``) an admission reads
``fairgate:{p1}:c:*:requests/hourly:472222`` and ``...:472223`` (pool total) and the same two for
``k1``, and writes the ``472223`` buckets with a TTL of two hours.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
import logging
import math
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NamedTuple, TypeVar, cast

import redis
import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairgate.backends.deadline import NoReply, call_within
from fairgate.backends.redis_client import AsyncClient, async_client, prepare, probe_client
from fairgate.quota.decision import POLICY_CODES, REASON_CODES, DimensionCheck, Outcome, Verdict
from fairgate.quota.hold import QueueFull, Waiter
from fairgate.quota.ports import (
    RECLAIM_BATCH,
    TOTAL_KEY,
    AdmitRequest,
    AdmitResult,
    CounterRef,
    GcResult,
    PoolCounts,
    ReservationExists,
    UsageItem,
)
from fairgate.quota.window import Anchor, Count, bucket_index, reanchor
from fairgate.store.coalesce import Coalescer
from fairgate.store.redis.lane import LaneScript, ScriptLane
from fairgate.store.redis.slots import RedisSlotLeases

log = logging.getLogger("fairgate.store")

T = TypeVar("T")

#: Outcome codes returned by admit.lua.
_OUTCOMES: Final = (Outcome.ALLOW, Outcome.PENALIZE, Outcome.BLOCK)
#: admit.lua's ``full`` code: none, the key's queue, the pool's
_QUEUE_FULL: Final = (None, QueueFull.KEY, QueueFull.POOL)
#: each policy's code (``POLICY_CODES``) as the admit script's argument
_POLICY_ARGS: Final = {policy: b"%d" % code for policy, code in POLICY_CODES.items()}
#: Beyond the lease, a reservation's key lives this long so a late reclaim still finds its parts.
_RESERVATION_MARGIN_MS: Final = 60_000
#: The GC lock's TTL: a replica that dies while collecting holds it no longer than this.
GC_LOCK_TTL_MS: Final = 10 * 60_000
#: Delete the lock only when it still holds our token (it may have expired and been re-taken).
_UNLOCK: Final = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: A settled reservation leaves a marker this long, so a settle applied twice (its first reply
#: timed out, the engine journaled and replayed it) adds its usage once.
SETTLED_TTL_MS: Final = 120_000
#: At most this many settles of a pool in one settle.lua call (the rest go in the next one).
MAX_SETTLE_BATCH: Final = 64
_SCAN_COUNT: Final = 1000
#: A pool's anchor hash lives 2 × its window beyond the last write (a reading of a new window
#: rewrites it), plus a day: readings that stop for that long fall back to epoch-aligned windows.
_ANCHOR_MARGIN_MS: Final = 86_400_000
#: Compare-and-set attempts of one reading against replicas writing the same anchor.
_ANCHOR_ATTEMPTS: Final = 5
_DELETE_BATCH: Final = 500
#: The store's timeout per command (``QUOTA_STORE_REDIS_TIMEOUT_MS``), and the out-of-loop
#: probe's connect timeout. Short on purpose: when Redis hangs, the admissions in flight wait
#: this long before failing open; after that first failure the engine's circuit fails every
#: admission open at once. The timeout is lag compensated (:mod:`fairgate.backends.deadline`): it
#: counts only the time this process's event loop was responsive, so a starved loop that reads
#: a reply late is no outage (0.5 s without that compensation gave false outages on a loaded
#: two-core host). A dead server is detected at once anyway (connection refused).
DEFAULT_CONNECT_TIMEOUT_S: Final = 0.5
DEFAULT_SOCKET_TIMEOUT_S: Final = 1.0
#: The out-of-loop probe waits at least this long for its PONG. Its thread needs the GIL and a
#: time slice of a host whose cores may be busy: with the store's timeout at 100 ms, the probe
#: itself missed live replies under the stress test. It only has to tell dead from alive.
PROBE_MIN_TIMEOUT_S: Final = 1.0
#: However busy the loop, a command is abandoned after this (a multiple of the timeout).
CEILING_FACTOR: Final = 10
MIN_CEILING_S: Final = 10.0
#: The store's calls in flight at once (a burst queues for a slot instead of opening more
#: connections): on one server, the most scripts pipelined on its script connection
#: (:mod:`.redis_lane`); the size of its client's pool, all opened by
#: :meth:`RedisQuotaStore.warm` before traffic arrives on a cluster; and how long a caller
#: waits for a pooled connection when all are busy (a :class:`PoolWaitTimeout`, a timeout, not
#: an outage).
MAX_CONNECTIONS: Final = 32
POOL_TIMEOUT_S: Final = 5.0
#: Of the client's pool (the reads and maintenance commands; on a single server the hot-path
#: scripts run on the store's own lane, :mod:`.redis_lane`), how many connections
#: :meth:`RedisQuotaStore.warm` opens before traffic.
WARM_POOL_CONNECTIONS: Final = 4
#: The most pools, and (pool, key, counter, bucket) pairs, whose key bytes are kept: past it
#: the cache starts over (a bound on memory, never on correctness).
KEY_CACHE_LIMIT: Final = 10_000


class PoolWaitTimeout(RedisTimeoutError):
    """Every pooled connection stayed busy for ``POOL_TIMEOUT_S``. redis-py reports this as a
    ``ConnectionError`` ("No connection available"), which would read as a refused connection,
    an outage at once; it is a symptom of load, so it is a timeout here (confirmed by a probe
    before it counts as an outage)."""


class SlowReply(RedisTimeoutError):
    """No reply within the timeout, but the server answered the out-of-loop probe: this
    process was too busy to read the reply in time. A timeout (retried), not an outage."""


class StoreFailing(RedisConnectionError):
    """Another call found the server gone while this one waited for a connection: an outage,
    failed at once instead of after one more timeout."""


class _Pool(redis.asyncio.BlockingConnectionPool):
    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            if isinstance(exc.__cause__, asyncio.TimeoutError):
                raise PoolWaitTimeout("no pooled Redis connection became free") from exc
            raise


@functools.cache
def script_source(name: str) -> str:
    """The script ``name`` with the shared helpers in front (read once per process)."""
    lua = importlib.resources.files("fairgate.store") / "lua"
    lib = (lua / "lib.lua").read_text(encoding="utf-8")
    return lib + "\n" + (lua / name).read_text(encoding="utf-8")


def _check_id(kind: str, value: str) -> str:
    """Refuse ids that could break the hash tag: a ``{``/``}`` would move the slot a key hashes to,
    and whitespace is never a legitimate id (it usually means a parsing slip upstream)."""
    if not value or any(ch in "{}" or ch.isspace() for ch in value):
        raise ValueError(f"invalid {kind} {value!r}: must be non-empty, without braces or spaces")
    return value


def _check_key_id(key_id: str) -> str:
    _check_id("key id", key_id)
    if key_id == TOTAL_KEY:
        raise ValueError(f"key id {TOTAL_KEY!r} is reserved for the pool total")
    if ":" in key_id:
        # counter names may hold ':' (model caps), so a ':' in a key id could make two
        # (key, counter) pairs spell the same Redis key
        raise ValueError(f"invalid key id {key_id!r}: ':' is not allowed")
    return key_id


def _numb(value: float) -> bytes:
    """A float as the exact text Lua's ``tonumber`` reads back bit for bit, in the bytes a
    script argument is sent as."""
    return repr(float(value)).encode()


def _int(value: int) -> bytes:
    return b"%d" % value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"cost and usage amounts must be finite, got {value!r}")
    return float(value)


def _text(value: object) -> str:
    """Reply values as str whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _float(value: object) -> float:
    return 0.0 if value is None else float(_text(value))


def _parse_anchor(value: str) -> Anchor | None:
    """A stored ``"<reset_ms>|<index>|<source>"`` (None: empty or unreadable)."""
    reset, _, rest = value.partition("|")
    index, _, source = rest.partition("|")
    try:
        return Anchor(int(reset), int(index), source)
    except ValueError:
        return None


def _discard(command: Awaitable[Any]) -> None:
    """Close a command coroutine that will never be awaited (no "never awaited" warning)."""
    close = getattr(command, "close", None)
    if close is not None:
        close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


_RECLAIM_BATCH: Final = b"%d" % RECLAIM_BATCH
_SETTLED_TTL_MS: Final = b"%d" % SETTLED_TTL_MS


class _HotScript(NamedTuple):
    """A hot-path script for both ways of sending it (:meth:`RedisQuotaStore._run`)."""

    client: AsyncScript
    wire: LaneScript


class _SettleCall(NamedTuple):
    """One settle or record as settle.lua takes it within a batch: its keys (the reservation's,
    then two per usage item) and its arguments (now, mode, reservation id, key id, items)."""

    keys: list[bytes]
    args: list[bytes]


class _PoolKeys:
    """A pool's fixed keys as the bytes the scripts get (see the module docstring's layout)."""

    __slots__ = ("act", "base", "base_b", "cum", "rz")

    def __init__(self, base: str) -> None:
        self.base = base
        self.base_b = base.encode()
        self.rz = self.base_b + b":rz"
        self.act = self.base_b + b":act"
        self.cum = self.base_b + b":cum"

    def reservation(self, rid: bytes) -> bytes:
        return self.base_b + b":r:" + rid


#: (pool base key, key id, counter, current bucket index): one counter's buckets
_BucketRef = tuple[str, str, str, int]
#: (scope, window ms, limit, cap, anchored, window share): a check's fixed arguments
_FixedRef = tuple[str, int, float, float | None, bool, bool]


def _build_fixed_args(ref: _FixedRef) -> tuple[bytes, ...]:
    scope, window_ms, limit, cap, anchored, window_share = ref
    return (
        scope.encode(),
        _int(window_ms),
        _numb(limit),
        b"" if cap is None else _numb(cap),
        b"1" if anchored else b"0",
        b"1" if window_share else b"0",
    )


K = TypeVar("K")
V = TypeVar("V")


class _Memo(dict[K, V]):
    """The hot path's cached values: a dict that builds a missing value from its key and starts
    over once it holds :data:`KEY_CACHE_LIMIT` (bounded memory however many pools, keys and
    buckets pass through). A hit is a plain dict lookup; ``build`` runs once per distinct key,
    and a key it refuses (an invalid id) is stored nowhere."""

    __slots__ = ("_build",)

    def __init__(self, build: Callable[[K], V]) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, key: K) -> V:
        value = self._build(key)
        if len(self) >= KEY_CACHE_LIMIT:
            self.clear()
        self[key] = value
        return value


class RedisQuotaStore:
    """Quota counters in Redis; see the module docstring for the key layout."""

    name = "redis"
    #: what an outage looks like from here (the engine fails open and journals on these):
    #: refused or dropped connections (also "loading the dataset" after a restart), timeouts,
    #: and a replica that was demoted under us
    unavailable_errors: tuple[type[BaseException], ...] = (
        RedisConnectionError,
        RedisTimeoutError,
        ReadOnlyError,
        NoReply,
    )
    #: the ambiguous ones: a timeout is an outage only when :meth:`confirm_alive` says so
    #: (a reply this process's starved event loop read too late is no outage)
    timeout_errors: tuple[type[BaseException], ...] = (RedisTimeoutError,)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "fairgate",
        client: AsyncClient | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    ) -> None:
        self._prefix = _check_id("prefix", prefix)
        self._timeout_s = socket_timeout_s
        self._ceiling_s = max(MIN_CEILING_S, CEILING_FACTOR * socket_timeout_s)
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._failures = 0  # calls that found the server gone (see _call)
        self._confirming: asyncio.Future[bool] | None = None
        self._probe_lock = threading.Lock()  # one PING at a time on the probe's connection
        self._owns_client = client is None
        # the out-of-loop probe's own blocking client (one socket, used from a worker thread)
        self._probe_client = probe_client(
            url,
            connect_timeout_s=max(PROBE_MIN_TIMEOUT_S, connect_timeout_s),
            socket_timeout_s=max(PROBE_MIN_TIMEOUT_S, socket_timeout_s),
        )
        self._client: AsyncClient = (
            client if client is not None else self._own_client(url, self._ceiling_s)
        )
        self._admit = self._hot("admit.lua")
        self._settle = self._hot("settle.lua")
        self._release = self._hot("release.lua")
        self._anchor = self._register("anchor.lua")
        self._unlock = self._client.register_script(_UNLOCK)
        # the hot-path scripts on connections of the store's own on a single server; a
        # cluster client routes them by slot (:mod:`.redis_lane`)
        self._lane: ScriptLane | None = (
            ScriptLane(self._client.connection_pool)
            if isinstance(self._client, redis.asyncio.Redis)
            else None
        )
        self._pool_keys = _Memo[str, _PoolKeys](lambda pool_id: _PoolKeys(self._base(pool_id)))
        self._key_ids = _Memo[str, str](_check_key_id)
        self._bucket_keys = _Memo[_BucketRef, tuple[bytes, bytes]](self._build_bucket_pair)
        self._check_keys = _Memo[_BucketRef, tuple[bytes, ...]](self._build_admit_keys)
        self._fixed = _Memo[_FixedRef, tuple[bytes, ...]](_build_fixed_args)
        self._settles = Coalescer[str, _SettleCall, int](
            self._settle_batch, max_batch=MAX_SETTLE_BATCH
        )

    async def _call(self, command: Awaitable[T]) -> T:
        """Every command within the store's timeout, lag compensated (:mod:`.deadline`).

        The deadline starts once the command holds one of the pool's connections (a slot):
        under a burst, hundreds of calls queue for the 32 connections, and that queue drains
        at the pace of this process's CPU share, not of Redis. The wait for a slot has no
        deadline of its own; instead, a call that waited while another call found the server
        gone (connection refused or dropped, or no reply confirmed by the out-of-loop probe)
        gives up at once (:class:`StoreFailing`), so a queue never outlives an outage by more
        than the in-flight calls' timeout.

        No reply within the deadline is confirmed by :meth:`confirm_alive` (a probe the loop
        cannot starve; concurrent ones share it): a dead server is :class:`NoReply`, an
        outage; a server that answers the probe means this loop was too slow to read the reply
        (a long ready queue, not one long block), which is :class:`SlowReply`, a timeout the
        engine retries."""
        seen = self._failures
        try:
            await self._slots.acquire()
        except BaseException:
            _discard(command)
            raise
        try:
            if self._failures != seen:
                _discard(command)
                raise StoreFailing("the quota store failed while this call waited")
            try:
                return await call_within(command, self._timeout_s, ceiling_s=self._ceiling_s)
            except NoReply:
                if await self.confirm_alive():
                    raise SlowReply("no reply in time, yet Redis answers: a busy loop") from None
                self._failures += 1
                raise
            except (RedisConnectionError, OSError):
                self._failures += 1
                raise
        finally:
            self._slots.release()

    @staticmethod
    def _own_client(url: str, ceiling_s: float) -> AsyncClient:
        """A client that gives up fast: the store's lag-compensated deadline on every command
        (the socket timeouts are only the hard ceiling behind it), and one immediate retry on
        a connection error only. The retry is what makes a Redis restart invisible: the pooled
        connections are dead then, and the retry reconnects. redis-py's default (ten retries
        with backoff, five-second timeouts) would hold each admission for seconds during an
        outage; retrying a *timeout* could apply a script twice and double the wait.

        The pool is bounded and callers beyond it queue for a connection: a burst of hundreds
        of admissions would otherwise open hundreds of connections at once, and the handshakes
        of that storm (not Redis) are what can push a reply past the short read timeout on a
        busy host, which would look like an outage and fail admissions open. On a Redis Cluster
        the bound is per node; :meth:`_call`'s semaphore keeps the commands in flight within it
        (the cluster client fails rather than queue when a node's connections are all busy)."""
        return async_client(
            url,
            max_connections=MAX_CONNECTIONS,
            pool_timeout_s=POOL_TIMEOUT_S,
            connect_timeout_s=ceiling_s,
            socket_timeout_s=ceiling_s,
            keepalive=True,
            pool_class=_Pool,
        )

    def _run(
        self, script: _HotScript, keys: list[bytes], args: list[bytes], *, later: bool = False
    ) -> Awaitable[Any]:
        """EVALSHA of a hot-path script: on the lane (pipelined with the loop turn's other
        calls; ``later``: with the next admission's, :meth:`ScriptLane.evalsha`) when there is
        one, else through the client (a cluster routes it by the keys' slot)."""
        if self._lane is not None:
            return self._lane.evalsha(script.wire, keys, args, later=later)
        return script.client(keys=keys, args=args)

    def _hot(self, name: str) -> _HotScript:
        return _HotScript(self._register(name), LaneScript(script_source(name)))

    def _register(self, name: str) -> AsyncScript:
        # register_script only hashes the text; the server loads it on the first NOSCRIPT, so
        # a Redis restarted empty gets the scripts again on first use.
        return self._client.register_script(script_source(name))

    def slot_leases(self) -> RedisSlotLeases:
        """Concurrency slots shared through this store's Redis (:mod:`.redis_slots`)."""
        return RedisSlotLeases(self._client, self._prefix, self._call, script_source)

    @property
    def script_shas(self) -> dict[str, str]:
        """SHA1 of each script, as EVALSHA sends it (the same for every instance and process)."""
        return {
            name: script.wire.sha.decode()
            for name, script in (
                ("admit", self._admit),
                ("settle", self._settle),
                ("release", self._release),
            )
        }

    # -- keys -----------------------------------------------------------------------------------

    def _base(self, pool_id: str) -> str:
        return f"{self._prefix}:{{{_check_id('pool id', pool_id)}}}"

    @staticmethod
    def _counter(base: str, key_id: str, counter: str, bucket: int) -> str:
        return f"{base}:c:{key_id}:{counter}:{bucket}"

    def _buckets(self, base: str, key_id: str, ref: CounterRef, now_ms: int) -> tuple[str, str]:
        curr = bucket_index(now_ms, ref.window_ms, ref.anchor)
        return (
            self._counter(base, key_id, ref.key, curr - 1),
            self._counter(base, key_id, ref.key, curr),
        )

    # The hot path's keys and fixed arguments as bytes, cached (each a _Memo): a pool's fixed
    # keys per pool, the ids already checked, a counter's previous and current bucket and a
    # check's four keys per (pool, key, counter, bucket), a check's fixed arguments per
    # configuration. Each key is the same text as the ``str`` helpers above build (one layout,
    # two encodings).

    def _pool(self, pool_id: str) -> _PoolKeys:
        return self._pool_keys[pool_id]

    def _key_id(self, key_id: str) -> str:
        return self._key_ids[key_id]

    def _bucket_pair(self, base: str, key_id: str, counter: str, curr: int) -> tuple[bytes, bytes]:
        """The previous and current bucket keys of one counter, as bytes."""
        return self._bucket_keys[(base, key_id, counter, curr)]

    def _build_bucket_pair(self, ref: _BucketRef) -> tuple[bytes, bytes]:
        base, key_id, counter, curr = ref
        return (
            self._counter(base, key_id, counter, curr - 1).encode(),
            self._counter(base, key_id, counter, curr).encode(),
        )

    def _admit_keys(self, base: str, key_id: str, counter: str, curr: int) -> tuple[bytes, ...]:
        """One check's four keys as admit.lua takes them: the pool total's previous and current
        bucket, then the key's (one cached tuple per pool, key, counter and bucket)."""
        return self._check_keys[(base, key_id, counter, curr)]

    def _build_admit_keys(self, ref: _BucketRef) -> tuple[bytes, ...]:
        base, key_id, counter, curr = ref
        return (
            *self._bucket_pair(base, TOTAL_KEY, counter, curr),
            *self._bucket_pair(base, key_id, counter, curr),
        )

    def _fixed_args(self, check: DimensionCheck) -> tuple[bytes, ...]:
        """The arguments of a check that the pool's configuration fixes (admit.lua's first six
        per check), packed once per distinct configuration, not on every admission."""
        ref = (
            check.scope,
            check.window_ms,
            check.limit,
            check.cap,
            check.anchor is not None,
            check.window_share,
        )
        return self._fixed[ref]

    # -- hot path -------------------------------------------------------------------------------

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        pool = self._pool(req.pool_id)
        base = pool.base
        key_id = self._key_id(req.key_id)
        rid = req.reservation_id.encode()
        keys = [pool.base_b, pool.rz, pool.act, pool.reservation(rid)]
        checks = req.checks
        args = [
            _int(req.now_ms),
            key_id.encode(),
            rid,
            _POLICY_ARGS[req.policy],
            _numb(req.threshold),
            _int(req.lease_ms),
            _int(self._reservation_ttl(req)),
            _RECLAIM_BATCH,
            _int(len(checks)),
        ]
        now_ms = req.now_ms
        for check in checks:
            curr = bucket_index(now_ms, check.window_ms, check.anchor)
            keys += self._admit_keys(base, key_id, check.key, curr)
            args += self._fixed_args(check)
            args += (
                _numb(check.fair_share),
                _numb(_finite(check.cost)),
                _numb(check.signal),
                _numb(check.reserve),
            )
        hold = req.hold
        if hold is not None:  # admit.lua's section 2b
            args += (
                hold.waiter_id.encode(),
                _int(hold.enqueued_ms),
                _int(hold.deadline_ms),
                _numb(hold.weight),
                _int(hold.per_key),
                _int(hold.per_pool),
            )
        reply = cast(list[Any], await self._call(self._run(self._admit, keys, args)))
        if int(reply[0]) < 0:  # nothing was reserved (as the SQLite driver's rollback)
            raise ReservationExists(req.reservation_id)
        outcome = _OUTCOMES[int(reply[0])]
        index = int(reply[2])
        verdict = Verdict(
            outcome,
            REASON_CODES[int(reply[1])],
            None if index < 0 else index,
        )
        # per check the raw strings of total prev, total curr, key prev, key curr (never nil:
        # the script sends '0' for a missing bucket); float() reads bytes and str alike
        totals = []
        mine = []
        i = 3
        for check in checks:
            totals.append(Count(float(reply[i]), float(reply[i + 1]), check.anchor))
            mine.append(Count(float(reply[i + 2]), float(reply[i + 3]), check.anchor))
            i += 4
        return AdmitResult(
            verdict,
            tuple(totals),
            tuple(mine),
            reserved=outcome is not Outcome.BLOCK,
            waiting=int(reply[i]) == 1,
            queue_full=_QUEUE_FULL[int(reply[i + 1])],
        )

    def _waiters_key(self, pool_id: str) -> str:
        """The pool's queue of held requests (admit.lua's section 2b)."""
        return f"{self._base(pool_id)}:w"

    async def leave(self, pool_id: str, waiter_id: str) -> bool:
        removed = await self._call(self._client.hdel(self._waiters_key(pool_id), waiter_id))
        return int(removed) > 0

    async def waiters(self, pool_id: str, now_ms: int) -> list[Waiter]:
        raw = await self._call(self._client.hgetall(self._waiters_key(pool_id)))
        out: list[Waiter] = []
        for wid, value in cast(dict[Any, Any], raw).items():
            key, enq, deadline, share, owed = _text(value).split("\t")
            if int(deadline) > now_ms:
                out.append(
                    Waiter(_text(wid), key, int(enq), int(deadline), float(share), owed == "1")
                )
        return out

    @staticmethod
    def _reservation_ttl(req: AdmitRequest) -> int:
        """Lease plus a margin long enough that a reclaim arriving late (an idle pool admits
        nothing for a while) still finds the parts: they matter while their buckets are current or
        previous, i.e. up to 2 x the longest window after the admission."""
        longest = max((c.window_ms for c in req.checks), default=0)
        return max(req.lease_ms, 2 * longest) + _RESERVATION_MARGIN_MS

    async def settle(
        self,
        pool_id: str,
        key_id: str,
        reservation_id: str,
        usage: Sequence[UsageItem],
        now_ms: int,
    ) -> None:
        await self._apply("settle", pool_id, key_id, reservation_id, usage, now_ms)

    async def release(self, pool_id: str, reservation_id: str, now_ms: int) -> bool:
        pool = self._pool(pool_id)
        rid = reservation_id.encode()
        keys = [pool.rz, pool.reservation(rid)]
        reply = await self._call(self._run(self._release, keys, [_int(now_ms), rid]))
        return int(cast(int, reply)) == 1

    async def record(
        self, pool_id: str, key_id: str, usage: Sequence[UsageItem], now_ms: int
    ) -> None:
        await self._apply("record", pool_id, key_id, "", usage, now_ms)

    async def _apply(
        self,
        mode: str,
        pool_id: str,
        key_id: str,
        reservation_id: str,
        usage: Sequence[UsageItem],
        now_ms: int,
    ) -> bool:
        """One settle or record (settle.lua: drop the reservation, ``settle`` only, and add the
        actual use), sent with the other settles of its pool that wait while one batch of them
        is in flight (:mod:`.coalesce`): it returns once it has been applied."""
        pool = self._pool(pool_id)
        base = pool.base
        key_id = self._key_id(key_id)
        rid = reservation_id.encode()
        keys = [pool.reservation(rid)]
        args = [_int(now_ms), mode.encode(), rid, key_id.encode(), _int(len(usage))]
        for item in usage:
            curr = bucket_index(now_ms, item.window_ms, item.anchor)
            keys.append(self._bucket_pair(base, key_id, item.key, curr)[1])
            keys.append(self._bucket_pair(base, TOTAL_KEY, item.key, curr)[1])
            args.extend(
                (
                    _int(item.window_ms),
                    _numb(_finite(item.amount)),
                    item.scope.encode(),
                    item.key.encode(),
                )
            )
        return await self._settles.submit(pool_id, _SettleCall(keys, args)) == 1

    async def _settle_batch(self, pool_id: str, calls: list[_SettleCall]) -> list[int]:
        """One settle.lua call for a batch of a pool's settles and records, applied in order."""
        pool = self._pool(pool_id)
        keys = [pool.rz, pool.cum, pool.act]
        args = [_SETTLED_TTL_MS, _int(len(calls))]
        for call in calls:
            keys += call.keys
            args += call.args
        reply = await self._call(self._run(self._settle, keys, args, later=True))
        return [int(code) for code in cast(list[Any], reply)]

    # -- reads ----------------------------------------------------------------------------------

    async def _mget(self, keys: Sequence[str]) -> list[float]:
        """One MGET: one round trip however many counters are read."""
        if not keys:
            return []
        values = await self._call(self._client.mget(list(keys)))
        return [_float(v) for v in cast(list[object], values)]

    async def peek(
        self, pool_id: str, key_id: str, counters: Sequence[CounterRef], now_ms: int
    ) -> dict[str, Count]:
        base = self._base(pool_id)
        key_id = _check_key_id(key_id)
        keys = [k for ref in counters for k in self._buckets(base, key_id, ref, now_ms)]
        values = await self._mget(keys)
        return {
            ref.key: Count(values[2 * i], values[2 * i + 1], ref.anchor)
            for i, ref in enumerate(counters)
        }

    async def pool_usage(
        self,
        pool_id: str,
        key_ids: Sequence[str],
        counters: Sequence[CounterRef],
        now_ms: int,
    ) -> PoolCounts:
        base = self._base(pool_id)
        owners = [TOTAL_KEY, *(_check_key_id(k) for k in key_ids)]
        keys = [
            k
            for owner in owners
            for ref in counters
            for k in self._buckets(base, owner, ref, now_ms)
        ]
        values = iter(await self._mget(keys))
        counts: dict[str, dict[str, Count]] = {}
        for owner in owners:
            counts[owner] = {
                ref.key: Count(next(values), next(values), ref.anchor) for ref in counters
            }
        totals = counts.pop(TOTAL_KEY)
        return PoolCounts(totals=totals, per_key=counts)

    async def active_keys(self, pool_id: str, since_ms: int) -> list[str]:
        base = self._base(pool_id)
        members = await self._call(self._client.zrangebyscore(f"{base}:act", since_ms, "+inf"))
        return sorted(_text(m) for m in cast(list[object], members))

    async def cumulative(self, pool_id: str, counter_keys: Sequence[str]) -> dict[str, float]:
        if not counter_keys:
            return {}
        base = self._base(pool_id)
        values = await self._call(self._client.hmget(f"{base}:cum", list(counter_keys)))
        return {k: _float(v) for k, v in zip(counter_keys, cast(list[object], values), strict=True)}

    async def anchors(self, pool_id: str) -> dict[str, Anchor]:
        raw = await self._call(self._client.hgetall(f"{self._base(pool_id)}:anchor"))
        out: dict[str, Anchor] = {}
        for field, value in cast(dict[object, object], raw).items():
            anchor = _parse_anchor(_text(value))
            if anchor is not None:
                out[_text(field)] = anchor
        return out

    async def set_anchor(
        self,
        pool_id: str,
        counter: str,
        window_ms: int,
        reset_ms: int,
        now_ms: int,
        source: str,
    ) -> Anchor | None:
        """Read, apply :func:`~fairgate.quota.window.reanchor`, compare-and-set (anchor.lua);
        read again when another replica wrote in between (rare: once per window at most)."""
        key = f"{self._base(pool_id)}:anchor"
        ttl = 2 * window_ms + _ANCHOR_MARGIN_MS
        for _ in range(_ANCHOR_ATTEMPTS):
            raw = await self._call(self._client.hget(key, counter))
            seen = "" if raw is None else _text(raw)
            current = _parse_anchor(seen)
            moved = reanchor(current, reset_ms, window_ms, now_ms, source)
            if moved is None:
                return current
            value = f"{moved.reset_ms}|{moved.index}|{moved.source}"
            written = await self._call(self._anchor(keys=[key], args=[counter, seen, value, ttl]))
            if int(cast(int, written)) == 1:
                return moved
        return current

    # -- maintenance ----------------------------------------------------------------------------

    async def clear(self, pool_id: str) -> None:
        """Delete the pool's keys by SCAN: pool deletion is rare, so a scan is acceptable here."""
        pattern = _glob_escape(self._base(pool_id)) + ":*"
        batch: list[str | bytes] = []
        async for key in self._client.scan_iter(match=pattern, count=_SCAN_COUNT):
            batch.append(cast(str | bytes, key))
            if len(batch) >= _DELETE_BATCH:
                await self._client.delete(*batch)
                batch = []
        if batch:
            await self._client.delete(*batch)

    async def gc(self, now_ms: int, retention_ms: int) -> GcResult:
        """No bucket needs deleting (``buckets`` is always 0), since each bucket has a TTL of
        2 × its window, refreshed on every write. Redis drops a bucket once it can no longer be
        the previous bucket, which is when nothing reads it any more. That is never inside
        2 × its window (the rule), and when the retention is longer it is only earlier than the
        rule requires, which does no harm.

        What TTLs cannot do, gc does as the SQLite driver does: undo the expired reservations
        of pools nobody admits to any more (their amounts would otherwise stay on the dashboard
        until the bucket expires, 60 days for a monthly window) and forget keys inactive for
        longer than the retention. It finds the pools with a SCAN over their ZSETs, which is
        acceptable because gc runs off the hot path.

        One replica at a time: the run holds a lock key (``SET NX`` with a TTL, released only
        by its holder); a replica that finds it held skips the run (``skipped``).
        """
        lock, token = f"{self._prefix}:gc-lock", uuid.uuid4().hex
        if not await self._client.set(lock, token, nx=True, px=GC_LOCK_TTL_MS):
            return GcResult(skipped=True)
        undone = forgotten = 0
        try:
            head = f"{self._prefix}:{{"
            pattern = _glob_escape(head) + "*}:*"
            zsets = self._client.scan_iter(match=pattern, count=_SCAN_COUNT, _type="zset")
            async for raw in zsets:
                name = _text(raw)
                pool_id, _, kind = name[len(head) :].partition("}:")
                if kind == "rz":
                    expired = await self._client.zrangebyscore(name, "-inf", now_ms)
                    for rid in cast(list[object], expired):
                        undone += await self.release(pool_id, _text(rid), now_ms)
                elif kind == "act":
                    cut = f"({now_ms - retention_ms}"
                    forgotten += int(await self._client.zremrangebyscore(name, "-inf", cut))
        finally:
            await self._unlock(keys=[lock], args=[token])
        return GcResult(0, forgotten, undone)

    async def ping(self) -> bool:
        try:
            return bool(await self._call(self._client.ping()))
        except (RedisError, OSError):
            return False

    async def confirm_alive(self) -> bool:
        """PING from a worker thread on a socket of its own: its deadline runs on the OS's
        clock, not on this event loop's, so a loop too busy to read replies in time cannot
        make a live server look dead (the thread needs only a few ms of CPU and the GIL).
        Concurrent callers (the store's calls, the engine) share one probe in flight: the
        probe has one connection, and a second PING at once would be refused by its pool."""
        pending = self._confirming
        if pending is None or pending.done():
            pending = self._confirming = asyncio.ensure_future(
                asyncio.to_thread(self._blocking_ping)
            )
        return await asyncio.shield(pending)

    def _blocking_ping(self) -> bool:
        try:
            with self._probe_lock:
                return bool(self._probe_client.ping())
        except Exception:  # any failure means "not alive" (redis-py may raise AttributeError
            # from its parser after a failed connect): the probe must answer, never raise
            return False

    async def warm(self) -> None:
        """Open every pooled connection now, one after the other, and put them back: traffic
        then finds them open, and a burst never opens a storm of connections (their
        handshakes on a busy host are what pushed replies past the read timeout). TCP
        keepalive keeps them open while idle; a connection that died anyway is replaced by the
        one immediate retry. A failure here is logged, never raised: the server may be back
        by the time traffic comes.

        On a single server the hot-path scripts have their own pipelined connection (the
        lane), which is opened, and a few of the client's pool, which serves only the reads
        and maintenance commands."""
        if self._lane is None:
            await prepare(self._client, MAX_CONNECTIONS)
            return
        if not await self._lane.open():
            log.warning("redis: the script connection did not open before traffic")
        await prepare(self._client, WARM_POOL_CONNECTIONS)

    async def close(self) -> None:
        await self._settles.drain()  # a graceful stop loses no settle handed in
        self._probe_client.close()
        if self._lane is not None:
            await self._lane.close()
        if self._owns_client:
            await self._client.aclose()
