"""The pool admission log (``GET /api/quota/pools/{id}/log``), shared by every process.

Why shared: behind a load balancer each request lands on some replica or worker; a log kept in
each process's memory shows a different slice on every call and is lost on restart. The log
therefore lives where the quota counters live, so it is shared exactly as widely:

- the SQLite quota store (one machine, ``serve --workers N``): a table in
  ``admission_log.sqlite`` beside ``quota.sqlite`` (its own file: the log's writes never take
  the quota file's write lock);
- Redis (replicas): one stream per pool, trimmed to about the newest ``per_pool`` entries and
  to those younger than ``max_age_ms``, with a TTL of ``max_age_ms``; a flush writes each
  pool's events in one script call (``RedisLogBackend``), and the retention GC trims the age
  of streams no flush touches (``gc``).

Bounded both ways: ``per_pool`` events per pool (oldest trimmed) and, for SQLite, events of a
pool deleted are dropped with it; on Redis also by age, so a stream never outlives its pool
by more than ``max_age_ms`` (a pool deleted while Redis was down keeps its stream until the
TTL ends it). The hot path only appends to an in-process buffer (O(1), no
I/O); a background task writes the buffer every ``flush_s`` (one batch per flush, one row or
script call per pool), and a read flushes first, so a process always sees its own admissions. An
unreachable backend drops the batch with a warning: the log is an operator's view, never a
reason to fail a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from fairgate.files import private_sqlite
from fairgate.sqlite_journal import use_wal

log = logging.getLogger("fairgate.store.admission_log")

PER_POOL: Final = 500
#: Events older than this are trimmed from a Redis stream, and a stream no flush touched for
#: this long expires (``FAIRGATE_ADMISSION_LOG_MAX_AGE_S``, default 7 days): the log is a
#: recent view, and without it the stream of a pool deleted while Redis was down stayed forever.
MAX_AGE_MS: Final = 7 * 86_400_000
FLUSH_S: Final = 0.1
#: Buffered events beyond this are dropped (and counted) until the next flush: bounded memory
#: even when the backend is slow or down.
MAX_PENDING: Final = 10_000
#: Connections of the Redis backend (one flush task and the admin API's reads).
LOG_CONNECTIONS: Final = 8

Event = dict[str, Any]


class LogBackend(Protocol):
    async def append(self, batch: list[tuple[str, Event]]) -> None: ...

    async def recent(self, pool_id: str, limit: int) -> list[Event]: ...

    async def forget(self, pool_id: str) -> None: ...

    async def gc(self) -> int: ...

    async def close(self) -> None: ...


def _by_pool(batch: list[tuple[str, Event]]) -> dict[str, list[Event]]:
    """A flush's events grouped by pool, each pool's in the order they were logged: both
    backends write a pool's events with one call."""
    out: dict[str, list[Event]] = {}
    for pool_id, event in batch:
        out.setdefault(pool_id, []).append(event)
    return out


#: A flush's events of one pool as one row: the ``n`` events of a JSON array, oldest first.
_INSERT: Final = "INSERT INTO admission_chunks (pool_id, n, events) VALUES (?, ?, ?)"
#: Every chunk older than the newest ones that hold ``per_pool`` events together. A pool has
#: at most ``per_pool`` chunks after a trim (each holds one event or more), so the running sum
#: reads a bounded number of index entries.
_TRIM: Final = (
    "DELETE FROM admission_chunks WHERE pool_id = ?1 AND id < ("
    "SELECT id FROM (SELECT id, SUM(n) OVER (ORDER BY id DESC) AS seen"
    " FROM admission_chunks WHERE pool_id = ?1) WHERE seen >= ?2 ORDER BY id DESC LIMIT 1)"
)


