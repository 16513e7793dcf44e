"""Active share mode, demand-bounded water-filling: the pure rules behind the engine's refresh."""

from __future__ import annotations

import math

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import (
    NO_RESERVES,
    Presence,
    Reason,
    Waiting,
    active_fair_share,
    active_levels,
    catch_up_reserves,
    compile_checks,
    demand_bounds,
    demand_rate,
    long_budget_pace,
    note_presence,
    pace_reserves,
    reserve_fade,
    retry_after_ms,
    waiting_reserves,
    week_levels,
)
from fairgate.quota.model import Allocation, Dimension, Pool, ShareMode
from fairgate.quota.window import Count, bucket_index
from quota_support import make_pool

HOUR = 3_600_000
T = 1_700_002_800_000  # hour-aligned
DIM = "requests/hourly"


def _pool(
    *allocs: Allocation, limit: float = 300, dims: tuple[Dimension, ...] | None = None
) -> Pool:
    """An active pool of ``allocs``: ``limit`` requests an hour, or the dimensions ``dims``."""
    return make_pool(
        *(dims or (Dimension(Unit.REQUESTS, Window.HOURLY, limit),)),
        allocations=allocs,
        provider="mock",
        share_mode=ShareMode.ACTIVE,
    )


ABC = _pool(Allocation("a", 1), Allocation("b", 1), Allocation("c", 1))


def test_worked_example_satisfied_keys_leave_their_share_to_the_refused_one() -> None:
    # B and C used 50 each over the last hour (in the previous bucket, at the top of the hour)
    used = {k: {DIM: Count(prev=50, curr=0)} for k in ("b", "c")}
    used["a"] = {DIM: Count(prev=100, curr=0)}
    ages = dict.fromkeys("abc", 2 * HOUR)
    bounds = demand_bounds(ABC, ["a", "b", "c"], used, T, ages, pressed={"a"})
    assert bounds == {"b": {DIM: 50}, "c": {DIM: 50}}
    levels = active_levels(ABC, ["a", "b", "c"], bounds)
    assert levels[DIM] == 200  # A may use 200, not its plain 100
    assert active_fair_share(ABC, "a", ABC.dimensions[0], ["b", "c"], bounds) == 200
    # without bounds: the plain weighted shares
    assert active_levels(ABC, ["a", "b", "c"])[DIM] == 100


def test_a_pressed_key_is_unbounded_and_gets_its_max_min_share_back() -> None:
    used = {k: {DIM: Count(prev=50, curr=0)} for k in ("b", "c")}
    ages = dict.fromkeys("abc", 2 * HOUR)
    bounds = demand_bounds(ABC, ["a", "b", "c"], used, T, ages, pressed={"a", "b"})
    assert bounds == {"c": {DIM: 50}}
    assert active_levels(ABC, ["a", "b", "c"], bounds)[DIM] == 125


def test_bounds_never_lower_a_keys_own_share() -> None:
    # B is bounded at 50, but its own share is still λ × weight: it is never refused for
    # asking more than its estimate, only by the ceiling
    bounds = {"b": {DIM: 50.0}}
    assert active_fair_share(ABC, "b", ABC.dimensions[0], ["a", "c"], bounds) == 125


def test_a_cap_still_bounds_a_key_whose_estimate_is_higher() -> None:
    pool = _pool(Allocation("a", 1), Allocation("b", 1, cap_value=10, cap_unit=Unit.REQUESTS))
    assert active_levels(pool, ["a", "b"], {"b": {DIM: 80.0}})[DIM] == 290


