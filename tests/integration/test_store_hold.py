"""The store contract of ``admission: hold`` (issue 45, item 1), on every driver and across
replicas: the queue lives beside the counters, an admission that would jump it is refused in
the same atomic step, and a held request holds nothing but its place (no reservation)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import Outcome, Reason, compile_checks
from fairgate.quota.hold import HoldTicket, QueueFull
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import AdmitRequest, AdmitResult, CounterRef, QuotaStore
from fairgate.quota.window import Count

T0 = 1_700_002_800_000
LIMIT = 4
POOL = Pool(
    id="held",
    name="held",
    provider="kimi",
    connections=("conn-1",),
    dimensions=(Dimension(Unit.REQUESTS, Window.HOURLY, LIMIT),),
    allocations=tuple(Allocation(k, 100 / 3, policy=Policy.HARD) for k in ("a", "b", "c")),
)


def _hold(wid: str, enq: int = T0, *, per_key: int = 8, per_pool: int = 16) -> HoldTicket:
    return HoldTicket(wid, enq, enq + 30_000, 100 / 3, per_key, per_pool)


async def _admit(
    store: QuotaStore, key: str, now: int, hold: HoldTicket | None = None, rid: str = ""
) -> AdmitResult:
    alloc = POOL.allocation(key)
    assert alloc is not None
    checks = compile_checks(POOL, alloc, {Unit.REQUESTS: 1.0})
    req = AdmitRequest(
        pool_id=POOL.id,
        key_id=key,
        checks=checks,
        policy=alloc.policy,
        threshold=1.0,  # generous up to the limit: only the pool's room and the queue refuse
        reservation_id=rid or uuid.uuid4().hex,
        now_ms=now,
    )
    return await store.admit(dataclasses.replace(req, hold=hold))


async def _fill(store: QuotaStore, now: int) -> list[str]:
    """a takes 1, b takes 3: the pool is full; the reservation ids of b's."""
    assert (await _admit(store, "a", now)).reserved
    rids = []
    for _ in range(3):
        rid = uuid.uuid4().hex
        assert (await _admit(store, "b", now, rid=rid)).reserved
        rids.append(rid)
    return rids


async def _pool_total(store: QuotaStore, now: int) -> float:
    d = POOL.dimensions[0]
    counts = await store.pool_usage(POOL.id, [], [CounterRef(d.key, d.window_ms)], now)
    total: Count = counts.totals[d.key]
    return total.value(now, d.window_ms)


async def test_a_request_that_does_not_fit_waits_and_freed_room_is_held_for_it(
    store: QuotaStore,
) -> None:
    b_rids = await _fill(store, T0)
    held = await _admit(store, "a", T0 + 1, _hold("a-1", T0 + 1))
    assert held.verdict.outcome is Outcome.BLOCK
    assert held.verdict.reason is Reason.GLOBAL_SATURATED
    assert held.waiting
    assert not held.reserved
    assert await _pool_total(store, T0 + 1) == LIMIT  # waiting reserved nothing
    [w] = await store.waiters(POOL.id, T0 + 1)
    assert (w.waiter_id, w.key_id, w.owed) == ("a-1", "a", True)

    assert await store.release(POOL.id, b_rids[0], T0 + 2)  # room frees
    # b, above a's share, may not take it: refused atomically, and queued behind a
    jump = await _admit(store, "b", T0 + 3, _hold("b-9", T0 + 3))
    assert jump.verdict.outcome is Outcome.BLOCK
    assert jump.verdict.reason is Reason.GLOBAL_SATURATED
    assert jump.waiting
    # a's next attempt takes it and leaves the queue
    got = await _admit(store, "a", T0 + 4, _hold("a-1", T0 + 1))
    assert got.reserved
    assert not got.waiting
    assert [w.waiter_id for w in await store.waiters(POOL.id, T0 + 4)] == ["b-9"]


