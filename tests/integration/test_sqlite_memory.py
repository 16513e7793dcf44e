"""The SQLite store's memory mode: the same decisions as the transactional path, its durability
contract (a graceful close loses nothing, a ``kill -9`` only what was not yet committed, and
never half of a change), restart, and the hand-over to the transactional path when a second
user of the file appears (in this process and in another one).

Time is injected (``now_ms``); nothing here asserts on wall-clock durations.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from child_support import reap

from fairgate.domain.units import Unit, Window
from fairgate.process.settings import Settings
from fairgate.quota.decision import compile_checks
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import AdmitRequest, CounterRef, UsageItem
from fairgate.quota.window import Count
from fairgate.store.factory import create_store
from fairgate.store.sqlite.owner import FileUse, shared_connection
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

T0 = 1_700_002_800_000
REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 1_000_000)
TOK = Dimension(Unit.TOKENS, Window.FIVE_HOURS, 1e12)
POOL = make_pool(
    REQ, TOK, allocations=(Allocation("a", 50, policy=Policy.SOFT), Allocation("b", 50))
)
REFS = [CounterRef(REQ.key, REQ.window_ms), CounterRef(TOK.key, TOK.window_ms)]


def _request(key: str, rid: str, now_ms: int, pool: Pool = POOL) -> AdmitRequest:
    alloc = pool.allocation(key)
    assert alloc is not None
    return AdmitRequest(
        pool_id=pool.id,
        key_id=key,
        checks=compile_checks(pool, alloc, {Unit.REQUESTS: 1.0, Unit.TOKENS: 100.0}),
        policy=alloc.policy,
        threshold=0.5,
        reservation_id=rid,
        now_ms=now_ms,
    )


def _usage(tokens: float) -> list[UsageItem]:
    return [UsageItem(REQ.key, REQ.window_ms, 1.0), UsageItem(TOK.key, TOK.window_ms, tokens)]


async def _serve(store: SqliteQuotaStore, n: int, *, first: int = 0, hold: int = 0) -> None:
    """``n`` admissions settled with 40 tokens each, then ``hold`` admissions left reserved."""
    for i in range(first, first + n + hold):
        rid = f"r{i}"
        assert (await store.admit(_request("ab"[i % 2], rid, T0 + i))).reserved
        if i < first + n:
            await store.settle(POOL.id, "ab"[i % 2], rid, _usage(40.0), T0 + i)


def _file_state(path: Path, *, fold: bool = True) -> tuple[float, float, int]:
    """(requests, tokens, reservations) as the file holds them: the pool totals of the
    current buckets, read with plain SQL (no store, no memory) on a connection opened as one
    more process on the file (``shared_connection``), which folds the journal into the tables
    first as every opener does (``fold``; without it: the tables alone, by plain ``sqlite3``)."""
    if fold:
        with shared_connection(path) as db:
            return _rows(db)
    db = sqlite3.connect(path)
    try:
        return _rows(db)
    finally:
        db.close()


def _rows(db: sqlite3.Connection) -> tuple[float, float, int]:
    """:func:`_file_state` on an open connection."""
    total = "SELECT COALESCE(SUM(value), 0) FROM quota_counter WHERE key_id = '*' AND counter = ?"
    req = db.execute(total, (REQ.key,)).fetchone()[0]
    tok = db.execute(total, (TOK.key,)).fetchone()[0]
    held = db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone()[0]
    return float(req), float(tok), int(held)


async def test_graceful_close_loses_nothing_and_a_restart_restores_the_state(
    tmp_path: Path,
) -> None:
    path = tmp_path / "quota.sqlite"
    # a flush interval far beyond the test: only the close can have written anything
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1000)
    assert store.mode == "memory"
    await _serve(store, 30, hold=3)
    await store.close()
    # 30 settled (1 request + 40 tokens) and 3 held (1 request + 100 tokens reserved)
    assert _file_state(path) == (33.0, 30 * 40.0 + 3 * 100.0, 3)

    again = SqliteQuotaStore(path, mode="memory")
    try:
        assert again.mode == "memory"
        usage = await again.pool_usage(POOL.id, ["a", "b"], REFS, T0 + 100)
        assert usage.totals[REQ.key] == Count(0.0, 33.0)
        assert usage.per_key["a"][TOK.key].curr + usage.per_key["b"][TOK.key].curr == 1500.0
        # a reservation held across the restart settles against what it reserved
        await again.settle(POOL.id, "b", "r31", _usage(10.0), T0 + 100)
        assert await again.release(POOL.id, "r32", T0 + 100)
        assert not await again.release(POOL.id, "r32", T0 + 100)
    finally:
        await again.close()
    assert _file_state(path) == (32.0, 30 * 40.0 + 100.0 + 10.0, 1)


async def test_buckets_newer_than_the_file_held_at_start_are_never_asked_of_it(
    tmp_path: Path,
) -> None:
    """The owner asks the file only for buckets it may hold: those no newer than its newest
    bucket of that counter when this process became the owner (everything written since is in
    memory). Buckets at or below it are still read from the file, so a restart restores
    them; a new key, and every key's first use of a new window, asks nothing."""
    path = tmp_path / "quota.sqlite"
    store = SqliteQuotaStore(path, mode="memory", flush_ms=1000)
    await _serve(store, 10)  # keys a and b, in the current buckets of both windows
    await store.close()

    again = SqliteQuotaStore(path, mode="memory", flush_ms=1000)
    loads: list[str] = []
    again._conn.set_trace_callback(
        lambda sql: loads.append(sql) if sql.startswith("SELECT value FROM quota_counter") else None
    )
    try:
        # key a's buckets are in the file (its current ones and, older still, the previous)
        usage = await again.pool_usage(POOL.id, ["a"], REFS, T0 + 100)
        assert usage.per_key["a"][REQ.key] == Count(0.0, 5.0)
        assert usage.per_key["a"][TOK.key].curr == 5 * 40.0
        assert loads  # read from the file, as they must be
        # key b's buckets, in the file too
        loads.clear()
        res = await again.admit(_request("b", "late-b", T0 + 200))
        assert res.reserved
        assert res.mine[0] == Count(0.0, 5.0)
        assert loads
        # the next hour: the requests counter's new bucket is newer than anything the file
        # held, so its first use asks nothing (the tokens' 5-hour bucket is the same one)
        loads.clear()
        hour = T0 + REQ.window_ms
        res = await again.admit(_request("a", "next-hour-a", hour))
        assert res.reserved
        assert res.mine[0] == Count(5.0, 0.0)  # the previous hour is a's five requests
        # and the pool's ten: b's late reservation, never settled, was reclaimed at its lease
        assert res.totals[0] == Count(10.0, 0.0)
        assert loads == []
    finally:
        again._conn.set_trace_callback(None)
        await again.close()


