"""Where resilience state lives: one interface, an in-memory and a Redis implementation.

Three kinds of state, each at its own scope (SPEC §9):

- connection cooldowns (``conn_id``) and model lockouts (``provider, conn_id, model``): a
  :class:`~fairgate.resilience.backoff.Cooldown` with an ABSOLUTE epoch-ms deadline, so every
  process and a restarted one agree on when it ends; updates are monotonic (a deadline is
  never shortened), and a record is remembered ``level_memory_ms`` past its deadline so the
  next failure continues the backoff. Reads expire lazily: no sweeper runs.
- permanent blocks (``scope`` = :func:`connection_scope` or :func:`model_scope`): a billing or
  monthly quota failure; only an admin clears them.
- breaker records per provider (:class:`~fairgate.resilience.breaker.BreakerRecord`), newest
  transition wins, and the one probe token of a half-open provider (:meth:`try_probe`), so a
  breaker opened by one replica is open for all and only one replica probes.

:class:`MemoryResilienceStore` serves a single process; ``RedisResilienceStore`` (in
:mod:`fairgate.resilience.state_redis`, imported lazily because Redis is an optional extra)
shares the state between gateway replicas. Both pass the same contract tests.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.resilience.backoff import Cooldown, merge
from fairgate.resilience.breaker import BreakerRecord
from fairgate.resilience.classify import FailureClass

__all__ = [
    "DEFAULT_LEVEL_MEMORY_MS",
    "NO_STATE",
    "LockoutKey",
    "MemoryResilienceStore",
    "PermanentBlock",
    "ResilienceStore",
    "StoreSnapshot",
    "TargetState",
    "connection_scope",
    "model_scope",
]

#: How long a cooldown/lockout record outlives its deadline (its backoff level is remembered).
DEFAULT_LEVEL_MEMORY_MS = 600_000
#: Bound on each in-memory table; beyond it the entries that end first are dropped.
DEFAULT_MAX_ENTRIES = 50_000


def connection_scope(conn_id: str) -> str:
    """The permanent-block scope of a whole connection."""
    return f"conn:{conn_id}"


def model_scope(provider: str, conn_id: str, model: str) -> str:
    """The permanent-block scope of one model of one connection."""
    return f"model:{provider}:{conn_id}:{model}"


class LockoutKey(NamedTuple):
    provider: str
    connection_id: str
    model: str


@dataclass(frozen=True, slots=True)
class PermanentBlock:
    """A block only an admin lifts. ``key_id``/``request_id`` name the client key and the request
    whose failure set it (ids, never secrets), so an admin can tell who caused it."""

    scope: str
    reason: str
    since_ms: int
    key_id: str | None = None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class TargetState:
    """Everything that may exclude one target, read in one go (one round trip in Redis).

    ``cooldown``/``lockout`` are the remembered records (check ``active(now)``); ``permanent``
    is the connection's or the model's block, if any.
    """

    cooldown: Cooldown | None = None
    lockout: Cooldown | None = None
    permanent: PermanentBlock | None = None
    breaker: BreakerRecord | None = None


#: A target nothing excludes (the memory store answers with this very object when it remembers
#: nothing at all).
NO_STATE = TargetState()


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """Every remembered entry (active or within level memory), for the health API."""

    cooldowns: dict[str, Cooldown] = field(default_factory=dict)
    lockouts: dict[LockoutKey, Cooldown] = field(default_factory=dict)
    permanent: list[PermanentBlock] = field(default_factory=list)
    breakers: dict[str, BreakerRecord] = field(default_factory=dict)


class ResilienceStore(Protocol):
    """The one interface resilience state goes through. All deadlines are absolute epoch ms."""

    name: str

    async def get_cooldown(self, conn_id: str) -> Cooldown | None:
        """The remembered cooldown (maybe past its deadline but within level memory)."""
        ...

    async def set_cooldown(self, conn_id: str, until_ms: int, level: int, reason: str) -> Cooldown:
        """Merge a cooldown in, never shortening the stored one; returns what is stored."""
        ...

    async def clear_cooldown(self, conn_id: str, *, unless_active_at: int | None = None) -> bool:
        """Forget the cooldown and its level (a success). With ``unless_active_at``, a cooldown
        still running at that instant is kept. True if something was removed."""
        ...

    async def get_lockout(self, provider: str, conn_id: str, model: str) -> Cooldown | None: ...

    async def set_lockout(
        self, provider: str, conn_id: str, model: str, until_ms: int, level: int, reason: str
    ) -> Cooldown: ...

    async def clear_lockout(
        self, provider: str, conn_id: str, model: str, *, unless_active_at: int | None = None
    ) -> bool: ...

    async def set_permanent(
        self,
        scope: str,
        reason: str,
        *,
        since_ms: int | None = None,
        key_id: str | None = None,
        request_id: str | None = None,
    ) -> PermanentBlock:
        """Block ``scope`` until :meth:`clear_permanent`; an existing block is kept as is.
        ``since_ms`` (default now) lets a restore keep the original time; ``key_id`` and
        ``request_id`` record what caused it."""
        ...

    async def clear_permanent(self, scope: str) -> bool: ...

    async def list_permanent(self) -> list[PermanentBlock]: ...

    async def get_breaker(self, provider: str) -> BreakerRecord | None: ...

    async def put_breaker(self, provider: str, record: BreakerRecord) -> bool:
        """Store ``record`` if it is newer (``updated_ms``) than the stored one."""
        ...

    async def try_probe(self, provider: str, lease_ms: int) -> bool:
        """Take the provider's single half-open probe token for ``lease_ms``; False if taken."""
        ...

    async def release_probe(self, provider: str) -> None: ...

    async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState: ...

    async def snapshot(self) -> StoreSnapshot: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


