"""The write-behind's journal on real files: what it keeps, what it refuses, and that folding
it is exact once whoever folds it and wherever a crash falls.

The memory mode's commits append batches to ``<database>.batches`` and fold them into the quota
tables about once a second (:mod:`fairgate.store.sqlite.batches`); every process that opens the
file folds first. These tests drive the pieces directly (no clock: a fold is asked for, or a
fold interval far beyond the test keeps one from happening), and through a store.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import compile_checks
from fairgate.quota.model import Allocation, Dimension, Policy
from fairgate.quota.ports import AdmitRequest, CounterRef, UsageItem
from fairgate.store.sqlite import memory as sqlite_memory
from fairgate.store.sqlite.batches import (
    FOLDED_SCHEMA,
    Batch,
    BatchJournal,
    Unfolded,
    mark_folded,
    replay,
    write_batch,
)
from fairgate.store.sqlite.owner import shared_connection
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

T0 = 1_700_002_800_000
REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 1_000_000)
POOL = make_pool(REQ, allocations=(Allocation("a", 50, policy=Policy.SOFT), Allocation("b", 50)))
REFS = [CounterRef(REQ.key, REQ.window_ms)]


@contextmanager
def _db(path: Path) -> Iterator[sqlite3.Connection]:
    """A file with the quota tables (a store creates them and goes away)."""
    asyncio.run(SqliteQuotaStore(path, mode="transactional").close())
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        yield db


def _tables(db: sqlite3.Connection) -> tuple[list[tuple[object, ...]], ...]:
    """Everything the write-behind writes, sorted: the state to compare."""
    return (
        db.execute("SELECT * FROM quota_counter ORDER BY 1, 2, 3, 4").fetchall(),
        db.execute("SELECT * FROM quota_reservation ORDER BY id").fetchall(),
        db.execute("SELECT * FROM quota_active ORDER BY 1, 2").fetchall(),
        db.execute("SELECT * FROM quota_cumulative ORDER BY 1, 2").fetchall(),
    )


def _batch(i: int, *, cum: float = 1.0) -> Batch:
    return Batch(
        counters=[("p", "a", "requests/hourly", 7, 3_600_000, float(i))],
        res_put=[(f"r{i}", "p", "a", T0 + i, "[]")],
        res_del=[(f"r{i - 1}",)] if i else [],
        touches=[("p", "a", T0 + i)],
        cumulative=[("p", "requests", cum)],
    )


def _fold(db: sqlite3.Connection, journal: BatchJournal, *, clear: bool = True) -> int:
    db.execute("BEGIN IMMEDIATE")
    last = replay(db, journal)
    db.execute("COMMIT")
    if clear:
        journal.clear()
    return last


def test_records_round_trip_and_a_torn_tail_ends_the_journal(tmp_path: Path) -> None:
    with _db(tmp_path / "q.sqlite") as db:
        journal = BatchJournal(str(tmp_path / "q.sqlite"))
        assert _fold(db, journal) == 0  # reads the salt; nothing to fold yet
        for i in range(1, 4):
            journal.append(i, _batch(i))
        assert [(s, b) for s, b in journal.records()] == [(i, _batch(i)) for i in range(1, 4)]
        journal.close()
        # a crash in the middle of the fourth record's write: the first three stay whole
        size = os.path.getsize(journal.path)
        journal.append(4, _batch(4))
        os.truncate(journal.path, size + 10)
        assert [s for s, _ in journal.records()] == [1, 2, 3]
        # a flipped byte inside the second record ends the journal there
        with open(journal.path, "r+b") as f:
            f.seek(size // 3 + 20)
            byte = f.read(1)
            f.seek(size // 3 + 20)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert [s for s, _ in journal.records()] == [1]


def test_a_journal_beside_another_database_is_not_folded_into_it(tmp_path: Path) -> None:
    """The salt seeds every record's checksum: the database deleted and created again (a new
    salt) ignores the journal its predecessor left behind."""
    path = tmp_path / "q.sqlite"
    with _db(path) as db:
        journal = BatchJournal(str(path))
        _fold(db, journal)
        journal.append(1, _batch(1, cum=5.0))
        journal.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with _db(path) as db:
        assert _tables(db)[3] == []
        journal = BatchJournal(str(path))
        assert _fold(db, journal) == 0
        assert _tables(db)[3] == []  # nothing folded from the old journal
        assert os.path.getsize(journal.path) == 0  # and it is gone


def test_a_fold_is_exact_once_wherever_a_crash_falls(tmp_path: Path) -> None:
    """A crash after the fold's commit and before the journal is emptied leaves batches the
    tables already hold: the next fold skips them (the cumulative totals would count twice),
    and folds the ones appended after."""
    with _db(tmp_path / "q.sqlite") as db:
        journal = BatchJournal(str(tmp_path / "q.sqlite"))
        _fold(db, journal)
        for i in range(1, 4):
            journal.append(i, _batch(i))
        assert _fold(db, journal, clear=False) == 3  # the crash: the file still holds 1..3
        assert db.execute("SELECT value FROM quota_cumulative").fetchall() == [(3.0,)]
        journal.append(4, _batch(4))  # (an owner that could not empty it appends after)
        assert _fold(db, journal, clear=False) == 4
        assert _fold(db, journal) == 4  # again: nothing new
        assert db.execute("SELECT value FROM quota_cumulative").fetchall() == [(4.0,)]
        assert db.execute("SELECT id FROM quota_reservation").fetchall() == [("r4",)]
        assert db.execute("SELECT value FROM quota_counter").fetchall() == [(4.0,)]


def test_a_database_of_an_earlier_version_has_no_journal_to_fold(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("CREATE TABLE quota_cumulative (pool_id TEXT, counter TEXT, value REAL)")
        assert _fold(db, BatchJournal(str(path))) == 0
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        assert "quota_folded" not in names  # a reader does not change its schema


def _random_batches(rng: random.Random, n: int) -> list[Batch]:
    """Batches as a memory-mode owner takes them: counters with absolute values,
    reservations put once and later deleted (or not), now and then a resync that rewrites
    every live reservation, active marks and cumulative additions."""
    live: dict[str, tuple[str, str, str, int, str]] = {}
    in_file: set[str] = set()
    out = []
    next_id = 0
    for _ in range(n):
        b = Batch()
        for _ in range(rng.randint(0, 4)):
            key, bucket = rng.choice("abc"), rng.randint(1, 3)
            b.counters.append(("p", key, "tokens/hourly", bucket, 3_600_000, rng.random() * 100))
        changed: dict[str, tuple[str, str, str, int, str] | None] = {}
        for _ in range(rng.randint(0, 3)):
            rid = f"r{next_id}"
            next_id += 1
            live[rid] = changed[rid] = (rid, "p", rng.choice("abc"), T0 + next_id, "[]")
        for rid in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 3))):
            del live[rid]
            if rid in in_file:
                changed[rid] = None
            else:
                changed.pop(rid, None)
        if rng.random() < 0.1:
            b.res_resync = True
            changed = dict(live)
            in_file = set()
        for rid, row in changed.items():
            if row is None:
                b.res_del.append((rid,))
                in_file.discard(rid)
            else:
                b.res_put.append(row)
                in_file.add(rid)
        b.touches = [("p", rng.choice("abc"), T0 + rng.randint(0, 50)) for _ in range(2)]
        b.cumulative = [("p", "tokens", float(rng.randint(1, 9)))]
        out.append(b)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_merged_batches_write_what_the_batches_one_by_one_write(tmp_path: Path, seed: int) -> None:
    """What an owner keeps of the batches since its last fold (:class:`Unfolded`, one row per
    counter, none for a reservation put and deleted since) leaves the tables exactly as
    folding the journal's batches one by one does (what another process does after a
    crash)."""
    rng = random.Random(seed)
    start, since = _random_batches(rng, 5), _random_batches(rng, 40)
    with _db(tmp_path / "one.sqlite") as one, _db(tmp_path / "merged.sqlite") as merged:
        for db in (one, merged):
            db.execute("BEGIN")
            for b in start:  # what the tables held at the last fold
                write_batch(db, b)
            db.execute("COMMIT")
        one.execute("BEGIN")
        for b in since:
            write_batch(one, b)
        one.execute("COMMIT")
        unfolded = Unfolded()
        for b in since:
            unfolded.add(b)
        merged.execute("BEGIN")
        write_batch(merged, unfolded.batch())
        merged.execute("COMMIT")
        assert _tables(merged) == _tables(one)
        assert len(unfolded) <= sum(
            len(b.counters) + len(b.res_put) + len(b.res_del) + len(b.touches) + 1 for b in since
        )


def _request(key: str, rid: str, now_ms: int) -> AdmitRequest:
    alloc = POOL.allocation(key)
    assert alloc is not None
    checks = compile_checks(POOL, alloc, {Unit.REQUESTS: 1.0})
    return AdmitRequest(POOL.id, key, checks, alloc.policy, 0.5, rid, now_ms)


async def _serve(store: SqliteQuotaStore, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        rid = f"r{i}"
        assert (await store.admit(_request("ab"[i % 2], rid, T0 + i))).reserved
        await store.settle(POOL.id, "ab"[i % 2], rid, (UsageItem(REQ.key, REQ.window_ms, 1),), T0)


async def _commit_all(store: SqliteQuotaStore) -> None:
    """Wait until the write-behind has committed every change (appended, or folded)."""
    while (d := store.durability())["committed"] < d["changes"]:  # noqa: ASYNC110 - no event
        await asyncio.sleep(0.001)


def _journal_size(path: Path) -> int:
    """The journal's size in bytes (0: not created yet, before the first append)."""
    try:
        return os.path.getsize(f"{path}.batches")
    except FileNotFoundError:
        return 0