async def test_memory_and_transactional_give_identical_decisions_and_counts(
    tmp_path: Path,
) -> None:
    """The contract suite's parity scenario (every outcome, leases lapsing, buckets rolling)
    on both modes: the same log and the same final counts, to the last bit."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_store_contract import PARITY_SEED, _run_scenario

    results = []
    for mode in ("transactional", "memory"):
        store = SqliteQuotaStore(tmp_path / f"{mode}.sqlite", mode=mode)
        try:
            assert store.mode == mode
            results.append(await _run_scenario(store, seed=PARITY_SEED))
        finally:
            await store.close()
    (t_log, t_floats, t_final), (m_log, m_floats, m_final) = results
    for t_entry, m_entry in zip(t_log, m_log, strict=True):
        assert t_entry == m_entry
    assert t_floats == m_floats
    assert t_final == m_final


async def test_a_second_store_on_the_file_takes_over_transactionally(tmp_path: Path) -> None:
    """In one process as across processes: the owner commits, hands over, and from then on
    both count in the file, exactly."""
    path = tmp_path / "quota.sqlite"
    pool = make_pool(
        Dimension(Unit.REQUESTS, Window.HOURLY, 10),
        allocations=(Allocation("a", 50, policy=Policy.BURST), Allocation("b", 50)),
    )

    def req(key: str, i: int) -> AdmitRequest:
        alloc = pool.allocation(key)
        assert alloc is not None
        checks = compile_checks(pool, alloc, {Unit.REQUESTS: 1.0})
        return AdmitRequest(pool.id, key, checks, alloc.policy, 0.5, f"{key}{i}", T0)

    owner = SqliteQuotaStore(path, mode="memory", flush_ms=1000)
    assert owner.mode == "memory"
    won = sum([(await owner.admit(req("a", i))).reserved for i in range(6)])
    assert won == 6
    # the newcomer's constructor waits until the owner's flusher has handed over (the owner
    # notices within one flush round, 1 s here, so this returns after about a second)
    newcomer = await asyncio.to_thread(SqliteQuotaStore, path, mode="memory")
    try:
        assert owner.mode == "transactional"
        assert newcomer.mode == "transactional"
        assert _file_state(path)[0] == 6.0  # committed by the hand-over
        stores = [owner, newcomer] * 5
        results = [await s.admit(req("a", i)) for i, s in enumerate(stores, start=6)]
        assert sum(r.reserved for r in results) == 4  # exactly the limit of 10, across both
    finally:
        await newcomer.close()
        await owner.close()
    assert _file_state(path)[0] == 10.0


_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path[:0] = {tests!r}
    from test_sqlite_memory import SqliteQuotaStore, _serve

    async def main():
        store = SqliteQuotaStore({path!r}, mode="memory", flush_ms={flush_ms}, fold_ms={fold_ms})
        assert store.mode == "memory"
        await _serve(store, {settled})
        await store.flush()  # everything so far is committed: must survive the kill
        committed = store.durability()
        await _serve(store, {more}, first={settled})  # after the commit: may be lost
        if {wait_commit}:
            while store.durability()["committed"] < store.durability()["changes"]:
                await asyncio.sleep(0.001)
        print(json.dumps({{"committed": committed, "now": store.durability()}}), flush=True)
        await asyncio.sleep(3600)  # killed here

    asyncio.run(main())
    """
)