async def test_a_key_below_the_waiting_keys_share_goes_first(store: QuotaStore) -> None:
    b_rids = await _fill(store, T0)
    assert (await _admit(store, "a", T0 + 1, _hold("a-1", T0 + 1))).waiting
    await store.release(POOL.id, b_rids[0], T0 + 2)
    # c has used nothing: its dominant share is below a's, so it is first
    c = await _admit(store, "c", T0 + 3, _hold("c-1", T0 + 3))
    assert c.reserved
    # a keeps waiting (nothing freed for it yet)
    assert [w.waiter_id for w in await store.waiters(POOL.id, T0 + 3)] == ["a-1"]


async def test_a_waiter_that_leaves_or_runs_out_of_patience_holds_nothing(
    store: QuotaStore,
) -> None:
    b_rids = await _fill(store, T0)
    assert (await _admit(store, "a", T0 + 1, _hold("a-1", T0 + 1))).waiting
    await store.release(POOL.id, b_rids[0], T0 + 2)
    assert await store.leave(POOL.id, "a-1")  # its client went away
    assert not await store.leave(POOL.id, "a-1")
    assert await store.waiters(POOL.id, T0 + 2) == []
    assert (await _admit(store, "b", T0 + 3, _hold("b-1", T0 + 3))).reserved
    # patience: a waiter past its deadline no longer holds room
    await store.release(POOL.id, b_rids[1], T0 + 4)
    assert (await _admit(store, "a", T0 + 5, _hold("a-2", T0 + 5))).reserved
    await store.release(POOL.id, b_rids[2], T0 + 6)
    late = _hold("a-3", T0 + 6)
    assert (await _admit(store, "a", T0 + 6, _hold("a-9", T0 + 6))).reserved
    assert (await _admit(store, "a", T0 + 7, late)).waiting
    after = late.deadline_ms
    assert await store.waiters(POOL.id, after) == []


async def test_queue_limits_refuse_at_once(store: QuotaStore) -> None:
    await _fill(store, T0)
    assert (await _admit(store, "a", T0 + 1, _hold("a-1", T0 + 1, per_key=1))).waiting
    second = await _admit(store, "a", T0 + 2, _hold("a-2", T0 + 2, per_key=1))
    assert second.verdict.outcome is Outcome.BLOCK
    assert not second.waiting
    assert second.queue_full is QueueFull.KEY
    pool_full = await _admit(store, "c", T0 + 3, _hold("c-1", T0 + 3, per_pool=1))
    assert pool_full.queue_full is QueueFull.POOL
    assert [w.waiter_id for w in await store.waiters(POOL.id, T0 + 3)] == ["a-1"]


async def test_the_queue_is_the_same_on_every_replica(
    store: QuotaStore, open_replica: Callable[[], Awaitable[QuotaStore]]
) -> None:
    other = await open_replica()
    try:
        b_rids = await _fill(store, T0)
        assert (await _admit(store, "a", T0 + 1, _hold("a-1", T0 + 1))).waiting
        await other.release(POOL.id, b_rids[0], T0 + 2)
        # the other replica sees the waiter and refuses b's jump
        jump = await _admit(other, "b", T0 + 3, _hold("b-1", T0 + 3))
        assert jump.verdict.outcome is Outcome.BLOCK
        assert jump.waiting
        # and a is admitted there too, on its next attempt
        assert (await _admit(other, "a", T0 + 4, _hold("a-1", T0 + 1))).reserved
        assert [w.waiter_id for w in await store.waiters(POOL.id, T0 + 4)] == ["b-1"]
    finally:
        await other.close()


async def test_without_hold_nothing_waits(store: QuotaStore) -> None:
    await _fill(store, T0)
    refused = await _admit(store, "a", T0 + 1)
    assert refused.verdict.outcome is Outcome.BLOCK
    assert not refused.waiting
    assert await store.waiters(POOL.id, T0 + 1) == []