K = TypeVar("K")


def _bounded_put(
    table: MutableMapping[K, Cooldown], key: K, value: Cooldown, limit: int, forget_before: int
) -> None:
    """Insert keeping ``table`` within ``limit``: drop forgotten entries first, then the ones
    that end first (they matter least)."""
    if key not in table and len(table) >= limit:
        _prune(table, forget_before)
        while len(table) >= limit:
            del table[min(table, key=lambda k: table[k].until_ms)]
    table[key] = value


def _prune(table: MutableMapping[K, Cooldown], forget_before: int) -> None:
    for k in [k for k, v in table.items() if v.until_ms <= forget_before]:
        del table[k]


class MemoryResilienceStore:
    """Resilience state of one process: plain dicts, lazy expiry, bounded size."""

    name = "memory"

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        level_memory_ms: int = DEFAULT_LEVEL_MEMORY_MS,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        self._clock = clock
        self._memory = level_memory_ms
        self._max = max_entries
        self._cooldowns: dict[str, Cooldown] = {}
        self._lockouts: dict[LockoutKey, Cooldown] = {}
        self._permanent: dict[str, PermanentBlock] = {}
        self._breakers: dict[str, BreakerRecord] = {}
        self._probes: dict[str, int] = {}

    def _forget_before(self) -> int:
        """Records whose deadline is at or before this instant are forgotten."""
        return self._clock.now_ms() - self._memory

    def _live(self, table: MutableMapping[K, Cooldown], key: K) -> Cooldown | None:
        cd = table.get(key)
        if cd is not None and cd.until_ms <= self._forget_before():
            del table[key]
            return None
        return cd

    def _set(
        self, table: MutableMapping[K, Cooldown], key: K, until_ms: int, level: int, reason: str
    ) -> Cooldown:
        merged = merge(self._live(table, key), Cooldown(int(until_ms), int(level), reason))
        _bounded_put(table, key, merged, self._max, self._forget_before())
        return merged

    def _clear(
        self, table: MutableMapping[K, Cooldown], key: K, unless_active_at: int | None
    ) -> bool:
        cd = self._live(table, key)
        if cd is None or (unless_active_at is not None and cd.active(unless_active_at)):
            return False
        del table[key]
        return True

    async def get_cooldown(self, conn_id: str) -> Cooldown | None:
        return self._live(self._cooldowns, conn_id)

    async def set_cooldown(self, conn_id: str, until_ms: int, level: int, reason: str) -> Cooldown:
        return self._set(self._cooldowns, conn_id, until_ms, level, reason)

    async def clear_cooldown(self, conn_id: str, *, unless_active_at: int | None = None) -> bool:
        return self._clear(self._cooldowns, conn_id, unless_active_at)

    async def get_lockout(self, provider: str, conn_id: str, model: str) -> Cooldown | None:
        return self._live(self._lockouts, LockoutKey(provider, conn_id, model))

    async def set_lockout(
        self, provider: str, conn_id: str, model: str, until_ms: int, level: int, reason: str
    ) -> Cooldown:
        return self._set(
            self._lockouts, LockoutKey(provider, conn_id, model), until_ms, level, reason
        )

    async def clear_lockout(
        self, provider: str, conn_id: str, model: str, *, unless_active_at: int | None = None
    ) -> bool:
        return self._clear(self._lockouts, LockoutKey(provider, conn_id, model), unless_active_at)

    async def set_permanent(
        self,
        scope: str,
        reason: str,
        *,
        since_ms: int | None = None,
        key_id: str | None = None,
        request_id: str | None = None,
    ) -> PermanentBlock:
        block = self._permanent.get(scope)
        if block is None:
            since = self._clock.now_ms() if since_ms is None else since_ms
            block = PermanentBlock(scope, reason, since, key_id, request_id)
            self._permanent[scope] = block
        return block

    async def clear_permanent(self, scope: str) -> bool:
        return self._permanent.pop(scope, None) is not None

    async def list_permanent(self) -> list[PermanentBlock]:
        return sorted(self._permanent.values(), key=lambda b: (b.since_ms, b.scope))

    async def get_breaker(self, provider: str) -> BreakerRecord | None:
        return self._live_breaker(provider)

    def _live_breaker(self, provider: str) -> BreakerRecord | None:
        rec = self._breakers.get(provider)
        if rec is not None and max(rec.until_ms, rec.updated_ms) <= self._forget_before():
            del self._breakers[provider]
            return None
        return rec

    async def put_breaker(self, provider: str, record: BreakerRecord) -> bool:
        current = await self.get_breaker(provider)
        if current is not None and current.updated_ms >= record.updated_ms:
            return False
        if max(record.until_ms, record.updated_ms) <= self._forget_before():
            return False  # already forgotten: nothing to share
        self._breakers[provider] = record
        return True

    async def try_probe(self, provider: str, lease_ms: int) -> bool:
        now = self._clock.now_ms()
        if self._probes.get(provider, 0) > now:
            return False
        self._probes[provider] = now + lease_ms
        return True

    async def release_probe(self, provider: str) -> None:
        self._probes.pop(provider, None)

    async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState:
        return self.read_target_now(provider, conn_id, model)

    def read_target_now(self, provider: str, conn_id: str, model: str) -> TargetState:
        """:meth:`read_target` without a coroutine (nothing here waits): what the manager's
        check calls on every request. While nothing at all is remembered (the usual state of a
        healthy gateway) it is :data:`NO_STATE` itself, found without a lookup."""
        if not (self._cooldowns or self._lockouts or self._permanent or self._breakers):
            return NO_STATE
        permanent = self._permanent.get(connection_scope(conn_id)) or self._permanent.get(
            model_scope(provider, conn_id, model)
        )
        return TargetState(
            cooldown=self._live(self._cooldowns, conn_id),
            lockout=self._live(self._lockouts, LockoutKey(provider, conn_id, model)),
            permanent=permanent,
            breaker=self._live_breaker(provider),
        )

    async def snapshot(self) -> StoreSnapshot:
        forget = self._forget_before()
        _prune(self._cooldowns, forget)
        _prune(self._lockouts, forget)
        breakers: dict[str, BreakerRecord] = {}
        for provider in list(self._breakers):
            rec = await self.get_breaker(provider)
            if rec is not None:
                breakers[provider] = rec
        return StoreSnapshot(
            cooldowns=dict(self._cooldowns),
            lockouts=dict(self._lockouts),
            permanent=await self.list_permanent(),
            breakers=breakers,
        )

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


