"""The shared admission log on both backends (a SQLite file of the workers, a Redis stream of
the replicas): two processes' logs read the same, newest first, bounded, across a restart."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from resp_wire import Wire

from fairgate.clock import ManualClock
from fairgate.config import Config
from fairgate.process.state import Gateway
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.retention import RetentionGc
from fairgate.store.admission_log import (
    MAX_AGE_MS,
    LogBackend,
    RedisLogBackend,
    SharedPoolLog,
    SqliteLogBackend,
)
from fairgate.store.sqlite.store import SqliteQuotaStore

Opener = Callable[[int], LogBackend]
RedisLogOpener = Callable[[int], tuple[RedisLogBackend, SharedPoolLog]]


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


# -- bounded by age (issue 48) -----------------------------------------------------------------

DAY_MS = 86_400_000


@pytest_asyncio.fixture(
    params=[
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
    ]
)
async def redis_log(request: pytest.FixtureRequest) -> AsyncIterator[RedisLogOpener]:
    """A log on a Redis backend of the given ``per_pool`` that keeps a day of events, with the
    backend (for what the tests read of Redis itself); the logs are closed after the test."""
    cluster = request.param == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
    logs: list[SharedPoolLog] = []

    def open_log(per_pool: int) -> tuple[RedisLogBackend, SharedPoolLog]:
        backend = RedisLogBackend(url, prefix, per_pool, max_age_ms=DAY_MS)
        logs.append(SharedPoolLog(backend))
        return backend, logs[-1]

    try:
        yield open_log
    finally:
        for log in logs:
            await log.close()


async def _add_old(backend: RedisLogBackend, pool_id: str, n: int, age_ms: int) -> None:
    """``n`` events written ``age_ms`` ago on Redis's clock (the clock of the stream ids and
    of the age bound), by explicit ids: no test waits a day."""
    secs, micros = await backend._client.time()
    then = int(secs) * 1000 + int(micros) // 1000 - age_ms
    for i in range(n):
        await backend._client.xadd(backend._key(pool_id), {"e": b'{"ts": "old"}'}, id=f"{then}-{i}")


async def test_a_redis_stream_has_the_age_as_its_ttl(redis_log: RedisLogOpener) -> None:
    backend, log = redis_log(50)
    log.log("p", {"ts": 1})
    await log.flush()
    # a pool nobody admits to any more (or deleted while Redis was down) loses its stream
    ttl = await backend._client.pttl(backend._key("p"))
    assert 0 < ttl <= DAY_MS


async def test_a_redis_stream_is_bounded_by_length_approximately(redis_log: RedisLogOpener) -> None:
    backend, log = redis_log(50)
    for i in range(1000):
        log.log("p", {"ts": i})
    await log.flush()
    # ~ trims whole nodes (≤ 100 entries each): never more than a node beyond per_pool
    assert 50 <= await backend._client.xlen(backend._key("p")) <= 150
    assert [e["ts"] for e in await log.recent("p", 1000)] == list(range(999, 949, -1))


async def test_a_redis_append_trims_the_events_past_the_age(redis_log: RedisLogOpener) -> None:
    backend, log = redis_log(10_000)
    await _add_old(backend, "p", 300, DAY_MS + 60_000)
    log.log("p", {"ts": "new"})
    await log.flush()
    # approximate: whole nodes of old entries go, the one the new entry shares may stay
    assert await backend._client.xlen(backend._key("p")) <= 101
    assert (await log.recent("p", 1)) == [{"ts": "new"}]


async def test_the_gc_trims_the_streams_no_append_touches(redis_log: RedisLogOpener) -> None:
    backend, log = redis_log(10_000)
    await _add_old(backend, "quiet", 30, DAY_MS + 60_000)
    await _add_old(backend, "recent", 20, DAY_MS - 3_600_000)
    assert await log.gc() == 30
    assert await log.recent("quiet", 100) == []
    assert len(await log.recent("recent", 100)) == 20  # younger than a day: kept
    assert await log.gc() == 0


async def test_the_retention_gc_trims_the_admission_log(tmp_path: Path) -> None:
    # the hourly pass (quota.retention) carries the log's age trim, recorded like the rest
    engine = QuotaEngine(SqliteQuotaStore(tmp_path / "quota.sqlite"), clock=ManualClock())
    calls: list[int] = []

    class Counting(SqliteLogBackend):
        async def gc(self) -> int:
            calls.append(1)
            return 7

    pool_log = SharedPoolLog(Counting(tmp_path / "admission_log.sqlite"))
    gc = RetentionGc(engine, pool_log=pool_log)
    try:
        run = await gc.run_once()
        assert calls == [1]
        assert run.log_events == 7
        assert gc.as_json()["removedTotal"] == {
            "buckets": 0,
            "activeKeys": 0,
            "reservations": 0,
            "logEvents": 7,
        }
    finally:
        await pool_log.close()
        await engine.store.close()


def test_the_age_bound_is_read_from_the_environment(tmp_path: Path) -> None:
    def age(value: str | None) -> int:
        env = {} if value is None else {"FAIRGATE_ADMISSION_LOG_MAX_AGE_S": value}
        return Gateway(data_dir=tmp_path, config=Config(), env=env)._log_max_age_ms()

    assert age(None) == MAX_AGE_MS
    assert age("3600") == 3_600_000
    assert age("1") == 60_000  # at least a minute: a log that empties itself shows nothing
    with pytest.raises(ValueError, match=r"^FAIRGATE_ADMISSION_LOG_MAX_AGE_S: Input should be"):
        age("1h")
