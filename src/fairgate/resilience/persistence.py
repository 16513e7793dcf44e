"""Resilience state that survives a restart, in the metadata DB's ``resilience_state`` table.

Why: a gateway restarted in the middle of a provider's hour-long rate limit, or with a
connection blocked for billing, must not forget it and hammer the upstream again (and a
permanent block must stay until an admin clears it, whatever happens to the process). Redis
keeps state across replicas but may itself be ephemeral; the memory store keeps nothing.

The :class:`~fairgate.resilience.manager.RateLimitManager` writes through: each cooldown,
lockout, permanent block or breaker opening it stores is also saved here, each clear deletes
the row, and at start :func:`push_into` pushes the still-active rows back into
the store (monotonic merges, so restoring into a Redis that other replicas kept is harmless).

Rows keep absolute epoch-ms deadlines; updates are monotonic in SQL too (``MAX(until_ms)``).
Expired rows are ignored on load and pruned lazily (on load, and at most once a minute on save):
no sweeper. The methods here are synchronous, on the connection they are given; the manager
calls them through :class:`~fairgate.resilience.writer.PersistenceWriter`, on a thread and a
connection of their own, so a database that is slow or hangs never holds the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import orjson

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.domain.breaker import BreakerState
from fairgate.resilience.backoff import Cooldown
from fairgate.resilience.breaker import BreakerRecord
from fairgate.resilience.state import LockoutKey, PermanentBlock, ResilienceStore

__all__ = ["PersistedState", "SqlitePersistence", "push_into"]

#: Expired rows are deleted at most this often by the save path.
PRUNE_EVERY_MS: Final = 60_000

_UPSERT_BLOCK = """
INSERT INTO resilience_state
    (scope, kind, provider, connection_id, model, until_ms, level, reason, permanent, updated_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?)
ON CONFLICT(scope) DO UPDATE SET
    reason = CASE WHEN excluded.until_ms > resilience_state.until_ms
                  THEN excluded.reason ELSE resilience_state.reason END,
    until_ms = MAX(resilience_state.until_ms, excluded.until_ms),
    level = MAX(resilience_state.level, excluded.level),
    updated_ms = excluded.updated_ms
"""
_UPSERT_PERMANENT = """
INSERT INTO resilience_state (scope, kind, until_ms, reason, data, permanent, updated_ms)
VALUES (?, 'permanent', NULL, ?, ?, 1, ?)
ON CONFLICT(scope) DO NOTHING
"""
_UPSERT_BREAKER = """
INSERT INTO resilience_state (scope, kind, provider, until_ms, reason, data, updated_ms)
VALUES (?, 'breaker', ?, ?, ?, ?, ?)
ON CONFLICT(scope) DO UPDATE SET
    until_ms = excluded.until_ms, reason = excluded.reason, data = excluded.data,
    updated_ms = excluded.updated_ms
