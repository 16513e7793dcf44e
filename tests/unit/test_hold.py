"""The pure rule of ``admission: hold`` (issue 45, item 1): who is next, who may not jump."""

from __future__ import annotations

import math

from fairgate.quota.hold import (
    HoldTicket,
    QueueFull,
    Waiter,
    dominant_share,
    hold_step,
    jumps_queue,
    live,
    next_waiter,
    queue_full,
)

NOW = 1_000_000


def _w(wid: str, key: str, share: float, enq: int = 0, owed: bool = True) -> Waiter:
    return Waiter(wid, key, NOW + enq, NOW + 60_000, share, owed)


def _hold(wid: str, enq: int = 0, per_key: int = 4, per_pool: int = 8) -> HoldTicket:
    return HoldTicket(wid, NOW + enq, NOW + 60_000, 50.0, per_key, per_pool)


def _ahead(ws: list[Waiter], key: str, share: float, hold: HoldTicket, now: int) -> str:
    """The id of the waiter a newcomer (``key`` at ``share``) may not jump; the test fails if
    the newcomer may go."""
    ahead = jumps_queue(ws, key, share, hold, now)
    assert ahead is not None
    return ahead.waiter_id


def test_dominant_share_is_the_largest_use_per_weight() -> None:
    # 30 of 100 requests, 500 of 1000 tokens: tokens dominate; per 50 % of weight
    assert dominant_share([(30, 100), (500, 1000)], 50.0) == 0.5 / 50
    assert dominant_share([(5, 0)], 10.0) == 0.0  # an unknown limit counts nothing
    assert dominant_share([(1, 10)], 0.0) == math.inf  # weight 0: after everyone


def test_least_share_first_then_oldest() -> None:
    ws = [_w("a1", "a", 0.4, 0), _w("b1", "b", 0.2, 5), _w("b2", "b", 0.2, 9)]
    first = next_waiter(ws, NOW + 10)
    assert first is not None
    assert first.waiter_id == "b1"
    # equal shares: the oldest request
    ws = [_w("a1", "a", 0.2, 3), _w("b1", "b", 0.2, 1)]
    first = next_waiter(ws, NOW + 10)
    assert first is not None
    assert first.waiter_id == "b1"


def test_a_waiter_owed_nothing_holds_no_room() -> None:
    ws = [_w("a1", "a", 0.1, 0, owed=False), _w("b1", "b", 0.3, 1)]
    first = next_waiter(ws, NOW + 10)
    assert first is not None
    assert first.waiter_id == "b1"
    # and a newcomer of a third key above a's share is not stopped by it
    assert jumps_queue(ws[:1], "c", 0.5, _hold("c1", 20), NOW + 20) is None


def test_a_newcomer_above_a_waiting_keys_share_may_not_take_the_room() -> None:
    ws = [_w("a1", "a", 0.1, 0)]
    assert _ahead(ws, "b", 0.3, _hold("b9", 20), NOW + 20) == "a1"
    # below the waiting key's share, the newcomer is first: it may
    assert jumps_queue(ws, "c", 0.05, _hold("c9", 20), NOW + 20) is None


def test_within_a_key_only_age_counts() -> None:
    # the waiter's share is stale (0.9); the key's share now is 0.1: the older request of the
    # same key still goes first
    ws = [_w("a1", "a", 0.9, 0)]
    assert _ahead(ws, "a", 0.1, _hold("a2", 5), NOW + 5) == "a1"
    # and the waiter itself is never ahead of itself
    assert jumps_queue(ws, "a", 0.1, _hold("a1", 0), NOW + 5) is None


def test_a_waiter_out_of_patience_counts_for_nothing() -> None:
    ws = [Waiter("a1", "a", NOW, NOW + 100, 0.0)]
    assert live(ws, NOW + 99) == ws
    assert live(ws, NOW + 100) == []  # a deadline at now has passed
    assert jumps_queue(ws, "b", 0.5, _hold("b1", 200), NOW + 100) is None
    assert next_waiter(ws, NOW + 100) is None


def test_queue_limits() -> None:
    ws = [_w(f"a{i}", "a", 0.1, i) for i in range(4)] + [_w(f"b{i}", "b", 0.1, i) for i in range(3)]
    assert queue_full(ws, "a", _hold("a9", 20), NOW + 20) is QueueFull.KEY
    assert queue_full(ws, "b", _hold("b9", 20), NOW + 20) is None
    # a waiter already queued counts itself out
    assert queue_full(ws, "a", _hold("a3", 3), NOW + 20) is None
    assert queue_full([*ws, _w("c1", "c", 0.1)], "b", _hold("b9", 20), NOW + 20) is QueueFull.POOL


def test_hold_step_admits_the_first_and_queues_the_jumper() -> None:
    ws = [_w("a1", "a", 0.1, 0)]
    # the decision allows b (above a's share): refused as a jump, queued as owed
    step = hold_step(
        ws, "b", 0.3, _hold("b1", 5), NOW + 5, allowed=True, owed=False, holdable=False
    )
    assert step.blocked
    assert step.jumped == ws[0]
    assert step.join
    assert step.owed
    # a itself is admitted (and leaves the queue: not join)
    step = hold_step(ws, "a", 0.1, _hold("a1", 0), NOW + 5, allowed=True, owed=False, holdable=True)
    assert not step.blocked
    assert not step.join


def test_hold_step_of_a_refusal() -> None:
    # the pool is full: held as owed
    step = hold_step([], "a", 0.1, _hold("a1"), NOW, allowed=False, owed=True, holdable=True)
    assert step.join
    assert step.owed
    # past its own share: held, owed nothing
    step = hold_step([], "a", 0.9, _hold("a1"), NOW, allowed=False, owed=False, holdable=True)
    assert step.join
    assert not step.owed
    # a cap: refused at once, out of the queue
    step = hold_step([], "a", 0.1, _hold("a1"), NOW, allowed=False, owed=False, holdable=False)
    assert not step.join
    # out of patience
    late = NOW + 60_000
    step = hold_step([], "a", 0.1, _hold("a1"), late, allowed=False, owed=True, holdable=True)
    assert not step.join
    # the key's queue is full
    ws = [_w(f"a{i}", "a", 0.1, i) for i in range(4)]
    step = hold_step(ws, "a", 0.1, _hold("a9", 9), NOW, allowed=False, owed=True, holdable=True)
    assert step.full is QueueFull.KEY
    assert not step.join
