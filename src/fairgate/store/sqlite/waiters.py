"""The SQLite driver's queue of held requests (``admission: hold``, :mod:`fairgate.quota.hold`).

Two places, as for the counters: in memory while this process owns the file (memory mode,
read and written under the counters' lock, inside the admission's atomic step), else the
``quota_waiter`` table, read and written in the admission's transaction, so every process
that shares the file sees every waiter. When a memory-mode owner hands the file over, its
waiters are not copied: each is put back by its next attempt (every attempt carries its
waiter's id, enqueue time and deadline), which comes at the latest one poll interval later.
"""

from __future__ import annotations

import sqlite3
from typing import Protocol

from fairgate.quota.hold import Waiter

__all__ = ["SCHEMA", "MemoryWaiters", "SqlWaiters", "WaiterQueue"]

WAITER_SCHEMA = """CREATE TABLE IF NOT EXISTS quota_waiter (
    id TEXT PRIMARY KEY,
    pool_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL,
    share REAL NOT NULL,
    owed INTEGER NOT NULL
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS quota_waiter_pool ON quota_waiter (pool_id, deadline_ms)"
_PURGE = "DELETE FROM quota_waiter WHERE pool_id = ? AND deadline_ms <= ?"
_LIST = (
    "SELECT id, key_id, enqueued_ms, deadline_ms, share, owed FROM quota_waiter WHERE pool_id = ?"
)
_PUT = (
    "INSERT OR REPLACE INTO quota_waiter (id, pool_id, key_id, enqueued_ms, deadline_ms, "
    "share, owed) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_REMOVE = "DELETE FROM quota_waiter WHERE pool_id = ? AND id = ?"
_CLEAR = "DELETE FROM quota_waiter WHERE pool_id = ?"

#: the statements that create the table (run with the store's schema)
SCHEMA = (WAITER_SCHEMA, _INDEX)


class WaiterQueue(Protocol):
    def purge(self, pool_id: str, now_ms: int) -> None:
        """Forget the waiters whose patience ran out (their deadline is at or before now)."""
        ...

    def list(self, pool_id: str) -> list[Waiter]: ...

    def put(self, pool_id: str, waiter: Waiter) -> None:
        """Add the waiter, or refresh it (its share, whether it is owed)."""
        ...

    def remove(self, pool_id: str, waiter_id: str) -> bool: ...

    def clear(self, pool_id: str) -> None: ...


class MemoryWaiters:
    """The queue of a memory-mode owner (the caller holds the counters' lock)."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, Waiter]] = {}

    def purge(self, pool_id: str, now_ms: int) -> None:
        ws = self._pools.get(pool_id)
        if ws:
            for wid in [w.waiter_id for w in ws.values() if w.deadline_ms <= now_ms]:
                del ws[wid]

    def list(self, pool_id: str) -> list[Waiter]:
        return list(self._pools.get(pool_id, {}).values())

    def put(self, pool_id: str, waiter: Waiter) -> None:
        self._pools.setdefault(pool_id, {})[waiter.waiter_id] = waiter

    def remove(self, pool_id: str, waiter_id: str) -> bool:
        ws = self._pools.get(pool_id)
        if ws is None or ws.pop(waiter_id, None) is None:
            return False
        if not ws:
            del self._pools[pool_id]
        return True

    def clear(self, pool_id: str) -> None:
        self._pools.pop(pool_id, None)


class SqlWaiters:
    """The queue in the file, on a connection inside an open transaction."""

    __slots__ = ("c",)

    def __init__(self, c: sqlite3.Connection) -> None:
        self.c = c

    def purge(self, pool_id: str, now_ms: int) -> None:
        self.c.execute(_PURGE, (pool_id, now_ms))

    def list(self, pool_id: str) -> list[Waiter]:
        return [
            Waiter(str(i), str(k), int(e), int(d), float(s), bool(o))
            for i, k, e, d, s, o in self.c.execute(_LIST, (pool_id,))
        ]

    def put(self, pool_id: str, waiter: Waiter) -> None:
        w = waiter
        self.c.execute(
            _PUT,
            (w.waiter_id, pool_id, w.key_id, w.enqueued_ms, w.deadline_ms, w.share, int(w.owed)),
        )

    def remove(self, pool_id: str, waiter_id: str) -> bool:
        return self.c.execute(_REMOVE, (pool_id, waiter_id)).rowcount > 0

    def clear(self, pool_id: str) -> None:
        self.c.execute(_CLEAR, (pool_id,))