WHERE excluded.updated_ms > resilience_state.updated_ms
"""


def _cd_scope(conn_id: str) -> str:
    return f"cd:{conn_id}"


def _lk_scope(provider: str, conn_id: str, model: str) -> str:
    return f"lk:{provider}:{conn_id}:{model}"


def _perm_scope(scope: str) -> str:
    return f"perm:{scope}"


def _br_scope(provider: str) -> str:
    return f"br:{provider}"


@dataclass(slots=True)
class PersistedState:
    """What :meth:`SqlitePersistence.load` found still active."""

    cooldowns: dict[str, Cooldown] = field(default_factory=dict)
    lockouts: dict[LockoutKey, Cooldown] = field(default_factory=dict)
    permanent: list[PermanentBlock] = field(default_factory=list)
    breakers: dict[str, BreakerRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.cooldowns) + len(self.lockouts) + len(self.permanent) + len(self.breakers)


class SqlitePersistence:
    """Saves and restores resilience state in ``resilience_state`` (migration 3).

    ``conn`` is a connection from :func:`fairgate.db.connection.open_db` (autocommit, migrated).
    """

    def __init__(self, conn: Database, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._conn = conn
        self._clock = clock
        self._last_prune = 0

    @property
    def connection(self) -> Database:
        return self._conn

    def _maybe_prune(self, now_ms: int) -> None:
        if now_ms - self._last_prune >= PRUNE_EVERY_MS:
            self.prune(now_ms)

    def prune(self, now_ms: int | None = None) -> int:
        """Delete every expired (non-permanent) row; returns how many."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        self._last_prune = now
        cur = self._conn.execute(
            "DELETE FROM resilience_state WHERE permanent = 0 AND until_ms <= ?", (now,)
        )
        return cur.rowcount

    # -- saves ----------------------------------------------------------------------------------

    def save_cooldown(self, conn_id: str, cd: Cooldown) -> None:
        now = self._clock.now_ms()
        self._conn.execute(
            _UPSERT_BLOCK,
            (
                _cd_scope(conn_id),
                "cooldown",
                "",
                conn_id,
                "",
                cd.until_ms,
                cd.level,
                cd.reason,
                now,
            ),
        )
        self._maybe_prune(now)

    def save_lockout(self, provider: str, conn_id: str, model: str, cd: Cooldown) -> None:
        now = self._clock.now_ms()
        self._conn.execute(
            _UPSERT_BLOCK,
            (
                _lk_scope(provider, conn_id, model),
                "lockout",
                provider,
                conn_id,
                model,
                cd.until_ms,
                cd.level,
                cd.reason,
                now,
            ),
        )
        self._maybe_prune(now)

    def save_permanent(self, block: PermanentBlock) -> None:
        cause = orjson.dumps({"key_id": block.key_id, "request_id": block.request_id}).decode()
        self._conn.execute(
            _UPSERT_PERMANENT, (_perm_scope(block.scope), block.reason, cause, block.since_ms)
        )

    def save_breaker(self, provider: str, record: BreakerRecord) -> None:
        """An open breaker is saved with its deadline; a closed one deletes the row."""
        if record.state != BreakerState.OPEN.value:
            self.delete_breaker(provider)
            return
        data = orjson.dumps({"cooldown_ms": record.cooldown_ms}).decode()
        self._conn.execute(
            _UPSERT_BREAKER,
            (_br_scope(provider), provider, record.until_ms, record.state, data, record.updated_ms),
        )

    # -- deletes --------------------------------------------------------------------------------

    def _delete(self, scope: str) -> bool:
        cur = self._conn.execute("DELETE FROM resilience_state WHERE scope = ?", (scope,))
        return cur.rowcount > 0

    def delete_cooldown(self, conn_id: str) -> bool:
        return self._delete(_cd_scope(conn_id))

    def delete_lockout(self, provider: str, conn_id: str, model: str) -> bool:
        return self._delete(_lk_scope(provider, conn_id, model))

    def delete_permanent(self, scope: str) -> bool:
        return self._delete(_perm_scope(scope))

    def delete_breaker(self, provider: str) -> bool:
        return self._delete(_br_scope(provider))

    # -- load -----------------------------------------------------------------------------------

    def load(self) -> PersistedState:
        """Everything still active now; expired rows are pruned first."""
        now = self._clock.now_ms()
        self.prune(now)
        out = PersistedState()
        rows = self._conn.execute(
            "SELECT scope, kind, provider, connection_id, model, until_ms, level, reason, data, "
            "updated_ms FROM resilience_state ORDER BY updated_ms, scope"
        ).fetchall()
        for row in rows:
            scope, kind, provider, conn_id, model, until, level, reason, data, updated = tuple(row)
            if kind == "permanent":
                cause = orjson.loads(str(data)) if data else {}
                key_id, request_id = cause.get("key_id"), cause.get("request_id")
                out.permanent.append(
                    PermanentBlock(
                        str(scope)[len("perm:") :],
                        str(reason),
                        int(updated),
                        key_id if isinstance(key_id, str) else None,
                        request_id if isinstance(request_id, str) else None,
                    )
                )
            elif kind == "cooldown":
                out.cooldowns[str(conn_id)] = Cooldown(int(until), int(level), str(reason))
            elif kind == "lockout":
                key = LockoutKey(str(provider), str(conn_id), str(model))
                out.lockouts[key] = Cooldown(int(until), int(level), str(reason))
            elif kind == "breaker":
                extra = orjson.loads(str(data) or "{}")
                out.breakers[str(provider)] = BreakerRecord(
                    state=BreakerState.OPEN.value,
                    until_ms=int(until),
                    cooldown_ms=int(extra.get("cooldown_ms", 0)),
                    updated_ms=int(updated),
                )
        return out


async def push_into(store: ResilienceStore, state: PersistedState) -> None:
    """Push every loaded row into ``store`` (monotonic merges: restoring into a Redis that
    other replicas kept is harmless)."""
    for conn_id, cd in state.cooldowns.items():
        await store.set_cooldown(conn_id, cd.until_ms, cd.level, cd.reason)
    for key, cd in state.lockouts.items():
        await store.set_lockout(
            key.provider, key.connection_id, key.model, cd.until_ms, cd.level, cd.reason
        )
    for block in state.permanent:
        await store.set_permanent(
            block.scope,
            block.reason,
            since_ms=block.since_ms,
            key_id=block.key_id,
            request_id=block.request_id,
        )
    for provider, record in state.breakers.items():
        await store.put_breaker(provider, record)