def _folded_after_a_crash(path: Path, into: Path) -> float:
    """The pool's cumulative requests as the next process finds them if this one died now:
    the database and its journal copied as they are (a ``kill -9`` leaves the OS page cache,
    which is what a copy reads; nothing is being written, every change being committed) and
    opened as a sharer, which folds the journal first."""
    into.mkdir()
    for suffix in ("", "-wal", ".batches"):
        if Path(f"{path}{suffix}").exists():
            (into / f"{path.name}{suffix}").write_bytes(Path(f"{path}{suffix}").read_bytes())
    with shared_connection(into / path.name) as db:
        (value,) = db.execute("SELECT value FROM quota_cumulative").fetchone()
        return float(value)


async def test_an_owner_appends_between_folds_and_a_sharer_folds_what_it_left(
    tmp_path: Path,
) -> None:
    """With a fold interval far beyond the test the owner's commits only append; the tables
    catch up when they must be whole: a read of them, the hand-over to a sharer."""
    path = tmp_path / "q.sqlite"
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1, fold_ms=3_600_000)
    try:
        await _serve(store, 5)
        await _commit_all(store)
        assert store.durability()["folds"] == 0
        assert _journal_size(path) > 0
        assert _folded_after_a_crash(path, tmp_path / "crash") == 5.0
        with closing(sqlite3.connect(path)) as db:  # the tables alone: behind
            assert db.execute("SELECT COUNT(*) FROM quota_cumulative").fetchone() == (0,)
        assert await store.cumulative(POOL.id, [REQ.key]) == {REQ.key: 5.0}  # folds first
        assert store.durability()["folds"] == 1
        assert _journal_size(path) == 0
        await _serve(store, 3, first=5)
        await _commit_all(store)

        def read_as_sharer() -> float:
            with shared_connection(path) as db:
                (value,) = db.execute("SELECT value FROM quota_cumulative").fetchone()
                return float(value)

        assert await asyncio.to_thread(read_as_sharer) == 8.0  # the hand-over folded
        assert store.mode == "transactional"
    finally:
        await store.close()


