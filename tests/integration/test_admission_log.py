"""The shared admission log on both backends (a SQLite file of the workers, a Redis stream of
the replicas): two processes' logs read the same, newest first, bounded, across a restart."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from resp_wire import Wire

from fairgate.store.admission_log import (
    LogBackend,
    RedisLogBackend,
    SharedPoolLog,
    SqliteLogBackend,
)

Opener = Callable[[int], LogBackend]


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
    ]
)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens another handle on the same log, as another process would."""
    if request.param == "sqlite":
        return lambda per_pool: SqliteLogBackend(tmp_path / "admission_log.sqlite", per_pool)
    cluster = request.param == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
    return lambda per_pool: RedisLogBackend(url, prefix, per_pool)


async def test_every_process_reads_the_same_log(open_backend: Opener) -> None:
    a, b = SharedPoolLog(open_backend(500)), SharedPoolLog(open_backend(500))
    try:
        a.log("p", {"ts": 1, "keyId": "alice"})
        b.log("p", {"ts": 2, "keyId": "bob"})
        a.log("q", {"ts": 3, "keyId": "alice"})
        await b.flush()  # b's own events are flushed by its read too; a's by its flush task
        await a.flush()
        expected = [{"ts": 1, "keyId": "alice"}, {"ts": 2, "keyId": "bob"}]
        # both orders of flush land in the log; the newest written is first
        for log in (a, b):
            got = await log.recent("p", 10)
            assert sorted(got, key=lambda e: e["ts"]) == expected
            assert await log.recent("q", 10) == [{"ts": 3, "keyId": "alice"}]
            assert await log.recent("p", 1) == got[:1]
    finally:
        await a.close()
        await b.close()


async def test_bounded_per_pool_and_kept_across_a_restart(open_backend: Opener) -> None:
    log = SharedPoolLog(open_backend(5))
    for i in range(12):
        log.log("p", {"ts": i})
    await log.close()  # close flushes
    again = SharedPoolLog(open_backend(5))
    try:
        assert [e["ts"] for e in await again.recent("p", 100)] == [11, 10, 9, 8, 7]
        await again.forget("p")
        assert await again.recent("p", 100) == []
    finally:
        await again.close()