class SqliteLogBackend:
    """The log in a SQLite file shared by the workers of one machine (see module doc).

    A flush writes each pool's events as ONE row, a JSON array of them (a chunk), and one
    trimming delete: at c16 a flush holds hundreds of events. A row per event cost an insert
    and a delete in the table and in its index each, on the event loop, for every governed
    request (docs/performance.md, "Figures behind the code"); a chunk
    costs that once per pool and flush. Only the newest ``per_pool`` events of a flush are
    written (older ones would be trimmed at once). A read takes chunks newest first until it
    has ``limit`` events. Written on a worker thread instead, the flush was no faster end to
    end (paired runs, same page), so it stays on the event loop with no lock or thread to
    manage."""

    def __init__(self, path: Path, per_pool: int = PER_POOL) -> None:
        self.per_pool = per_pool
        # 0600 like the other data files: the log tells which key used which model when
        self._conn = sqlite3.connect(
            private_sqlite(path), isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA busy_timeout=5000")
        use_wal(self._conn, 5.0, name=str(path))  # workers opening a fresh file together
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS admission_chunks (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " pool_id TEXT NOT NULL, n INTEGER NOT NULL, events TEXT NOT NULL)"
        )
        self._conn.execute(
            "CREATE INDEX IF NOT EXISTS admission_chunks_by_pool ON admission_chunks (pool_id, id)"
        )
        # a row per event, before 2026-12-05: the last few hundred events of each pool, an
        # operator's view that the next minutes of traffic fill again
        self._conn.execute("DROP TABLE IF EXISTS admission_log")

    async def append(self, batch: list[tuple[str, Event]]) -> None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for pool_id, events in _by_pool(batch).items():
                newest = events[-self.per_pool :]
                conn.execute(_INSERT, (pool_id, len(newest), orjson.dumps(newest).decode()))
                conn.execute(_TRIM, (pool_id, self.per_pool))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def recent(self, pool_id: str, limit: int) -> list[Event]:
        rows = self._conn.execute(
            "SELECT events FROM admission_chunks WHERE pool_id = ? ORDER BY id DESC", (pool_id,)
        )
        # the chunks kept may hold a few more than per_pool: the log shows per_pool at most
        limit = min(limit, self.per_pool)
        out: list[Event] = []
        for (raw,) in rows:  # stepped one chunk at a time: stops once it has enough
            out.extend(reversed(orjson.loads(raw)))
            if len(out) >= limit:
                break
        rows.close()
        return out[:limit]

    async def forget(self, pool_id: str) -> None:
        self._conn.execute("DELETE FROM admission_chunks WHERE pool_id = ?", (pool_id,))

    async def gc(self) -> int:
        """Nothing to collect: a pool's chunks are trimmed by count on every flush and dropped
        with the pool (one machine, one file: ``forget`` never misses a deleted pool)."""
        return 0

    async def close(self) -> None:
        self._conn.close()


class RedisLogBackend:
    """The log as one Redis stream per pool, ``{prefix}:{<pool>}:log`` (the pool's hash tag, so
    a cluster keeps it in the pool's slot).

    A flush writes each pool's events with one script call (``lua/log_append.lua``), not one
    ``XADD`` per event: redis-py builds, packs and parses each command of a pipeline in Python,
    a cost per event, i.e. per governed request (docs/performance.md, "Figures behind the
    code"); the script's one call costs that once per pool and flush (every 100 ms).

    Each stream is bounded by length (``per_pool``, approximate trimming) and by age
    (``max_age_ms``: entries older are trimmed at each append and by :meth:`gc`, and the
    stream's TTL is ``max_age_ms``, refreshed at each append). The age is measured on Redis's
    clock, not on an injected one: the entry ids are Redis's milliseconds, and a gateway on a
    shifted test clock (or a skewed host) must not trim what it just wrote."""

    def __init__(
        self,
        url: str,
        prefix: str,
        per_pool: int = PER_POOL,
        *,
        max_age_ms: int = MAX_AGE_MS,
    ) -> None:
        from fairgate.backends.redis_client import async_client
        from fairgate.store.redis.store import script_source

        if per_pool < 1 or max_age_ms < 1:
            raise ValueError("per_pool and max_age_ms must be positive")
        self.per_pool = per_pool
        self.max_age_ms = max_age_ms
        self._prefix = prefix
        self._client = async_client(
            url,
            max_connections=LOG_CONNECTIONS,
            pool_timeout_s=2.0,
            connect_timeout_s=2.0,
            socket_timeout_s=2.0,
        )
        self._append = self._client.register_script(script_source("log_append.lua"))

    def _key(self, pool_id: str) -> str:
        return f"{self._prefix}:{{{pool_id}}}:log"

    async def append(self, batch: list[tuple[str, Event]]) -> None:
        limit = str(self.per_pool).encode()
        age = str(self.max_age_ms).encode()
        for pool_id, events in _by_pool(batch).items():
            encoded = [orjson.dumps(event) for event in events]
            await self._append(keys=[self._key(pool_id)], args=[limit, age, *encoded])

    async def recent(self, pool_id: str, limit: int) -> list[Event]:
        # approximate trimming keeps a few more than per_pool: the log shows per_pool at most
        count = min(limit, self.per_pool)
        entries = await self._client.xrevrange(self._key(pool_id), count=count)
        return [orjson.loads(fields[b"e"]) for _, fields in entries or () if fields]

    async def forget(self, pool_id: str) -> None:
        await self._client.delete(self._key(pool_id))

    async def gc(self) -> int:
        """Trim every pool's stream to the entries younger than ``max_age_ms`` on Redis's
        clock (exact, off the hot path): an append trims only the stream it writes to, and only
        whole nodes, so a pool that went quiet keeps week-old events until its TTL; this bounds
        them by age on the retention GC's schedule. Found by a SCAN of stream keys under the
        prefix. Returns the entries removed."""
        from fairgate.store.redis.store import _glob_escape

        head = f"{self._prefix}:{{"
        pattern = _glob_escape(head) + "*}:log"
        secs, micros = await self._client.time()
        min_id = str(max(0, int(secs) * 1000 + int(micros) // 1000 - self.max_age_ms))
        removed = 0
        async for raw in self._client.scan_iter(match=pattern, count=1000, _type="stream"):
            removed += int(await self._client.xtrim(raw, minid=min_id))
        return removed

    async def close(self) -> None:
        await self._client.aclose()


class SharedPoolLog:
    """The admission log of every pool: ``log`` on the hot path, ``recent`` for the admin API.

    ``run()`` is the flush loop (a task for the gateway's lifetime); ``close()`` flushes what is
    left and closes the backend."""

    def __init__(self, backend: LogBackend, *, flush_s: float = FLUSH_S) -> None:
        self.backend = backend
        self.flush_s = flush_s
        self._pending: list[tuple[str, Event]] = []
        self.dropped = 0
        self._lock = asyncio.Lock()

    def log(self, pool_id: str, event: Event) -> None:
        """Buffer one event (O(1), no I/O). The log keeps ``event`` itself, not a copy: the
        request path builds a new dict per admission and never touches it again."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append((pool_id, event))

    async def flush(self) -> None:
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                await self.backend.append(batch)
            except Exception as exc:  # the log never fails a request or the gateway
                self.dropped += len(batch)
                log.warning(
                    "admission log write failed, %d events dropped (%s)",
                    len(batch),
                    type(exc).__name__,
                )

    async def recent(self, pool_id: str, limit: int = 100) -> list[Event]:
        """The newest ``limit`` events of the pool from every process, newest first."""
        if limit <= 0:
            return []
        await self.flush()
        return await self.backend.recent(pool_id, limit)

    async def gc(self) -> int:
        """Events removed by age from the shared backend (the retention GC's pass,
        :mod:`fairgate.quota.retention`)."""
        return await self.backend.gc()

    async def forget(self, pool_id: str) -> None:
        """Drop a deleted pool's events (best effort: a backend that is down keeps them until
        they are trimmed)."""
        await self.flush()
        try:
            await self.backend.forget(pool_id)
        except Exception as exc:
            log.warning("admission log of pool %s not dropped (%s)", pool_id, type(exc).__name__)

    def size(self) -> tuple[int, int]:
        """(pools, events) buffered in this process (the rest is in the shared backend)."""
        return len({p for p, _ in self._pending}), len(self._pending)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()
        await self.backend.close()