def test_demand_rate_of_a_key_seen_for_a_whole_window_is_its_sliding_count() -> None:
    # at 10 minutes past: 60 × 5/6 + 10 = 60
    assert demand_rate(Count(60, 10), T + HOUR // 6, HOUR, 3 * HOUR) == pytest.approx(60)


def test_demand_rate_projects_a_young_key_over_the_window() -> None:
    # 10 requests in its first 10 minutes: 60 per hour, not 10
    assert demand_rate(Count(0, 10), T + HOUR // 6, HOUR, HOUR // 6) == pytest.approx(60)
    assert math.isinf(demand_rate(Count(0, 1), T + 1000, HOUR, 0))


def test_demand_rate_does_not_project_the_request_that_made_a_key_seen() -> None:
    # one request a minute old says nothing about the rate (it is why the key is seen): it
    # is bounded at what it used, not projected to 60 an hour; a second request 15 minutes
    # in projects one gap: 4 an hour
    assert demand_rate(Count(0, 1), T + 1000, HOUR, 60_000, first=1) == pytest.approx(1)
    assert math.isinf(demand_rate(Count(0, 1), T + 1000, HOUR, 0, first=1))  # seen for no time
    assert demand_rate(Count(0, 2), T + 1000, HOUR, HOUR // 4, first=1) == pytest.approx(4)
    # 31 requests in its first minute still project to a burst
    assert demand_rate(Count(0, 31), T + 1000, HOUR, 60_000, first=1) == pytest.approx(1800)
    # a key seen for a whole window: its sliding count, the first request included
    assert demand_rate(Count(0, 5), T + 1000, HOUR, 2 * HOUR, first=1) == pytest.approx(5)


def test_demand_bounds_leave_out_the_first_request_in_every_unit() -> None:
    # a young key with one request of 800 tokens is bounded at what it used in both units
    pool = _pool(
        Allocation("a", 1),
        Allocation("b", 1),
        dims=(
            Dimension(Unit.REQUESTS, Window.HOURLY, 300),
            Dimension(Unit.TOKENS, Window.HOURLY, 900_000),
        ),
    )
    req, tok = (d.key for d in pool.dimensions)
    used = {"a": {req: Count(0, 1), tok: Count(0, 800)}}
    bounds = demand_bounds(pool, ["a", "b"], used, T, {"a": 60_000})
    assert bounds == {"a": {req: pytest.approx(1), tok: pytest.approx(800)}}


def test_demand_rate_follows_a_falling_rate_within_the_bucket() -> None:
    # half past: 300 in the previous hour, 90 since the hour began → 180 per hour, not 240
    assert demand_rate(Count(300, 90), T + HOUR // 2, HOUR, 5 * HOUR) == pytest.approx(180)
    # earlier than a quarter in, the bucket is too short to judge: the sliding count stands
    assert demand_rate(Count(300, 10), T + HOUR // 10, HOUR, 5 * HOUR) == pytest.approx(280)


def test_keys_without_counts_or_allocation_are_left_unbounded() -> None:
    used = {"zz": {DIM: Count(0, 5)}, "b": {}}
    ages = {"zz": HOUR, "b": HOUR}
    assert demand_bounds(ABC, ["zz", "b"], used, T, ages) == {}


# -- room held for waiting keys (issue 17) ------------------------------------------------------


def test_reserve_worked_example_greedy_key_leaves_room_for_the_returning_one() -> None:
    # 300/hour, A (greedy) used 290, B came back and was refused having used 10; C used 100 and
    # was refused too. λ = 100 (all three pressed): B is owed 90, C is owed nothing.
    used = {
        "a": {DIM: Count(prev=0, curr=190)},
        "b": {DIM: Count(prev=0, curr=10)},
        "c": {DIM: Count(prev=0, curr=100)},
    }
    levels = {DIM: 100.0}
    r = waiting_reserves(Waiting(ABC, levels, ["a", "b", "c"], {"b", "c"}, used, T))
    assert r.for_key("a") == {DIM: 90}  # A (190 per weight) leaves B's 90
    assert r.for_key("c") == {DIM: 90}  # C is further along than B: it leaves B's 90 too
    assert r.for_key("b") == {DIM: 0}  # B leaves nothing: nobody waits further below
    assert r.for_key("newcomer") == {DIM: 90}  # unknown keys leave everything owed


def test_reserve_counts_only_keys_further_below_their_share_and_respects_caps() -> None:
    pool = _pool(Allocation("a", 1), Allocation("b", 1, cap_value=20, cap_unit=Unit.REQUESTS))
    used = {"a": {DIM: Count(prev=0, curr=50)}, "b": {DIM: Count(prev=0, curr=5)}}
    r = waiting_reserves(Waiting(pool, {DIM: 150.0}, ["a", "b"], {"a", "b"}, used, T))
    # b is owed only up to its cap (20 − 5), a is owed 100 but is further along than b
    assert r.for_key("a") == {DIM: 15}
    assert r.for_key("b") == {DIM: 0}


def test_reserve_fades_out_over_the_last_thirtieth_of_the_window() -> None:
    used = {"a": {DIM: Count(prev=0, curr=190)}, "b": {DIM: Count(prev=0, curr=10)}}
    one_min_left = T + HOUR - 60_000
    r = waiting_reserves(Waiting(ABC, {DIM: 100.0}, ["a", "b"], {"b"}, used, one_min_left))
    assert r.for_key("a")[DIM] == pytest.approx(45)  # half of B's 90, one of two minutes left
    assert reserve_fade(T + HOUR - 120_000, HOUR) == 1.0
    assert reserve_fade(T + HOUR - 1, HOUR) == pytest.approx(0, abs=1e-5)


def test_no_waiting_keys_no_reserve() -> None:
    used = {k: {DIM: Count(prev=0, curr=10)} for k in "abc"}
    assert (
        waiting_reserves(Waiting(ABC, {DIM: 100.0}, ["a", "b", "c"], set(), used, T)).default == {}
    )


# -- pacing after a quiet window (issue 17) ------------------------------------------------------


def test_pace_after_a_quiet_window_while_a_key_is_away() -> None:
    # a fresh pool (nothing in the previous bucket), 20 minutes in; A and B present, C away.
    # Static shares are 100 each; A used 150 (above), B used 40 (within).
    now = T + 20 * 60_000
    used = {"a": {DIM: Count(prev=0, curr=150)}, "b": {DIM: Count(prev=0, curr=40)}}
    totals = {DIM: Count(prev=0, curr=190)}
    r = pace_reserves(ABC, ["a", "b"], used, totals, now, 0.5, NO_RESERVES)
    # A leaves (300 − 0) × (1 − 20/60 − 1/12) = 175 free: its borrowing follows the pace
    assert r.for_key("a")[DIM] == pytest.approx(175)
    assert DIM not in r.for_key("b")  # within its static share: not paced
    # the line rises 5 a minute and reaches the limit at minute 55
    line = r.falls_for("a")[DIM]
    assert line.per_ms * 60_000 == pytest.approx(5)
    assert line.until_ms == T + 55 * 60_000
    assert DIM not in r.falls_for("b")
    # A, refused at 190, is told to come back when the line passes 191: 13.2 minutes on (the
    # total alone, with nothing in the previous bucket to fade, would say an hour)
    cost = {Unit.REQUESTS: 1.0}
    (check,) = compile_checks(ABC, ABC.allocations[0], cost, reserves=r.for_key("a"))
    total, mine = totals[DIM], used["a"][DIM]
    wait = retry_after_ms(check, Reason.FAIR_SHARE, total, mine, now, 0.5, line)
    assert wait == pytest.approx(66 / line.per_ms, abs=1)
    unpaced = retry_after_ms(check, Reason.FAIR_SHARE, total, mine, now, 0.5)
    assert unpaced is not None
    assert unpaced > 55 * 60_000


def test_no_pace_for_a_lone_key_or_after_a_busy_window() -> None:
    now = T + 20 * 60_000
    used = {k: {DIM: Count(prev=0, curr=150)} for k in "abc"}
    quiet = {DIM: Count(prev=0, curr=450)}
    # every key present is paced too (issue 45): a fresh pool is not handed to the fastest
    paced = pace_reserves(ABC, ["a", "b", "c"], used, quiet, now, 0.5, NO_RESERVES)
    assert paced.for_key("a")[DIM] == pytest.approx(300 * (1 - 1 / 3 - 1 / 12))
    # what a key borrowed in the quiet window before is no claim on this one
    borrowed = {"a": {DIM: Count(prev=140, curr=50)}, "b": {DIM: Count(prev=0, curr=50)}}
    quiet_before = {DIM: Count(prev=140, curr=100)}
    assert (
        pace_reserves(ABC, ["a", "b"], borrowed, quiet_before, now, 0.5, NO_RESERVES).for_key("a")
        == {}
    )
    busy = {DIM: Count(prev=200, curr=150)}  # 200 ≥ 0.5 × 300: the window itself paces
    assert pace_reserves(ABC, ["a", "b"], used, busy, now, 0.5, NO_RESERVES).for_key("a") == {}
    # a lone key may use the whole pool (SPEC), whoever else holds an allocation
    assert pace_reserves(ABC, ["a"], used, quiet, now, 0.5, NO_RESERVES) == NO_RESERVES


def test_reserve_is_only_what_the_waiting_key_lacks_to_catch_up() -> None:
    # 300/hour, λ = 150: A used 100 and B (waiting) 98. B is owed 52 of its share, but A is
    # only 2 ahead of it: A leaves 2 free, not 52. Keys served in turn at about the same level
    # (greedy keys) hold nothing back from each other, so the pool fills.
    pool = _pool(Allocation("a", 1), Allocation("b", 1))
    used = {"a": {DIM: Count(prev=0, curr=100)}, "b": {DIM: Count(prev=0, curr=98)}}
    r = waiting_reserves(Waiting(pool, {DIM: 150.0}, ["a", "b"], {"b"}, used, T))
    assert r.for_key("a")[DIM] == pytest.approx(2)
    assert r.for_key("b") == {DIM: 0}
    assert r.for_key("newcomer") == {DIM: 52}  # unknown keys still leave everything owed


def test_catch_up_reserves_sum_partly_and_fully_owed_keys() -> None:
    # waiting: x = use per weight, owed, weight. j1 at 0 owed 10 (weight 2: caught up at x = 5),
    # j2 at 4 owed 30 (weight 3: caught up at x = 14)
    owed = [(0.0, 10.0, 2.0), (4.0, 30.0, 3.0)]
    r = catch_up_reserves(owed, {"low": 0.0, "mid": 6.0, "high": 20.0, "zero-weight": math.inf})
    assert r["low"] == 0  # nobody behind it
    assert r["mid"] == pytest.approx(10 + 3 * (6 - 4))  # j1 in full, j2 up to level 6
    assert r["high"] == pytest.approx(40)  # both in full
    assert r["zero-weight"] == pytest.approx(40)


def test_a_key_ahead_leaves_at_least_the_request_a_waiting_key_was_refused_for() -> None:
    # the example above, B refused for a request of 12 (a large one): A, 2 ahead, must leave
    # room for that request, not the 2 it is ahead. Slivers of 2 would fit A's own small
    # requests for ever and never add up to B's 12.
    pool = _pool(Allocation("a", 1), Allocation("b", 1))
    used = {"a": {DIM: Count(prev=0, curr=100)}, "b": {DIM: Count(prev=0, curr=98)}}
    asks = {"b": {DIM: 12.0}}
    r = waiting_reserves(Waiting(pool, {DIM: 150.0}, ["a", "b"], {"b"}, used, T, asks=asks))
    assert r.for_key("a")[DIM] == pytest.approx(12)
    assert r.for_key("b") == {DIM: 0}  # nobody is behind B
    # never more than B is owed (52): a request of 80 holds 52
    big = waiting_reserves(
        Waiting(pool, {DIM: 150.0}, ["a", "b"], {"b"}, used, T, asks={"b": {DIM: 80}})
    )
    assert big.for_key("a")[DIM] == pytest.approx(52)


def test_catch_up_with_lumps_is_flat_then_rising_then_full() -> None:
    # j at x = 0, owed 10, weight 2, refused for 4: a key at x holds min(10, max(4, 2x)) for
    # x > 0 (4 up to x = 2, then rising to 10 at x = 5), nothing at or below 0
    owed = [(0.0, 10.0, 2.0)]
    xs = {"at": 0.0, "just-ahead": 0.5, "edge": 2.0, "rising": 3.0, "far": 9.0}
    r = catch_up_reserves(owed, xs, [4.0])
    assert r == pytest.approx({"at": 0, "just-ahead": 4, "edge": 4, "rising": 6, "far": 10})
    # a lump at least what is owed holds what is owed from the start; no lump is the plain rule
    assert catch_up_reserves(owed, xs, [50.0])["just-ahead"] == pytest.approx(10)
    assert catch_up_reserves(owed, xs, [0.0]) == catch_up_reserves(owed, xs)


# -- a paced week's level across its 5-hour windows (issue 45) ---------------------------------

H = 3_600_000
WEEK_T0 = 840 * H * 2_000  # a week and a 5-hour window begin together


def test_note_presence_counts_each_shorter_window_once_and_starts_over_each_week() -> None:
    end = WEEK_T0 + 168 * H
    p = note_presence(None, end, 10)
    assert note_presence(p, end, 10) == p
    assert note_presence(note_presence(p, end, 11), end, 13) == Presence(end, 10, 13, 3)
    assert note_presence(p, end + 168 * H, 50) == Presence(end + 168 * H, 50, 50, 1)


def test_week_levels_keep_room_for_a_key_that_comes_once_a_day() -> None:
    # 25 hours into the week (window 5 of 5-hour windows just begun), 750 used: 4,250 left over
    # the 143 hours to come, 148.6 a window. The batch key was seen in 1 window of 6: it is
    # expected in a sixth of the windows to come, so the steady keys are held at the level
    # that leaves it its share of those, not at the even pace's split of the window's 148.6
    pool = _pool(
        Allocation("a", 35),
        Allocation("b", 35),
        Allocation("batch", 30),
        dims=(
            Dimension(Unit.REQUESTS, Window.FIVE_HOURS, 250),
            Dimension(Unit.REQUESTS, Window.WEEKLY, 5000),
        ),
    )
    short, week = (d.key for d in pool.dimensions)
    now = WEEK_T0 + 25 * H
    totals = {short: Count(150, 0), week: Count(0, 750)}
    pace = long_budget_pace(pool, totals, now)
    assert pace.shorter == {week: (short,)}
    end = WEEK_T0 + 168 * H
    first = bucket_index(WEEK_T0, 5 * H)
    seen = {
        "a": Presence(end, first, first + 5, 6),
        "b": Presence(end, first, first + 5, 6),
        "batch": Presence(end, first, first, 1),
    }
    budget = 4250 * 5 / 143
    level = week_levels(pool, pace, totals, now, {week: seen})
    assert level[short] == pytest.approx(budget / (35 + 35 + 30 / 6))
    # a steady key bounded by its demand leaves the rest to the others
    bounded = week_levels(pool, pace, totals, now, {week: seen}, {"b": {short: 20.0}})
    assert bounded[short] == pytest.approx((budget - 20) / (35 + 30 / 6))
    # nobody seen this week (a new week began): no level
    assert week_levels(pool, pace, totals, now, {week: {}}) == {short: math.inf}
