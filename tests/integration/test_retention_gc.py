"""Retention GC that runs (fairgate.quota.retention): a gateway with an injected clock through
30 simulated days of traffic on a real SQLite file keeps its counter table bounded, reclaims
the reservation of a request whose process crashed, and says in /health what it removed."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from db_support import connection

from fairgate.clock import ManualClock
from fairgate.config import parse_config
from fairgate.domain.units import Unit
from fairgate.process.state import Gateway
from fairgate.quota.retention import INTERVAL_S, JITTER, START_JITTER_S, RetentionGc

HOUR = 3_600_000
DAY = 24 * HOUR
KEYS = ("alice", "bob", "carol")
CONFIG: dict[str, Any] = {
    "connections": [connection("mock-1")],
    "keys": [{"id": k, "name": k, "secret": f"fg-{k}-secret-0123456789"} for k in KEYS],
    "pools": [
        {
            "id": "busy",
            "name": "Busy",
            "connections": ["mock-1"],
            "dimensions": [
                {"unit": "requests", "window": "hourly", "limit": 1000},
                {"unit": "tokens", "window": "daily", "limit": 10_000_000},
            ],
            "allocations": [{"key": k, "weight": 1, "policy": "burst"} for k in KEYS],
        }
    ],
}
RETENTION_DAYS = 3


async def counter_rows(gw: Gateway) -> int:
    # the store's memory mode (the default) writes behind: commit first, then the file is
    # the whole state
    await gw.engine.store.flush()
    with sqlite3.connect(gw.quota_store_path) as db:
        return int(db.execute("SELECT COUNT(*) FROM quota_counter").fetchone()[0])


async def reservation_rows(gw: Gateway) -> int:
    await gw.engine.store.flush()
    with sqlite3.connect(gw.quota_store_path) as db:
        return int(db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone()[0])


async def test_thirty_days_of_traffic_keep_the_counter_table_bounded(
    tmp_path: Path, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"QUOTA_CONSUMPTION_RETENTION_DAYS": str(RETENTION_DAYS)}
    gw = Gateway(data_dir=tmp_path, config=parse_config(CONFIG, {}), clock=clock, env=env)
    await gw.start()
    start = clock.now_ms()
    try:
        pool = gw.registry.pools["busy"]
        rows_by_day: list[int] = []
        for hour in range(30 * 24):
            for key in KEYS:  # every key, every hour: a new bucket per key and counter
                adm = await gw.engine.admit(pool, key, {Unit.REQUESTS: 1, Unit.TOKENS: 100})
                assert adm.allowed
                await gw.engine.settle(adm.ticket, {Unit.REQUESTS: 1, Unit.TOKENS: 90})
            if hour % 24 == 0:
                await gw.retention.run_once()  # what the hourly task does, at the clock's now
                rows_by_day.append(await counter_rows(gw))
            clock.advance(HOUR)
        await gw.retention.run_once()
        rows = await counter_rows(gw)
        health_gc = gw.retention.as_json()
    finally:
        await gw.stop()
    size = gw.quota_store_path.stat().st_size

    # (keys + the pool total) x buckets kept: hourly ones within the retention (+1 turning
    # bucket), daily ones within max(retention, 2 days)
    bound = (len(KEYS) + 1) * ((RETENTION_DAYS * 24 + 2) + (RETENTION_DAYS + 2))
    days = (clock.now_ms() - HOUR) // DAY - start // DAY + 1  # daily buckets written
    ungoverned = (len(KEYS) + 1) * (30 * 24 + days)  # what 30 days leave without gc
    with capsys.disabled():
        print(
            f"\n[figures] 30 simulated days, 3 keys, hourly + daily counters, retention "
            f"{RETENTION_DAYS} days: {rows} counter rows (bound {bound}, {ungoverned} without "
            f"gc), quota.sqlite {size / 1024:.0f} KiB; rows per day {rows_by_day[::5]}"
        )
    assert rows <= bound
    assert max(rows_by_day) <= bound  # bounded all along, not only at the end
    assert rows_by_day[-1] == rows_by_day[10]  # flat once the retention is reached
    assert health_gc["runs"] == 31  # one a day here (the task runs hourly), and a last one
    assert health_gc["lastRunMs"] == clock.now_ms()
    removed = health_gc["removedTotal"]
    assert isinstance(removed, dict)
    assert removed["buckets"] == ungoverned - rows


async def test_a_crashed_requests_reservation_is_reclaimed_in_an_idle_pool(
    tmp_path: Path, clock: ManualClock
) -> None:
    gw = Gateway(data_dir=tmp_path, config=parse_config(CONFIG, {}), clock=clock, env={})
    await gw.start()
    try:
        pool = gw.registry.pools["busy"]
        adm = await gw.engine.admit(pool, "alice", {Unit.REQUESTS: 1, Unit.TOKENS: 5_000})
        assert adm.ticket is not None
        # the process "crashes": nothing settles or releases; nobody uses the pool again
        assert await reservation_rows(gw) == 1
        clock.advance(gw.quota_settings.lease_ms - 1)
        assert (await gw.retention.run_once()).result.reservations == 0  # lease not over yet
        clock.advance(1)
        run = await gw.retention.run_once()
        assert run.result.reservations == 1
        assert await reservation_rows(gw) == 0
        usage = await gw.engine.usage(pool)
        assert [d.total for d in usage.dimensions] == [0, 0]  # the estimate is given back
        last = gw.retention.as_json()["lastRemoved"]
        assert last == {
            "buckets": 0,
            "activeKeys": 0,
            "reservations": 1,
            "skipped": False,
            "logEvents": 0,
        }
    finally:
        await gw.stop()


def test_the_schedule_once_soon_after_start_then_hourly_with_jitter() -> None:
    gc = RetentionGc(None, rng=random.Random(7))  # type: ignore[arg-type]
    first = [gc.delay_s(first=True) for _ in range(200)]
    later = [gc.delay_s(first=False) for _ in range(200)]
    assert all(0 <= d <= START_JITTER_S for d in first)
    assert all(INTERVAL_S * (1 - JITTER) <= d <= INTERVAL_S * (1 + JITTER) for d in later)
    assert len({round(d) for d in later}) > 100  # replicas do not run in lockstep