async def test_the_sqlite_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "admission_log.sqlite"
    await SqliteLogBackend(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


async def test_a_backend_that_fails_never_fails_the_caller(tmp_path: Path) -> None:
    backend = SqliteLogBackend(tmp_path / "admission_log.sqlite")
    log = SharedPoolLog(backend)
    await backend.close()  # every write now fails
    log.log("p", {"ts": 1})
    await log.flush()
    assert log.dropped == 1
    assert log.size() == (0, 0)


async def test_a_sqlite_flush_writes_one_statement_per_pool_however_many_events(
    tmp_path: Path,
) -> None:
    """One event per governed request: a row per event cost 1.9-3.5 µs of CPU per event on the
    event loop; a flush writes one row (a chunk of events) and one trim per pool. Every event
    still lands, in order, bounded, its text intact."""
    backend = SqliteLogBackend(tmp_path / "admission_log.sqlite", per_pool=500)
    log = SharedPoolLog(backend)
    statements: list[str] = []
    backend._conn.set_trace_callback(statements.append)
    try:
        for i in range(2_000):
            log.log("p" if i % 4 else "q", {"ts": i, "keyId": 'k\u00e9"', "share": 0.1 * i})
        await log.flush()
        inserts = [s for s in statements if s.startswith("INSERT")]
        assert len(statements) == 6  # BEGIN, an insert and a trim per pool, COMMIT
        assert len(inserts) == 2
        backend._conn.set_trace_callback(None)
        p = await log.recent("p", 1_000)
        assert [e["ts"] for e in p] == [i for i in reversed(range(2_000)) if i % 4][:500]
        assert p[0] == {"ts": 1_999, "keyId": 'k\u00e9"', "share": 0.1 * 1_999}
        assert [e["ts"] for e in await log.recent("q", 1_000)] == list(range(1_996, -1, -4))
    finally:
        await log.close()


async def test_a_sqlite_log_reads_and_trims_across_chunks(tmp_path: Path) -> None:
    """Flushes of a few events each: a read takes the newest events across chunk boundaries,
    and a trim keeps only the chunks that hold the newest ``per_pool`` events (a pool's file
    does not grow with its traffic); a flush of more than ``per_pool`` events writes only the
    newest of them."""
    backend = SqliteLogBackend(tmp_path / "admission_log.sqlite", per_pool=5)
    log = SharedPoolLog(backend)
    try:
        ts = 0
        for size in (3, 3, 3, 1, 2, 3):
            for _ in range(size):
                log.log("p", {"ts": ts})
                ts += 1
            log.log("q", {"ts": -ts})
            await log.flush()
            newest = list(range(ts - 1, max(-1, ts - 6), -1))
            assert [e["ts"] for e in await log.recent("p", 100)] == newest
            assert [e["ts"] for e in await log.recent("p", 2)] == newest[:2]
            chunks = backend._conn.execute(
                "SELECT n FROM admission_chunks WHERE pool_id = 'p' ORDER BY id DESC"
            ).fetchall()
            held = [n for (n,) in chunks]
            # the newest chunks reach 5 events, and without the oldest one they would not
            assert sum(held) >= min(5, ts)
            assert sum(held[:-1]) < 5
        assert [e["ts"] for e in await log.recent("q", 100)] == [-15, -12, -10, -9, -6]
        for i in range(12):
            log.log("p", {"ts": 100 + i})
        await log.flush()
        (n,) = backend._conn.execute(
            "SELECT n FROM admission_chunks WHERE pool_id = 'p' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        assert n == 5
        assert [e["ts"] for e in await log.recent("p", 100)] == [111, 110, 109, 108, 107]
    finally:
        await log.close()


async def test_a_sqlite_log_of_an_earlier_version_is_dropped_on_open(tmp_path: Path) -> None:
    """The row-per-event table of earlier versions holds an operator's view that the next
    minutes of traffic fill again: it is dropped, never read as chunks."""
    path = tmp_path / "admission_log.sqlite"
    with sqlite3.connect(path) as old:
        old.execute(
            "CREATE TABLE admission_log (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " pool_id TEXT NOT NULL, event TEXT NOT NULL)"
        )
        old.execute("INSERT INTO admission_log (pool_id, event) VALUES ('p', '{\"ts\": 1}')")
    old.close()
    backend = SqliteLogBackend(path)
    try:
        assert await backend.recent("p", 10) == []
        tables = {r[0] for r in backend._conn.execute("SELECT name FROM sqlite_master")}
        assert "admission_log" not in tables
        assert "admission_chunks" in tables
    finally:
        await backend.close()


@pytest.mark.redis
async def test_a_flush_sends_one_command_per_pool_however_many_events(
    redis_url: str, redis_prefix: str
) -> None:
    # One event per governed request: a command per event (redis-py's pipeline builds and
    # parses each in Python) cost more CPU per request than the quota scripts' packing did.
    wire = Wire(redis_url)
    log = SharedPoolLog(RedisLogBackend(wire.url, redis_prefix, per_pool=40))
    try:
        log.log("p", {"ts": -1})
        await log.flush()  # the script is loaded on first use
        wire.reset()
        for i in range(50):
            log.log("p" if i % 5 else "q", {"ts": i})
        await log.flush()
        assert wire.commands == ["EVALSHA", "EVALSHA"]
        # each event its own entry, in order, and the pool's stream trimmed to its newest 40
        assert [e["ts"] for e in await log.recent("p", 100)] == [
            i for i in reversed(range(50)) if i % 5
        ]
        assert [e["ts"] for e in await log.recent("q", 100)] == list(range(45, -1, -5))
    finally:
        await log.close()
        wire.relay.close()