async def test_a_failed_append_is_retried_and_commits_into_the_tables_until_a_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (a full disk) may leave half a record, which would end the journal
    for every record after it: the changes stay pending, and the next commits go into the
    tables until a fold has emptied the journal."""
    path = tmp_path / "q.sqlite"
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1, fold_ms=3_600_000)
    real_append = BatchJournal.append
    failed = []

    def full_disk(self: BatchJournal, seq: int, b: Batch) -> None:
        if not failed:
            failed.append(seq)
            with open(self.path, "ab") as f:
                f.write(b"\x07" * 9)  # half a head
            raise OSError(28, "No space left on device")
        real_append(self, seq, b)

    monkeypatch.setattr(BatchJournal, "append", full_disk)
    try:
        await _serve(store, 4)
        await _commit_all(store)
        d = store.durability()
        assert failed
        assert d["failed_commits"] == 1
        assert d["folds"] >= 1  # the retry went into the tables, and emptied the journal
        await _serve(store, 2, first=4)  # appended again, after the fold emptied it
        await _commit_all(store)
        assert _journal_size(path) > 0
        assert _folded_after_a_crash(path, tmp_path / "crash") == 6.0
    finally:
        monkeypatch.undo()
        await store.close()


async def test_the_watcher_folds_once_traffic_stops(tmp_path: Path) -> None:
    """Under traffic a commit folds when the interval is due; when traffic stops, the
    watcher folds what is left, so the tables do not stay behind while the gateway idles."""
    path = tmp_path / "q.sqlite"
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1, fold_ms=100)
    try:
        served = 0
        while _journal_size(path) == 0:  # until a commit appended (not folded: it was due)
            await _serve(store, 1, first=served)
            served += 1
            await _commit_all(store)
        # no commit from here on: only the watcher can fold
        for _ in range(2_000):  # eventually: it runs on its own thread, at least once a second
            if _journal_size(path) == 0:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the watcher never folded the journal")
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("SELECT value FROM quota_cumulative").fetchone() == (served,)
    finally:
        await store.close()


def test_the_schema_has_one_folded_row(tmp_path: Path) -> None:
    with _db(tmp_path / "q.sqlite") as db:
        db.execute(FOLDED_SCHEMA)  # idempotent
        _fold(db, BatchJournal(str(tmp_path / "q.sqlite")))
        db.execute("BEGIN")
        mark_folded(db, 12)
        db.execute("COMMIT")
        assert db.execute("SELECT one, seq FROM quota_folded").fetchall() == [(1, 12)]
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("INSERT INTO quota_folded (one, seq, salt) VALUES (2, 0, 0)")


@pytest.mark.parametrize(("synchronous", "syncs"), [("OFF", False), ("FULL", True)])
async def test_appends_reach_the_disk_when_every_commit_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, synchronous: str, syncs: bool
) -> None:
    """``synchronous = FULL`` fsyncs every commit of the transactional path: the journal's
    appends are the memory mode's commits, so they are synced too (OFF: the page cache,
    which a crash of the process does not lose)."""
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    path = tmp_path / "q.sqlite"
    store = SqliteQuotaStore(
        path, mode="memory", flush_ms=1, fold_ms=3_600_000, synchronous=synchronous
    )
    try:
        await _serve(store, 3)
        await _commit_all(store)
        assert _journal_size(path) > 0
        assert bool(synced) is syncs
    finally:
        await store.close()


async def test_a_failed_fold_with_nothing_new_keeps_the_journal_and_invents_no_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that needs the tables whole folds; when that fold fails (the file cannot be
    written) the read says so, the journal keeps every batch, and nothing is marked pending
    that was not (no commit of an empty change, no lag counted from the clock's origin)."""
    path = tmp_path / "q.sqlite"
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1, fold_ms=3_600_000)
    real = sqlite_memory.write_batch
    try:
        await _serve(store, 4)
        await _commit_all(store)
        before = store.durability()

        def locked(c: sqlite3.Connection, b: Batch) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(sqlite_memory, "write_batch", locked)
        with pytest.raises(sqlite3.OperationalError):
            await store.cumulative(POOL.id, [REQ.key])
        monkeypatch.setattr(sqlite_memory, "write_batch", real)
        after = store.durability()
        assert after["changes"] == before["changes"]
        assert after["commits"] == before["commits"]
        assert _journal_size(path) > 0
        assert await store.cumulative(POOL.id, [REQ.key]) == {REQ.key: 4.0}
        assert store.durability()["max_lag_ms"] < 60_000
    finally:
        await store.close()