#: The classes a permanent block's stored reason starts with (``"<class>: <upstream text>"``,
#: :meth:`fairgate.resilience.manager.RateLimitManager._set_permanent`).
_CLASSES = frozenset(c.value for c in FailureClass)


def _permanent_reason(stored: str) -> dict[str, str]:
    """A permanent block's stored reason as the admin view shows it: ``reason``, the classified
    cause (as a cooldown's and a lockout's ``reason`` is), and ``detail``, the upstream's text.
    The text can be a tenant's (an upstream that echoes a request writes the client's words
    into its error), so the dashboard shows the cause and keeps the text behind a click
    (issue 43, N16). A reason stored in another form is all detail."""
    cause, sep, text = stored.partition(": ")
    if sep and cause in _CLASSES:
        return {"reason": cause, "detail": text}
    return {"reason": "unclassified", "detail": stored}


def _cooldown_view(cd: Cooldown, now_ms: int) -> dict[str, Any]:
    """The fields a cooldown and a lockout show alike (a lockout is a cooldown of one model)."""
    return {
        "until_ms": cd.until_ms,
        "remaining_ms": cd.remaining_ms(now_ms),
        "level": cd.level,
        "reason": cd.reason,
    }


def describe(snapshot: StoreSnapshot, now_ms: int) -> dict[str, Any]:
    """The JSON-ready view of a snapshot: active cooldowns and lockouts with remaining time."""
    return {
        "cooldowns": [
            {
                "connection_id": conn_id,
                **_cooldown_view(cd, now_ms),
            }
            for conn_id, cd in sorted(snapshot.cooldowns.items())
            if cd.active(now_ms)
        ],
        "lockouts": [
            {
                "provider": key.provider,
                "connection_id": key.connection_id,
                "model": key.model,
                **_cooldown_view(cd, now_ms),
            }
            for key, cd in sorted(snapshot.lockouts.items())
            if cd.active(now_ms)
        ],
        "permanent": [
            {
                "scope": b.scope,
                **_permanent_reason(b.reason),
                "since_ms": b.since_ms,
                "caused_by": {"key_id": b.key_id, "request_id": b.request_id},
            }
            for b in snapshot.permanent
        ],
    }
