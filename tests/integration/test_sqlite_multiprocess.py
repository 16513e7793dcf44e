"""Several OS processes on one SQLite file: the admission stays exact (``BEGIN IMMEDIATE``)."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import compile_checks
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import AdmitRequest, CounterRef
from fairgate.quota.window import Count
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

#: Fixed instant handed to every worker (same as ``T0`` of tests/conftest.py): no clocks.
NOW_MS = 1_700_002_800_000
PROCESSES = 4


def _pool(limit: int) -> Pool:
    return make_pool(
        Dimension(Unit.REQUESTS, Window.HOURLY, limit),
        allocations=tuple(
            Allocation(f"k{i}", weight=100 / PROCESSES, policy=Policy.BURST)
            for i in range(PROCESSES)
        ),
        id="shared",
        connections=("conn-1",),
    )


def _request(pool: Pool, worker: int, n: int) -> AdmitRequest:
    key = f"k{worker}"
    alloc = pool.allocation(key)
    assert alloc is not None
    return AdmitRequest(
        pool_id=pool.id,
        key_id=key,
        checks=compile_checks(pool, alloc, {Unit.REQUESTS: 1.0}),
        policy=alloc.policy,
        threshold=0.5,
        reservation_id=f"w{worker}-{n}",
        now_ms=NOW_MS,
    )


async def _race(path: str, limit: int, admits: int, worker: int, start: Any) -> int:
    pool = _pool(limit)
    store = SqliteQuotaStore(path)  # every process opens (and may create) the file itself
    try:
        start.wait()  # all processes open before any admits, so the admissions overlap
        results = await asyncio.gather(
            *(store.admit(_request(pool, worker, n)) for n in range(admits))
        )
        return sum(r.reserved for r in results)
    finally:
        await store.close()


def _report(worker: int, race: Coroutine[Any, Any, int], out: Any) -> None:
    """Run one process's race and put what it won (or what went wrong) on ``out``."""
    try:
        out.put((worker, asyncio.run(race), None))
    except BaseException as exc:  # report, never hang the parent
        out.put((worker, 0, repr(exc)))


def _worker(path: str, limit: int, admits: int, worker: int, start: Any, out: Any) -> None:
    _report(worker, _race(path, limit, admits, worker, start), out)


def _run_racers(
    worker: Callable[..., None], path: str, limit: int, admits: int
) -> tuple[list[tuple[int, int, str | None]], list[int | None]]:
    """``worker(path, limit, admits, i, start, out)`` in ``PROCESSES`` spawned processes that
    start together at a barrier: the report each put on ``out`` and their exit codes."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES, timeout=60)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(path, limit, admits, i, start, out), daemon=True)
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return reports, [p.exitcode for p in procs]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "admits_per_process"),
    [
        pytest.param(5, 25, id="100-racers-limit-5"),
        # Long enough that the processes really interleave: a lost update or a read outside
        # the write lock shows up as a wrong total or a "database is locked" error.
        pytest.param(1500, 500, id="2000-racers-limit-1500"),
    ],
)
async def test_sqlite_processes_racing_admit_exactly_the_limit(
    tmp_path: Path, limit: int, admits_per_process: int
) -> None:
    path = str(tmp_path / "quota.sqlite")
    pool = _pool(limit)
    dim = pool.dimensions[0]
    reports, exitcodes = _run_racers(_worker, path, limit, admits_per_process)
    assert [err for _, _, err in reports] == [None] * PROCESSES
    assert sum(won for _, won, _ in reports) == limit
    assert exitcodes == [0] * PROCESSES

    store = SqliteQuotaStore(path)
    try:
        usage = await store.pool_usage(
            pool.id,
            [a.key_id for a in pool.allocations],
            [CounterRef(dim.key, dim.window_ms)],
            NOW_MS,
        )
    finally:
        await store.close()
    assert usage.totals[dim.key] == Count(0.0, float(limit))
    assert sum(k[dim.key].curr for k in usage.per_key.values()) == limit
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone() == (limit,)
    finally:
        db.close()


async def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "quota.sqlite"
    store = SqliteQuotaStore(path, busy_timeout_ms=1234)
    try:
        assert await store.ping()
        db = sqlite3.connect(path)
        try:
            # The journal mode is a property of the file: another connection sees it too.
            assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            db.close()
        conn = store._conn  # the store's own connection settings
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (1234,)
        assert conn.execute("PRAGMA synchronous").fetchone() == (0,)  # OFF, the default
    finally:
        await store.close()


async def test_sqlite_store_reopens_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "quota.sqlite"
    pool = _pool(5)
    first = SqliteQuotaStore(path)
    await first.admit(_request(pool, 0, 0))
    await first.close()
    second = SqliteQuotaStore(path)  # the schema is created idempotently
    try:
        result = await second.admit(_request(pool, 1, 0))
        assert result.totals == (Count(0.0, 1.0),)
    finally:
        await second.close()


async def _join_race(path: str, limit: int, admits: int, worker: int, start: Any) -> int:
    """Worker 0 owns the file in memory mode and admits before and while the others join
    (also asking for memory mode: they cannot have it, so the owner hands over mid-traffic)."""
    pool = _pool(limit)
    if worker != 0:
        start.wait()
    store = SqliteQuotaStore(path, mode="memory")
    try:
        won = 0
        if worker == 0:
            assert store.mode == "memory"
            for n in range(admits):  # in memory, before anyone else has the file
                won += (await store.admit(_request(pool, 0, n))).reserved
            start.wait()
            n = admits
            while store.mode == "memory":  # admitting while the others open the file
                won += (await store.admit(_request(pool, 0, n))).reserved
                n += 1
                await asyncio.sleep(0.001)
            for m in range(n, n + admits):  # and on, transactionally, beside them
                won += (await store.admit(_request(pool, 0, m))).reserved
            return won
        assert store.mode == "transactional"
        for n in range(admits):
            won += (await store.admit(_request(pool, worker, n))).reserved
        return won
    finally:
        await store.close()


def _join_worker(path: str, limit: int, admits: int, worker: int, start: Any, out: Any) -> None:
    _report(worker, _join_race(path, limit, admits, worker, start), out)


@pytest.mark.slow
async def test_processes_joining_a_memory_mode_owner_still_admit_exactly_the_limit(
    tmp_path: Path,
) -> None:
    """The owner counted 20 in memory; three processes arrive while it is admitting: it commits,
    hands over, and the 100+ attempts of all four win exactly the limit of 40."""
    path = str(tmp_path / "quota.sqlite")
    limit = 40
    reports, _ = _run_racers(_join_worker, path, limit, 20)
    assert [err for _, _, err in reports] == [None] * PROCESSES
    assert {w: won for w, won, _ in reports}[0] >= 20  # its 20 in memory all won
    assert sum(won for _, won, _ in reports) == limit
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone() == (limit,)
        total = db.execute("SELECT value FROM quota_counter WHERE key_id = '*'").fetchone()
        assert total == (float(limit),)
    finally:
        db.close()
