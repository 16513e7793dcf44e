"""The engine's provider-anchored windows over real stores (``store`` fixture: SQLite and Redis):
readings anchor only the window they measure, replicas sharing a store follow one anchor, and
an admission's status and usage name the provider's reset."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import Outcome, Reason
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import QuotaStore
from fairgate.quota.settings import QuotaSettings
from fairgate.quota.window import Anchor
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

MIN = 60_000
W = Window.FIVE_HOURS.ms
T = 1_782_297_000_000  # 2026-06-24T10:30Z, mid epoch bucket (08:00-13:00)
R = T - 90 * MIN + W  # the account's window: 09:00-14:00
P5H = Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100)
PWEEK = Dimension(Unit.PERCENT, Window.WEEKLY, 100)
REQ = Dimension(Unit.REQUESTS, Window.FIVE_HOURS, 1_000)


def codex_pool() -> Pool:
    return make_pool(
        P5H,
        PWEEK,
        REQ,
        allocations=(Allocation("a", 50, policy=Policy.HARD), Allocation("b", 50)),
        id="cx",
        name="codex",
        provider="codex",
        connections=("codex-1",),
    )


async def test_a_reading_anchors_only_its_own_percent_window(
    store: QuotaStore, clock: ManualClock
) -> None:
    clock.set(T)
    engine = QuotaEngine(store, clock=clock)
    pool = codex_pool()
    got = await engine.anchor(pool, "percent/5h", W, R, "codex-1")
    assert got is not None
    assert got.reset_ms == R
    # requests windows stay epoch-aligned even when their length matches
    assert await engine.anchor(pool, "requests/5h", W, R, "codex-1") is None
    # a window the pool has no dimension for, or a length that is not the dimension's
    assert await engine.anchor(pool, "percent/monthly", Window.MONTHLY.ms, R, "codex-1") is None
    assert await engine.anchor(pool, "percent/weekly", W, R, "codex-1") is None
    assert set(await store.anchors("cx")) == {"percent/5h"}
    usage = {d.key: d for d in (await engine.usage(pool)).dimensions}
    assert usage["percent/5h"].resets_at_ms == R
    assert usage["percent/5h"].anchor_source == "codex-1"
    assert usage["percent/weekly"].anchor_source is None
    assert usage["requests/5h"].resets_at_ms == (T // W + 1) * W  # the epoch bucket's turn


async def test_replicas_count_in_the_window_one_of_them_anchored(
    store: QuotaStore, clock: ManualClock, open_replica: Callable[[], Awaitable[QuotaStore]]
) -> None:
    """Two gateway processes on one store: the reading reaches one; the other follows the
    anchor within ``active_refresh_ms`` and blocks and releases the key at the provider's
    reset, not at the epoch bucket's turn (13:00)."""
    clock.set(T)
    settings = QuotaSettings(active_refresh_ms=1_000)
    first = store
    second = await open_replica()
    try:
        a = QuotaEngine(first, clock=clock, settings=settings)
        b = QuotaEngine(second, clock=clock, settings=settings)
        pool = codex_pool()
        assert (await b.admit(pool, "a", {Unit.PERCENT: 1.0})).allowed  # b reads: no anchor
        await a.anchor(pool, "percent/5h", W, R, "codex-1")
        await a.record(pool, "a", {"percent/5h": 55.0})  # the readings' attribution, on a
        await a.record(pool, "b", {"percent/5h": 10.0})
        clock.advance(1_000)  # b's cached anchors are due for a re-read
        blocked = await b.admit(pool, "a", {Unit.PERCENT: 1.0})
        assert (blocked.outcome, blocked.reason) == (Outcome.BLOCK, Reason.FAIR_SHARE)
        assert blocked.retry_after_ms == R - clock.now_ms()
        five = next(s for s in blocked.status if s.key == "percent/5h")
        assert five.reset_ms == R - clock.now_ms()
        clock.set(T + 150 * MIN)  # 13:00: the epoch grid turns, the account's window does not
        assert not (await b.admit(pool, "a", {Unit.PERCENT: 1.0})).allowed
        clock.set(R)
        adm = await b.admit(pool, "a", {Unit.PERCENT: 1.0})
        assert adm.outcome is Outcome.ALLOW
    finally:
        await second.close()


@pytest.mark.parametrize("unit", [Unit.REQUESTS, Unit.TOKENS])
async def test_pools_without_percent_windows_never_read_anchors(
    tmp_path: Path, clock: ManualClock, unit: Unit
) -> None:
    """No extra store call for the pools anchoring cannot concern."""

    class Counting(SqliteQuotaStore):
        reads = 0

        async def anchors(self, pool_id: str) -> dict[str, Anchor]:
            Counting.reads += 1
            return {}

    store = Counting(tmp_path / "quota.sqlite")
    try:
        engine = QuotaEngine(store, clock=clock)
        pool = make_pool(
            Dimension(unit, Window.HOURLY, 100),
            allocations=(Allocation("a", 100),),
            connections=("k1",),
        )
        for _ in range(3):
            assert (await engine.admit(pool, "a", {unit: 1.0})).allowed
        await engine.usage(pool)
        assert Counting.reads == 0
    finally:
        await store.close()