def _run_and_kill(
    path: Path, *, settled: int, more: int, flush_ms: int, wait: bool, fold_ms: int = 1000
) -> dict:
    code = _CHILD.format(
        tests=[str(Path(__file__).parent), str(Path(__file__).parents[1])],
        path=str(path),
        flush_ms=flush_ms,
        fold_ms=fold_ms,
        settled=settled,
        more=more,
        wait_commit=wait,
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, env={**os.environ}, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the child died before reporting"
        report: dict = json.loads(line)
        proc.send_signal(signal.SIGKILL)  # kill -9: no close, no final commit
        proc.wait(timeout=30)
    finally:
        reap(proc)
    assert proc.returncode == -signal.SIGKILL
    return report


@pytest.mark.slow
def test_kill_9_loses_at_most_what_was_not_committed_and_never_half_a_change(
    tmp_path: Path,
) -> None:
    """40 requests settled and committed, then 25 more that a 1 s flush interval has most
    likely not written yet: after the kill the file holds the 40 and at most the 25, and
    whatever it holds is one consistent moment (every request counted once, in both counters,
    no reservation left behind by a settle that was written without its reservation's delete)."""
    path = tmp_path / "quota.sqlite"
    report = _run_and_kill(path, settled=40, more=25, flush_ms=1000, wait=False)
    assert report["committed"]["committed"] == report["committed"]["changes"]
    req, tok, held = _file_state(path)
    assert 40.0 <= req <= 65.0  # the committed 40 survive; the 25 may be lost
    # one consistent moment: each settled request with its 40 tokens, and a request caught
    # between its admission and its settle with its reservation (100 tokens) and its row
    assert held <= 1
    assert tok == (req - held) * 40.0 + held * 100.0

    async def reopen() -> Count:
        store = SqliteQuotaStore(path, mode="memory")
        try:
            assert store.mode == "memory"
            usage = await store.pool_usage(POOL.id, [], REFS, T0 + 100)
            return usage.totals[REQ.key]
        finally:
            await store.close()

    assert asyncio.run(reopen()) == Count(0.0, req)  # restart counts on from what survived


@pytest.mark.slow
def test_kill_9_after_the_commit_caught_up_loses_nothing(tmp_path: Path) -> None:
    """The contract's other half: once the write-behind has committed (within ``flush_ms`` of
    the change, 5 ms by default), a kill -9 loses nothing, reservations included. A fold
    interval far beyond the test leaves the last 20 requests in the journal only (the
    ``flush()`` before them folded the first 30 into the tables): the next process to open
    the file folds them, so nothing committed is lost with the memory it was folded from."""
    path = tmp_path / "quota.sqlite"
    report = _run_and_kill(path, settled=30, more=20, flush_ms=5, wait=True, fold_ms=3_600_000)
    assert report["now"]["committed"] == report["now"]["changes"]
    assert report["now"]["folds"] == report["committed"]["folds"]  # none after the 30
    assert _file_state(path, fold=False) == (30.0, 30 * 40.0, 0)  # the tables alone
    # whoever opens the file next folds the journal first: a store, or a sharer's connection
    store = SqliteQuotaStore(path, mode="memory")
    try:
        usage = asyncio.run(store.pool_usage(POOL.id, [], REFS, T0 + 100))
        assert usage.totals[REQ.key] == Count(0.0, 50.0)
    finally:
        asyncio.run(store.close())
    assert _file_state(path, fold=False) == (50.0, 50 * 40.0, 0)


async def test_factory_reads_the_mode_and_flush_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = await create_store(tmp_path / "a.sqlite", Settings.load({}).store)
    assert isinstance(store, SqliteQuotaStore)
    assert store.mode == "memory"  # the default
    await store.close()
    env = {"QUOTA_SQLITE_MODE": " Transactional "}
    store, _ = await create_store(tmp_path / "t.sqlite", Settings.load(env).store)
    assert isinstance(store, SqliteQuotaStore)
    assert store.mode == "transactional"
    await store.close()
    env = {"QUOTA_SQLITE_MODE": "Memory", "QUOTA_SQLITE_FLUSH_MS": "20"}
    store, _ = await create_store(tmp_path / "b.sqlite", Settings.load(env).store)
    assert isinstance(store, SqliteQuotaStore)
    assert store.mode == "memory"
    assert store._behind is not None
    assert store._behind._flush_s == 0.02
    await store.close()
    env = {"QUOTA_SQLITE_MODE": "fast", "QUOTA_SQLITE_FLUSH_MS": "5000"}
    store, _ = await create_store(tmp_path / "c.sqlite", Settings.load(env).store)
    assert isinstance(store, SqliteQuotaStore)
    assert store.mode == "transactional"
    await store.close()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "QUOTA_SQLITE_MODE='fast'" in messages
    assert "QUOTA_SQLITE_FLUSH_MS='5000'" in messages


async def test_every_reader_sees_the_counters_not_the_last_commit(tmp_path: Path) -> None:
    """The default mode holds the last milliseconds in memory, so the file alone is stale. A
    flush interval far beyond the test keeps it stale here: every reader must see the counters
    all the same. The store's own reads (the usage API's ``pool_usage`` and ``peek``,
    ``cumulative``, ``active_keys``) answer from memory or commit first; a reader in another
    connection opened as one more user of the file (``shared_connection``) makes the owner
    commit and hand over before it reads, and the counts stay exact after."""
    path = tmp_path / "quota.sqlite"
    store = SqliteQuotaStore(path, flush_ms=1000)
    assert store.mode == "memory"  # the default
    try:
        await _serve(store, 7, hold=2)  # r0..r8: 7 settled, r7 (b) and r8 (a) held
        # these two commit first (they read the file), so they see everything
        assert await store.cumulative(POOL.id, [REQ.key, TOK.key]) == {
            REQ.key: 7.0,
            TOK.key: 280.0,
        }
        assert sorted(await store.active_keys(POOL.id, T0)) == ["a", "b"]
        await _serve(store, 3, first=9)  # r9..r11 settled: in memory only from here
        now = T0 + 20
        usage = await store.pool_usage(POOL.id, ["a", "b"], REFS, now)
        assert usage.totals[REQ.key] == Count(0.0, 12.0)
        assert usage.totals[TOK.key] == Count(0.0, 10 * 40.0 + 2 * 100.0)
        assert usage.per_key["a"][REQ.key] == Count(0.0, 6.0)
        assert (await store.peek(POOL.id, "b", REFS, now))[REQ.key] == Count(0.0, 6.0)

        def read_as_sharer() -> tuple[float, float, int]:
            with shared_connection(path) as db:
                return _rows(db)

        # off the loop: the owner's watcher thread commits and hands over meanwhile
        assert await asyncio.to_thread(read_as_sharer) == (12.0, 600.0, 2)
        assert store.mode == "transactional"
        await store.settle(POOL.id, "a", "r8", _usage(40.0), now)
        assert _file_state(path) == (12.0, 540.0, 1)  # committed at once from now on
    finally:
        await store.close()


def test_a_sharer_rings_the_owner_awake(tmp_path: Path) -> None:
    """The owner's watcher sleeps on a doorbell while nothing is pending: a process that wants
    the file rings it as it announces itself (and again while it waits), and only one owner
    can hold a file's doorbell."""
    path = str(tmp_path / "quota.sqlite")
    owner = FileUse(path)
    sharer = FileUse(path)
    assert owner.try_own()
    bell = owner.doorbell()
    assert bell is not None
    try:
        assert FileUse(path).doorbell() is None  # the name is the owner's
        waiting = threading.Thread(target=sharer.share, args=(60_000,))
        waiting.start()
        readable, _, _ = select.select([bell], [], [], 60)
        assert readable == [bell]
        assert bell.recv(16) == b"!"
        assert owner.sharer_waiting()
        owner.hand_over()
        waiting.join()
        assert not owner.owner
        assert not sharer.owner
    finally:
        bell.close()
        owner.close()
        sharer.close()


async def test_writers_of_every_process_queue_on_the_file_writers_lock(tmp_path: Path) -> None:
    """Every write transaction holds ``<file>.write`` (no sleep in SQLite's busy handler while
    another process commits): while another holder keeps it, a store's admission waits, and a
    holder that never lets go is bounded by the busy timeout (the store's unavailable error, on
    which the engine fails open), as SQLite's own lock was; once it is released, the waiting
    writer gets in and nothing was half-written."""
    path = tmp_path / "quota.sqlite"
    store = SqliteQuotaStore(path, mode="transactional", busy_timeout_ms=50)
    other, third = FileUse(str(path)), FileUse(str(path))
    try:
        assert (await store.admit(_request("a", "r0", T0))).reserved
        with other.writing(1000):
            with pytest.raises(tuple(store.unavailable_errors), match="locked"):
                await store.admit(_request("a", "r1", T0 + 1))
            with pytest.raises(sqlite3.OperationalError, match="locked"), third.writing(10):
                pass  # a third process waits too
        # opened before the holder takes the lock: opening writes the schema, under the lock too
        store2 = SqliteQuotaStore(path, mode="transactional", busy_timeout_ms=60_000)
        held, released = threading.Event(), threading.Event()

        def hold_then_release() -> None:
            with other.writing(60_000):
                held.set()
                released.wait(60)

        holder = threading.Thread(target=hold_then_release)
        holder.start()
        try:
            assert held.wait(60)  # the holder has the lock before the admission asks for it
            # the holder runs on its own thread; the store waits on the lock, not on a timer
            # (however late the timer fires, the admission can only get in after it has)
            threading.Timer(0.05, released.set).start()
            assert (await store2.admit(_request("b", "r2", T0 + 2))).reserved
            assert released.is_set()  # it got in only after the holder let go
        finally:
            released.set()
            holder.join()
            await store2.close()
        assert (await store.admit(_request("a", "r3", T0 + 3))).reserved
        counts = await store.peek(POOL.id, "a", REFS, T0 + 3)
        assert counts[REQ.key].curr == 2.0  # r0 and r3: r1 wrote nothing
    finally:
        other.close()
        third.close()
        await store.close()


async def test_transactional_settles_of_one_loop_turn_share_one_commit(tmp_path: Path) -> None:
    """Group commit: the settles asked in one loop turn are one write transaction (a request
    then costs its admission's transaction and a share of one settle transaction, which is
    what processes sharing a file queue for), each in its own savepoint: one that fails is
    rolled back alone, its reservation intact, and its caller gets the error. A settle that
    returned is committed: another process reads it."""
    path = tmp_path / "quota.sqlite"
    store = SqliteQuotaStore(path, mode="transactional")
    reader = SqliteQuotaStore(path, mode="transactional")
    try:
        for i in range(8):
            assert (await store.admit(_request("a", f"r{i}", T0 + i))).reserved
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        bad = [UsageItem(REQ.key, REQ.window_ms, 1.0), UsageItem(TOK.key, TOK.window_ms, "x")]
        results = await asyncio.gather(
            *(
                store.settle(POOL.id, "a", f"r{i}", bad if i == 3 else _usage(40.0), T0 + 9)
                for i in range(8)
            ),
            return_exceptions=True,
        )
        store._conn.set_trace_callback(None)
        assert [type(r).__name__ for r in results] == ["NoneType"] * 3 + ["ValueError"] + [
            "NoneType"
        ] * 4
        assert sum(s.startswith("BEGIN") for s in statements) == 1
        assert sum(s == "COMMIT" for s in statements) == 1
        counts = await reader.peek(POOL.id, "a", REFS, T0 + 9)
        assert counts[REQ.key].curr == 8.0
        assert counts[TOK.key].curr == 7 * 40.0 + 100.0  # r3 still holds its reservation
        # a settle alone (nothing else in its turn) is its own transaction, as before
        await store.settle(POOL.id, "a", "r3", _usage(40.0), T0 + 10)
        counts = await reader.peek(POOL.id, "a", REFS, T0 + 10)
        assert counts[TOK.key].curr == 8 * 40.0
    finally:
        await reader.close()
        await store.close()


async def test_transactional_admissions_of_one_loop_turn_share_one_commit_exactly(
    tmp_path: Path,
) -> None:
    """Admissions are group-committed too: twelve asked in one loop turn against a limit of 5
    are one transaction, decided in the order asked (each sees what the ones before it
    reserved), so exactly 5 are reserved; an id already held is refused alone."""
    small = make_pool(
        Dimension(Unit.REQUESTS, Window.HOURLY, 5),
        allocations=(Allocation("a", 50), Allocation("b", 50)),
        id="s",
    )
    store = SqliteQuotaStore(tmp_path / "quota.sqlite", mode="transactional")
    try:
        assert (await store.admit(_request("a", "held", T0, small))).reserved
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        asked = [_request("ab"[i % 2], f"q{i}", T0 + 1, small) for i in range(11)]
        asked.insert(1, _request("b", "held", T0 + 1, small))
        results = await asyncio.gather(*(store.admit(r) for r in asked), return_exceptions=True)
        store._conn.set_trace_callback(None)
        assert sum(s.startswith("BEGIN") for s in statements) == 1
        assert type(results[1]).__name__ == "ReservationExists"
        verdicts = [r for i, r in enumerate(results) if i != 1]
        assert [getattr(r, "reserved", None) for r in verdicts] == [True] * 4 + [False] * 7
        dim = small.dimensions[0]
        total = await store.pool_usage(small.id, [], [CounterRef(dim.key, dim.window_ms)], T0 + 1)
        assert total.totals[dim.key].curr == 5.0
    finally:
        await store.close()


async def test_a_group_commit_skips_admissions_whose_caller_left_not_settles(
    tmp_path: Path,
) -> None:
    """A caller cancelled while its write waits for the loop turn's commit (a client that hung
    up): its admission is not made (nobody would settle or release it, and it would hold quota
    until its lease ran out), its settle is (it accounts for work the upstream did)."""
    store = SqliteQuotaStore(tmp_path / "quota.sqlite", mode="transactional")
    try:
        assert (await store.admit(_request("a", "r0", T0))).reserved
        admit = asyncio.ensure_future(store.admit(_request("a", "gone", T0 + 1)))
        settle = asyncio.ensure_future(store.settle(POOL.id, "a", "r0", _usage(40.0), T0 + 1))
        await asyncio.sleep(0)  # both wait for the group commit, which runs after this step
        admit.cancel()
        settle.cancel()
        results = await asyncio.gather(admit, settle, return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["CancelledError"] * 2
        counts = await store.peek(POOL.id, "a", REFS, T0 + 1)
        assert counts[REQ.key].curr == 1.0  # r0 only
        assert counts[TOK.key].curr == 40.0  # r0 settled
        assert (await store.admit(_request("a", "gone", T0 + 2))).reserved  # never held
    finally:
        await store.close()


def test_the_store_refuses_a_bad_mode_or_interval(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode"):
        SqliteQuotaStore(tmp_path / "a.sqlite", mode="fast")
    with pytest.raises(ValueError, match="flush_ms"):
        SqliteQuotaStore(tmp_path / "b.sqlite", mode="memory", flush_ms=0)
