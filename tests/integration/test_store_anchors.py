"""Provider-anchored windows in the ``QuotaStore`` contract, on every driver (``store`` fixture),
and the SQLite and Redis drivers agreeing on an anchored scenario (parity).

Time is injected. ``T`` is 2026-06-24T10:30Z, 2.5 h into an epoch-aligned 5-hour bucket; the
provider's window started at 09:00 and resets at ``R`` = 14:00.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import Outcome, Reason, compile_checks
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import AdmitRequest, CounterRef, QuotaStore, UsageItem
from fairgate.quota.window import Anchor, bucket_index, natural_index
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

MIN = 60_000
W = Window.FIVE_HOURS.ms
T = 1_782_297_000_000
R = T - 90 * MIN + W
P5H = Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100)
REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 1_000)


def pool(pool_id: str = "codex-pool") -> Pool:
    return make_pool(
        P5H,
        REQ,
        allocations=(
            Allocation("a", 50, policy=Policy.HARD),
            Allocation("b", 50, policy=Policy.HARD),
        ),
        id=pool_id,
        provider="codex",
        connections=("codex-1",),
    )


def request(
    p: Pool,
    key: str,
    now: int,
    anchors: Mapping[str, Anchor] | None,
    percent: float = 1.0,
) -> AdmitRequest:
    alloc = p.allocation(key)
    assert alloc is not None
    checks = compile_checks(p, alloc, {Unit.PERCENT: percent, Unit.REQUESTS: 1.0}, anchors=anchors)
    return AdmitRequest(p.id, key, checks, alloc.policy, 0.5, uuid.uuid4().hex, now)


def charge(amount: float, anchor: Anchor | None) -> list[UsageItem]:
    return [UsageItem(P5H.key, P5H.window_ms, amount, anchor=anchor)]


async def percent_of(store: QuotaStore, key: str, now: int, anchor: Anchor | None) -> float:
    ref = CounterRef(P5H.key, P5H.window_ms, anchor)
    return (await store.peek("codex-pool", key, [ref], now))[P5H.key].value(now, W)


async def test_no_anchor_until_a_reading_sets_one(store: QuotaStore) -> None:
    assert await store.anchors("codex-pool") == {}
    got = await store.set_anchor("codex-pool", P5H.key, W, R, T, "codex-1")
    assert got is not None
    assert got.reset_ms == R
    assert got.source == "codex-1"
    assert got.index == max(natural_index(R, W), bucket_index(T, W))
    assert await store.anchors("codex-pool") == {P5H.key: got}
    assert await store.anchors("other-pool") == {}


async def test_a_restated_window_is_not_rewritten_and_an_early_reset_is(
    store: QuotaStore,
) -> None:
    first = await store.set_anchor("codex-pool", P5H.key, W, R, T, "codex-1")
    assert first is not None
    # the same window, stated a second later: the stored anchor stands
    assert await store.set_anchor("codex-pool", P5H.key, W, R + 1_000, T + MIN, "codex-1") == first
    # another member's window does not move it while it is live
    assert await store.set_anchor("codex-pool", P5H.key, W, T + W - MIN, T, "codex-2") == first
    # the provider reset early at 11:00: a fresh bucket
    now = T + 30 * MIN
    early = await store.set_anchor("codex-pool", P5H.key, W, now + W, now, "codex-1")
    assert early == Anchor(now + W, bucket_index(now, W, first) + 1, "codex-1")
    assert (await store.anchors("codex-pool"))[P5H.key] == early


async def test_anchored_counts_roll_over_at_the_providers_reset(store: QuotaStore) -> None:
    """Strict mode on percent/5h: each key is blocked at its share (50 %) until the provider's
    reset at 14:00, not until the epoch bucket turns (13:00) nor as a sliding window decays."""
    p = pool()
    anchor = await store.set_anchor(p.id, P5H.key, W, R, T, "codex-1")
    anchors = {P5H.key: anchor} if anchor is not None else {}
    admitted = 0
    while (await store.admit(request(p, "a", T, anchors, 10.0))).verdict.outcome is Outcome.ALLOW:
        admitted += 1
    assert admitted == 5  # 5 × 10 % reserved = the key's 50 % share once the pool is strict
    # the provider's readings attribute what the keys really used (the reservations lapse)
    await store.record(p.id, "a", charge(50.0, anchor), T)
    await store.record(p.id, "b", charge(30.0, anchor), T)
    blocked = await store.admit(request(p, "a", T + 60 * MIN, anchors, 10.0))
    assert (blocked.verdict.outcome, blocked.verdict.reason) == (Outcome.BLOCK, Reason.FAIR_SHARE)
    # past the epoch bucket's turn (13:00) the anchored window still holds it
    thirteen = T + 150 * MIN + 1
    assert bucket_index(thirteen, W) != bucket_index(T, W)
    assert await percent_of(store, "a", thirteen, anchor) == pytest.approx(50.0)
    late = await store.admit(request(p, "a", R - 1, anchors, 10.0))
    assert late.verdict.outcome is Outcome.BLOCK
    # 14:00: the provider's window reset, and so did every share
    assert await percent_of(store, "a", R, anchor) == 0.0
    res = await store.admit(request(p, "a", R, anchors, 10.0))
    assert res.verdict.outcome is Outcome.ALLOW
    assert res.totals[0].value(R, W) == 0.0
    assert res.mine[0].anchor == anchor
    # the hourly requests dimension stays epoch-aligned and sliding
    assert res.totals[1].anchor is None


async def test_settle_and_record_land_in_the_anchored_window(store: QuotaStore) -> None:
    p = pool()
    anchor = await store.set_anchor(p.id, P5H.key, W, R, T, "codex-1")
    assert anchor is not None
    anchors = {P5H.key: anchor}
    req = request(p, "a", T, anchors, 3.0)
    assert (await store.admit(req)).verdict.outcome is Outcome.ALLOW
    usage = [
        UsageItem(c.key, c.window_ms, 2.0 if c.unit is Unit.PERCENT else 1.0, anchor=c.anchor)
        for c in req.checks
    ]
    await store.settle(p.id, "a", req.reservation_id, usage, T + MIN)
    await store.record(p.id, "a", charge(4.0, anchor), T + 2 * MIN)
    assert await percent_of(store, "a", T + 3 * MIN, anchor) == pytest.approx(6.0)
    counts = await store.pool_usage(p.id, ["a"], [CounterRef(P5H.key, W, anchor)], T + 3 * MIN)
    assert counts.totals[P5H.key].value(T + 3 * MIN, W) == pytest.approx(6.0)
    assert counts.per_key["a"][P5H.key].anchor == anchor
    assert await percent_of(store, "a", R, anchor) == 0.0


async def test_clear_forgets_the_anchor(store: QuotaStore) -> None:
    await store.set_anchor("codex-pool", P5H.key, W, R, T, "codex-1")
    await store.set_anchor("keep-pool", P5H.key, W, R, T, "codex-1")
    await store.clear("codex-pool")
    assert await store.anchors("codex-pool") == {}
    assert P5H.key in await store.anchors("keep-pool")


async def test_replicas_racing_on_one_early_reset_move_the_anchor_once(
    store: QuotaStore, open_replica: Callable[[], Awaitable[QuotaStore]]
) -> None:
    """Two replicas see the same reading at once: the second finds the anchor already moved
    and leaves it (one fresh bucket, not two), and both read the same anchor afterwards."""
    first = await store.set_anchor("codex-pool", P5H.key, W, R, T, "codex-1")
    assert first is not None
    other = await open_replica()
    try:
        now = T + 30 * MIN
        got = await asyncio.gather(
            *(
                s.set_anchor("codex-pool", P5H.key, W, now + W, now, "codex-1")
                for s in (store, other, store, other)
            )
        )
        expected = Anchor(now + W, bucket_index(now, W, first) + 1, "codex-1")
        assert got == [expected] * 4
        assert await other.anchors("codex-pool") == {P5H.key: expected}
    finally:
        await other.close()


# -- parity ------------------------------------------------------------------------------------


async def _anchored_scenario(store: QuotaStore) -> list[Any]:
    """Admissions, records and re-anchors across the provider's reset, an early reset and an
    idle restart; what each step saw."""
    p = pool()
    log: list[Any] = []
    anchors: dict[str, Anchor] = {}

    async def reading(reset: int, now: int) -> None:
        got = await store.set_anchor(p.id, P5H.key, W, reset, now, "codex-1")
        if got is not None:
            anchors[P5H.key] = got
        log.append(("anchor", now, got))

    now = T
    await reading(R, now)
    for step in range(60):
        key = "ab"[step % 2]
        res = await store.admit(request(p, key, now, anchors, 3.0 + step % 4))
        log.append(
            (
                "admit",
                now,
                key,
                res.verdict,
                [(c.prev, c.curr) for c in res.totals],
                [(c.prev, c.curr) for c in res.mine],
            )
        )
        if res.verdict.outcome is not Outcome.BLOCK:
            await store.record(p.id, key, charge(6.5, anchors.get(P5H.key)), now)
        if step == 20:
            await reading(now + W, now)  # an early reset
        if step == 40:
            now = anchors[P5H.key].reset_ms + 70 * MIN  # idle past the reset
            await reading(now + W, now)
        now += 9 * MIN
    ref = CounterRef(P5H.key, W, anchors.get(P5H.key))
    final = await store.pool_usage(p.id, ["a", "b"], [ref], now)
    log.append(("final", {k: (c.prev, c.curr) for k, c in final.totals.items()}))
    return log


@pytest.mark.redis
async def test_parity_anchored_windows(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    from fairgate.store.redis.store import RedisQuotaStore

    sqlite_store = SqliteQuotaStore(tmp_path / "parity.sqlite")
    redis_store = RedisQuotaStore(redis_url, prefix=redis_prefix)
    try:
        s_log = await _anchored_scenario(sqlite_store)
        r_log = await _anchored_scenario(redis_store)
    finally:
        await sqlite_store.close()
        await redis_store.close()
    for s_entry, r_entry in zip(s_log, r_log, strict=True):
        assert s_entry == r_entry  # the first divergence, not a wall of diff
    outcomes = {e[3].outcome for e in s_log if e[0] == "admit"}
    assert outcomes == {Outcome.ALLOW, Outcome.BLOCK}  # the scenario blocks and admits again
    moved = [e[2] for e in s_log if e[0] == "anchor"]
    assert len({a.index for a in moved if a is not None}) == 3
