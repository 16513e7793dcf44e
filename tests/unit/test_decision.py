"""The fair-share rule of SPEC §3, case by case: every policy × mode × cap and the edges."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import (
    NO_PACE,
    NO_RESERVES,
    DimensionCheck,
    Outcome,
    Reason,
    Reserves,
    Waiting,
    active_fair_share,
    active_levels,
    check_plan,
    compile_checks,
    dominant_levels,
    dominant_waiting_reserves,
    evaluate,
    long_budget_pace,
    retry_after_ms,
    standing,
    static_fair_share,
    waiting_reserves,
    water_fill_level,
    with_pace,
)
from fairgate.quota.model import (
    Allocation,
    Dimension,
    LimitBasis,
    ModelCap,
    Policy,
    Pool,
    ShareMode,
    pool_limits,
)
from fairgate.quota.window import Anchor, Count, ms_until_at_most
from quota_support import make_pool

H, S, B = Policy.HARD, Policy.SOFT, Policy.BURST
ALLOW, PEN, BLOCK = Outcome.ALLOW, Outcome.PENALIZE, Outcome.BLOCK
CAP, SAT, FAIR = Reason.CAP_ABSOLUTE, Reason.GLOBAL_SATURATED, Reason.FAIR_SHARE


def chk(
    *,
    limit: float = 100,
    fair: float = 50,
    cap: float | None = None,
    cost: float = 1,
    signal: float = 0.0,
    scope: str = "pool",
    reserve: float = 0.0,
) -> DimensionCheck:
    return DimensionCheck(
        "requests/hourly", Unit.REQUESTS, 3_600_000, limit, fair, cap, cost, signal, scope, reserve
    )


# (case id, check kwargs, (total, mine), policy, expected outcome, expected reason)
TABLE = [
    # generous mode (pool below 50 %): borrowing allowed
    ("generous hard under share", {}, (30, 10), H, ALLOW, None),
    ("generous hard over share borrows", {"fair": 20}, (40, 30), H, ALLOW, None),
    ("generous soft over share penalised", {"fair": 20}, (40, 30), S, PEN, None),
    ("generous soft at share penalised (>=)", {"fair": 20}, (40, 20), S, PEN, None),
    ("generous soft under share", {"fair": 20}, (40, 19.99), S, ALLOW, None),
    ("generous burst over share", {"fair": 20}, (40, 30), B, ALLOW, None),
    ("generous hard own use >= limit (drift edge)", {}, (40, 100), H, BLOCK, SAT),
    # strict mode (pool at or above 50 %)
    ("strict starts at exactly the threshold", {}, (50, 50), H, BLOCK, FAIR),
    ("strict hard at share blocks (>=)", {}, (60, 50), H, BLOCK, FAIR),
    ("strict hard just under share", {}, (60, 49.99), H, ALLOW, None),
    ("strict soft at share penalised", {}, (60, 50), S, PEN, None),
    ("strict soft under share", {}, (60, 10), S, ALLOW, None),
    ("strict burst over share passes", {}, (90, 80), B, ALLOW, None),
    ("provider signal makes strict", {"signal": 0.8}, (10, 50), H, BLOCK, FAIR),
    ("provider signal below threshold", {"signal": 0.3}, (10, 50), H, ALLOW, None),
    # ceiling: every policy
    ("ceiling total >= limit hard", {}, (100, 0), H, BLOCK, SAT),
    ("ceiling total >= limit soft", {}, (100, 0), S, BLOCK, SAT),
    ("ceiling total >= limit burst", {}, (100, 0), B, BLOCK, SAT),
    ("ceiling total + cost > limit", {}, (99.5, 0), B, BLOCK, SAT),
    ("ceiling total + cost == limit passes", {}, (99, 0), B, ALLOW, None),
    ("big request over remaining", {"cost": 30}, (80, 0), B, BLOCK, SAT),
    # absolute cap: before everything, any mode, any policy
    ("cap reached generous burst", {"cap": 10}, (20, 10), B, BLOCK, CAP),
    ("cap reached strict soft", {"cap": 10}, (80, 10), S, BLOCK, CAP),
    ("cap just under", {"cap": 10}, (20, 9.99), B, ALLOW, None),
    ("cap wins over ceiling", {"cap": 10}, (100, 10), H, BLOCK, CAP),
    # room held for waiting keys (active mode): total + cost + reserve must fit, whatever the
    # key's own count, in either mode; the ceiling and the cap come first
    ("reserve blocks hard under its share", {"reserve": 10}, (90, 10), H, BLOCK, FAIR),
    ("reserve exactly fits", {"reserve": 9}, (90, 10), H, ALLOW, None),
    ("reserve in generous mode", {"reserve": 70}, (40, 0), H, BLOCK, FAIR),
    # ... and soft and burst keys never take it either (issue 45): they wait behind the keys
    # it is held for, the room outside it is theirs as before
    ("reserve blocks soft", {"reserve": 10}, (90, 10), S, BLOCK, FAIR),
    ("reserve blocks burst", {"reserve": 10}, (90, 10), B, BLOCK, FAIR),
    ("reserve leaves burst the rest", {"reserve": 9}, (90, 80), B, ALLOW, None),
    ("reserve leaves soft the rest, penalised", {"reserve": 9}, (90, 80), S, PEN, None),
    ("ceiling before reserve", {"reserve": 10}, (100, 0), H, BLOCK, SAT),
    ("cap before reserve", {"cap": 5, "reserve": 10}, (90, 5), H, BLOCK, CAP),
]


@pytest.mark.parametrize(
    ("kw", "values", "policy", "outcome", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_rule_table(
    kw: dict[str, float],
    values: tuple[float, float],
    policy: Policy,
    outcome: Outcome,
    reason: Reason | None,
) -> None:
    v = evaluate([chk(**kw)], [(*values, values[1])], policy, 0.5)
    assert (v.outcome, v.reason) == (outcome, reason)
    assert v.index == (0 if outcome is BLOCK else None)


def test_first_blocking_dimension_wins_and_penalty_does_not_mask_a_block() -> None:
    a, b = chk(fair=20), chk(limit=10, fair=5)
    v = evaluate([a, b], [(40, 30, 30), (10, 0, 0)], S, 0.5)
    assert (v.outcome, v.reason, v.index) == (BLOCK, SAT, 1)
    v = evaluate([chk(), chk(cap=3)], [(60, 50, 50), (60, 3, 3)], H, 0.5)
    assert (v.reason, v.index) == (FAIR, 0)
    v = evaluate([a, chk()], [(40, 30, 30), (10, 1, 1)], S, 0.5)
    assert v.outcome is PEN


def test_model_scope_blocks_on_own_count_only() -> None:
    m = chk(limit=5, fair=5, scope="model")
    assert evaluate([m], [(0, 5, 5)], B, 0.5).reason is Reason.MODEL_CAP
    assert evaluate([m], [(1000, 4, 4)], B, 0.5).outcome is ALLOW


def test_unknown_policy_is_hard() -> None:
    assert Policy.parse("greedy") is H
    assert Policy.parse(None) is H
    assert Policy.parse(" Soft ") is S
    assert Policy.parse("burst") is B


def _pool(
    allocs: tuple[Allocation, ...],
    dims: tuple[Dimension, ...] | None = None,
    members: int = 1,
    mode: ShareMode = ShareMode.STATIC,
) -> Pool:
    return make_pool(
        *(dims or (Dimension(Unit.REQUESTS, Window.HOURLY, 100),)),
        allocations=allocs,
        connections=tuple(f"c{i}" for i in range(members)),
        share_mode=mode,
    )


def test_all_zero_weights_split_equally() -> None:
    pool = _pool((Allocation("a", 0), Allocation("b", 0), Allocation("c", 0)))
    dim = pool.dimensions[0]
    assert static_fair_share(pool, "a", dim) == pytest.approx(100 / 3)


def test_weights_need_not_sum_to_100_and_zero_weight_key_gets_nothing() -> None:
    pool = _pool((Allocation("a", 80), Allocation("b", 80), Allocation("z", 0)))
    dim = pool.dimensions[0]
    assert static_fair_share(pool, "a", dim) == 80
    assert static_fair_share(pool, "z", dim) == 0
    assert static_fair_share(pool, "stranger", dim) == 0


def test_a_pools_own_limit_is_enforced_as_written_whatever_its_members() -> None:
    """Issue 48, item 3: ``limit: 100`` on a three-connection pool admits 100, not 300."""
    pool = _pool((Allocation("a", 50),), members=3)
    (c,) = compile_checks(pool, pool.allocations[0], {Unit.REQUESTS: 1})
    assert (c.limit, c.fair_share) == (100, 50)
    assert pool.basis(pool.dimensions[0]) is LimitBasis.POOL


def test_a_plans_limit_and_a_percent_are_per_connection() -> None:
    """A plan is one account's (catalogue or override), and a percent is of one account's
    window: the pool enforces them once per member, multiplied once where it is resolved."""
    req = Dimension(Unit.REQUESTS, Window.HOURLY, 100)
    pct = Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100)
    dims, per = pool_limits((req,), from_plan=True, members=3)
    assert [d.limit for d in dims] == [300]
    assert per == {req.key}
    dims, per = pool_limits((req, pct), from_plan=False, members=3)
    assert [d.limit for d in dims] == [100, 300]
    assert per == {pct.key}
    pool = dataclasses.replace(
        _pool((Allocation("a", 50),), dims=dims, members=3), per_connection=per
    )
    checks = compile_checks(pool, pool.allocations[0], {Unit.REQUESTS: 1, Unit.PERCENT: 1})
    assert [(c.limit, c.fair_share) for c in checks] == [(100, 50), (300, 150)]
    assert [pool.written_limit(d) for d in pool.dimensions] == [100, 100]


def test_unknown_limit_dimensions_are_skipped_and_cap_only_on_its_unit() -> None:
    dims = (
        Dimension(Unit.TOKENS, Window.FIVE_HOURS, 0),  # unknown → never enforced
        Dimension(Unit.REQUESTS, Window.HOURLY, 100),
        Dimension(Unit.TOKENS, Window.WEEKLY, 1e6),
    )
    alloc = Allocation("a", 50, cap_value=1000, cap_unit=Unit.TOKENS)
    pool = _pool((alloc,), dims)
    checks = compile_checks(pool, alloc, {Unit.REQUESTS: 1, Unit.TOKENS: 400})
    assert [c.key for c in checks] == ["requests/hourly", "tokens/weekly"]
    assert [c.cap for c in checks] == [None, 1000]
    assert [c.cost for c in checks] == [1, 400]


def test_non_positive_cap_is_no_cap() -> None:
    assert Allocation("a", cap_value=0, cap_unit=Unit.REQUESTS).cap_for(Unit.REQUESTS) is None


def test_model_caps_compile_only_for_that_model() -> None:
    alloc = Allocation("a", 50, model_caps=(ModelCap("gpt-x", Unit.REQUESTS, 5),))
    pool = _pool((alloc,))
    assert len(compile_checks(pool, alloc, {Unit.REQUESTS: 1}, model="other")) == 1
    checks = compile_checks(pool, alloc, {Unit.REQUESTS: 1}, model="gpt-x")
    assert checks[-1].scope == "model"
    assert checks[-1].key == "model:gpt-x:requests/hourly"


def test_signal_is_passed_per_dimension() -> None:
    pool = _pool((Allocation("a", 50),))
    (c,) = compile_checks(pool, pool.allocations[0], {}, signals={"requests/hourly": 0.9})
    assert c.signal == 0.9
    assert c.cost == 0


# -- active mode: weighted water-filling ------------------------------------------------------


def test_water_fill_level_examples() -> None:
    # two unbounded members of weight 1 and 3 share 100: level 25 → 25 and 75
    assert water_fill_level(100, [(1, None), (3, None)]) == 25
    # a member bounded at 10 (its cap) leaves 90 for the other
    assert water_fill_level(100, [(1, 10), (1, None)]) == 90
    # everyone bounded and it fits: no constraint
    assert math.isinf(water_fill_level(100, [(1, 10), (1, 20)]))
    assert math.isinf(water_fill_level(100, []))


def test_active_share_lone_key_gets_whole_pool() -> None:
    pool = _pool(
        (Allocation("a", 20), Allocation("b", 50), Allocation("c", 30)), mode=ShareMode.ACTIVE
    )
    dim = pool.dimensions[0]
    assert active_fair_share(pool, "a", dim, []) == 100
    assert active_fair_share(pool, "a", dim, ["b"]) == pytest.approx(100 * 20 / 70)
    assert active_fair_share(pool, "a", dim, ["a", "b", "c"]) == pytest.approx(20)


def test_active_share_redistributes_a_capped_keys_surplus() -> None:
    pool = _pool(
        (Allocation("a", 50), Allocation("b", 50, cap_value=10, cap_unit=Unit.REQUESTS)),
        mode=ShareMode.ACTIVE,
    )
    assert active_fair_share(pool, "a", pool.dimensions[0], ["b"]) == 90


# -- retry_after --------------------------------------------------------------------------------

HOUR = 3_600_000
T = 1_700_002_800_000  # hour-aligned


def test_retry_after_ceiling_waits_for_prev_bucket_to_fade() -> None:
    c = chk()
    # at the start of a bucket: 100 in prev, 0 in curr → value 100; needs <= 99 → 1 % of an hour
    wait = retry_after_ms(c, SAT, Count(100, 0), Count(0, 0), T, 0.5)
    assert wait == pytest.approx(HOUR * 0.01, abs=2)


def test_retry_after_fair_share_is_the_earlier_of_own_decay_and_leaving_strict() -> None:
    c = chk(fair=20)
    now = T + HOUR // 2  # half way through the hour; everything is in the current bucket
    # key at 55 (share 20) would fade below 20 only at W/2 + W × (1 - 20/55) ...
    # ... but the pool (60) leaves strict mode (< 50) sooner: W/2 + W/6
    wait = retry_after_ms(c, FAIR, Count(0, 60), Count(0, 55), now, 0.5)
    assert wait == pytest.approx(HOUR / 2 + HOUR / 6, abs=2)
    # a key just at its share is free again as soon as its count starts to fade
    c2 = chk(fair=50)
    wait2 = retry_after_ms(c2, FAIR, Count(0, 90), Count(0, 50), now, 0.5)
    assert wait2 == pytest.approx(HOUR / 2, abs=2)


def test_retry_after_reserve_waits_for_room_beyond_it() -> None:
    c = chk(reserve=10)
    # 100 in prev at the top of the hour: room for cost 1 + reserve 10 once it fades to 89
    wait = retry_after_ms(c, FAIR, Count(100, 0), Count(0, 5), T, 0.5)
    assert wait == pytest.approx(HOUR * 0.11, abs=2)


def test_retry_after_cap_uses_own_count() -> None:
    c = chk(cap=10)
    wait = retry_after_ms(c, CAP, Count(0, 90), Count(20, 0), T + HOUR // 4, 0.5)
    # 20 × (1 - e/W) < 10 → e > W/2, we are at W/4 → W/4 more
    assert wait == pytest.approx(HOUR / 4, abs=2)


# -- dominant-resource fairness (issue 18) ------------------------------------------------------

_RPM_TPM = (
    Dimension(Unit.REQUESTS, Window.HOURLY, 100),
    Dimension(Unit.TOKENS, Window.HOURLY, 100_000),
)


def _two_keys() -> Pool:
    return _pool((Allocation("a", 50), Allocation("b", 50)), _RPM_TPM, mode=ShareMode.ACTIVE)


def _use(requests: float, tokens: float) -> dict[str, Count]:
    return {_RPM_TPM[0].key: Count(0.0, requests), _RPM_TPM[1].key: Count(0.0, tokens)}


def test_dominant_levels_worked_example() -> None:
    # chat key a (500 tokens a request), research key b (10,000), both pressed: tokens fill
    # at a dominant share of 2/3 each, so a may hold 66.7 requests and b 66,667 tokens
    pool = _two_keys()
    used = {"a": _use(40, 20_000), "b": _use(4, 40_000)}
    levels = dominant_levels(pool, ["a", "b"], None, used, 0)
    assert levels[_RPM_TPM[0].key] * 50 == pytest.approx(200 / 3)
    assert levels[_RPM_TPM[1].key] * 50 == pytest.approx(200_000 / 3)
    # per dimension on its own each would be held at half of each dimension
    plain = active_levels(pool, ["a", "b"])
    assert plain[_RPM_TPM[0].key] * 50 == pytest.approx(50)
    checks = compile_checks(
        pool, pool.allocations[0], {Unit.REQUESTS: 1, Unit.TOKENS: 500}, levels=levels
    )
    # strict (80 % of tokens used): a passes at 66 requests, is held at 67 (its dominant share)
    passed = evaluate(checks, [(66, 66, 66), (80_000, 33_000, 33_000)], H, 0.5)
    assert passed.outcome is Outcome.ALLOW
    verdict = evaluate(checks, [(67, 67, 67), (80_000, 33_500, 33_500)], H, 0.5)
    assert (verdict.outcome, verdict.reason, verdict.index) == (Outcome.BLOCK, Reason.FAIR_SHARE, 0)


def test_dominant_levels_leave_a_satisfied_key_its_demand() -> None:
    # b wants 10 requests and 20,000 tokens an hour (dominant share 0.2, profile 0.5 / 1); a
    # uses half a token share per request share: requests fill when a holds 0.9 (+ b's 0.1),
    # while tokens are at 0.45 + 0.2
    pool = _two_keys()
    demand = {"b": {_RPM_TPM[0].key: 10.0, _RPM_TPM[1].key: 20_000.0}}
    levels = dominant_levels(pool, ["a", "b"], demand, {"a": _use(50, 25_000)}, 0)
    assert levels[_RPM_TPM[0].key] * 50 == pytest.approx(90)
    assert levels[_RPM_TPM[1].key] * 50 == pytest.approx(90_000)


def test_dominant_levels_of_one_dimension_are_the_water_filling_levels() -> None:
    pool = _pool((Allocation("a", 60), Allocation("b", 40)), mode=ShareMode.ACTIVE)
    demand = {"b": {pool.dimensions[0].key: 10.0}}
    assert dominant_levels(pool, ["a", "b"], demand) == active_levels(pool, ["a", "b"], demand)


def test_dominant_levels_without_use_are_the_plain_weighted_shares() -> None:
    # nothing known of a key: it may take the same share of every dimension
    pool = _two_keys()
    assert dominant_levels(pool, ["a", "b"]) == pytest.approx(active_levels(pool, ["a", "b"]))


def test_dominant_levels_respect_a_cap_in_one_dimension() -> None:
    # b's requests take 10,000 tokens each (profile 0.1 / 1): its cap of 2 requests is a
    # dominant share of 0.2; requests fill when a holds 0.98 (+ b's 0.02), tokens are at
    # 0.49 + 0.2
    pool = _pool(
        (Allocation("a", 50), Allocation("b", 50, cap_value=2, cap_unit=Unit.REQUESTS)),
        _RPM_TPM,
        mode=ShareMode.ACTIVE,
    )
    used = {"a": _use(40, 20_000), "b": _use(1, 10_000)}
    levels = dominant_levels(pool, ["a", "b"], None, used, 0)
    assert levels[_RPM_TPM[0].key] * 50 == pytest.approx(98)


def test_dominant_waiting_reserves_hold_what_the_profile_uses() -> None:
    # b (10,000 tokens a request) waits at a dominant share of 0.2, its fair one is 2/3: it is
    # owed 0.467 of tokens and the 4.7 requests that go with them, not 64.7 requests. a, at a
    # dominant share of 0.6, leaves what b lacks to catch up with it: 0.4 of tokens and the 4
    # requests that go with them
    pool = _two_keys()
    used = {"a": _use(60, 30_000), "b": _use(2, 20_000)}
    levels = dominant_levels(pool, ["a", "b"], None, used, 0)
    res = dominant_waiting_reserves(Waiting(pool, levels, ["a", "b"], ["b"], used, 0))
    assert res.for_key("a") == pytest.approx({_RPM_TPM[0].key: 4, _RPM_TPM[1].key: 40_000})
    # a newcomer (not seen at the refresh) leaves all b is owed
    assert res.for_key("new") == pytest.approx(
        {_RPM_TPM[0].key: 14 / 3, _RPM_TPM[1].key: 140_000 / 3}
    )
    assert res.for_key("b") == {_RPM_TPM[0].key: 0.0, _RPM_TPM[1].key: 0.0}
    plain = waiting_reserves(Waiting(pool, levels, ["a", "b"], ["b"], used, 0))
    # per dimension on its own, b is owed 64.7 requests; a (60 requests) leaves what b lacks to
    # catch up with it (58), still far more than the 4.7 b's profile uses
    assert plain.for_key("a")[_RPM_TPM[0].key] == pytest.approx(60 - 2)


def test_dominant_waiting_reserves_hold_only_the_catch_up() -> None:
    # a at a dominant share of 0.25 (25 requests), b waiting at 0.2: a yields only the 0.05
    # b lacks to catch up with it (0.5 requests, 5,000 tokens), not the 0.467 b is owed; a key
    # below b (c, at 0.1) leaves nothing for it
    pool = _pool(
        (Allocation("a", 40), Allocation("b", 40), Allocation("c", 20)),
        _RPM_TPM,
        mode=ShareMode.ACTIVE,
    )
    used = {"a": _use(25, 12_500), "b": _use(2, 20_000), "c": _use(5, 2_500)}
    levels = {_RPM_TPM[0].key: 1.0, _RPM_TPM[1].key: 1_000.0}  # t = 0.01: b's fair share 0.4
    res = dominant_waiting_reserves(Waiting(pool, levels, ["a", "b", "c"], ["b"], used, 0))
    x_a, x_b = 0.25 / 40, 0.2 / 40
    lack = 40 * (x_a - x_b)
    assert res.for_key("a") == pytest.approx(
        {_RPM_TPM[0].key: lack * 100 * 0.1, _RPM_TPM[1].key: lack * 100_000}
    )
    assert res.for_key("c") == {_RPM_TPM[0].key: 0.0, _RPM_TPM[1].key: 0.0}
    assert res.for_key("new") == pytest.approx(
        {_RPM_TPM[0].key: 0.2 * 100 * 0.1, _RPM_TPM[1].key: 0.2 * 100_000}
    )


_WEEK = (
    Dimension(Unit.REQUESTS, Window.FIVE_HOURS, 250),
    Dimension(Unit.REQUESTS, Window.WEEKLY, 6000),
)
_WEEK_MS = 7 * 24 * 3_600_000


def _week_pool() -> Pool:
    allocs = tuple(Allocation(k, 25) for k in "abcd")
    return _pool(allocs, _WEEK, mode=ShareMode.ACTIVE)


def test_a_weekly_budget_is_paced_when_the_5_hour_windows_could_spend_it() -> None:
    # the docstring's worked example: 24 hours in, 900 spent, 200 of them in the last 5 hours
    pool = _week_pool()
    now = 52 * _WEEK_MS + 24 * 3_600_000  # a week boundary, then 24 hours
    totals = {_WEEK[0].key: Count(0.0, 200.0), _WEEK[1].key: Count(0.0, 900.0)}
    pace = long_budget_pace(pool, totals, now)
    assert pace.paced == {_WEEK[1].key}
    assert pace.held[_WEEK[1].key] == pytest.approx(6000 * (1 - 24 / 168))
    assert pace.capacities == pytest.approx({_WEEK[0].key: 200.0})
    # the 5-hour levels are filled over 200, the week leaves the dominant standing
    used = {k: {_WEEK[0].key: Count(0.0, 50.0), _WEEK[1].key: Count(0.0, 225.0)} for k in "abcd"}
    levels = dominant_levels(pool, list("abcd"), None, used, now, pace)
    assert levels[_WEEK[0].key] * 25 == pytest.approx(50)
    assert math.isinf(levels[_WEEK[1].key])
    demand = {"d": {_WEEK[0].key: 20.0}}
    levels = dominant_levels(pool, list("abcd"), demand, used, now, pace)
    assert levels[_WEEK[0].key] * 25 == pytest.approx(60)
    # every key, a newcomer too, leaves the held room free in the weekly dimension
    res = with_pace(NO_RESERVES, list("abcd"), pace)
    for k in ("a", "new"):
        assert res.for_key(k) == pytest.approx({_WEEK[1].key: 6000 * (1 - 24 / 168)})
    checks = compile_checks(
        pool, pool.allocations[0], {Unit.REQUESTS: 1.0}, levels=levels, reserves=res.for_key("a")
    )
    verdict = evaluate(checks, [(200.0, 50.0, 50.0), (900.0, 225.0, 225.0)], Policy.HARD, 0.5)
    assert (verdict.outcome, verdict.reason, verdict.index) == (Outcome.BLOCK, Reason.FAIR_SHARE, 1)
    # Retry-After: when the line (35.7 an hour) passes 900 + this request, 24 + 1.23 hours in;
    # the total alone (nothing in the previous week to decay) would say after the week's end
    fall = res.falls_for("a")[_WEEK[1].key]
    assert fall == res.falls_for("new")[_WEEK[1].key]
    assert fall.per_ms == pytest.approx(6000 / _WEEK_MS)
    assert fall.until_ms == 53 * _WEEK_MS  # the line reaches the limit as the week ends
    week, mine = Count(0.0, 900.0), Count(0.0, 225.0)
    wait = retry_after_ms(checks[1], Reason.FAIR_SHARE, week, mine, now, 0.5, fall)
    assert wait == pytest.approx((901 - 6000 * 24 / 168) / fall.per_ms, abs=1)
    assert wait is not None
    assert 4_400_000 < wait < 4_430_000
    unpaced = retry_after_ms(checks[1], Reason.FAIR_SHARE, week, mine, now, 0.5)
    assert unpaced is not None
    assert unpaced > _WEEK_MS - 24 * 3_600_000


def test_while_the_weeks_line_binds_a_key_ahead_leaves_it_to_the_waiting_keys_too() -> None:
    """Issue 18: the room a paced week frees goes first to the keys waiting behind, as the
    room a 5-hour window frees does: a key's reserve in the week is the room held plus what it
    leaves the waiting keys in the 5-hour dimension (the same unit)."""
    pool = _week_pool()
    now = 52 * _WEEK_MS + 24 * 3_600_000
    totals = {_WEEK[0].key: Count(0.0, 200.0), _WEEK[1].key: Count(0.0, 900.0)}
    pace = long_budget_pace(pool, totals, now)
    assert pace.shorter == {_WEEK[1].key: (_WEEK[0].key,)}
    catch_up = Reserves({"a": {_WEEK[0].key: 12.0}}, {_WEEK[0].key: 20.0})
    res = with_pace(catch_up, list("abcd"), pace)
    keep = 6000 * (1 - 24 / 168)
    assert res.for_key("a") == pytest.approx({_WEEK[0].key: 12.0, _WEEK[1].key: keep + 12.0})
    assert res.for_key("b")[_WEEK[1].key] == pytest.approx(keep + 20.0)  # as a newcomer
    assert res.for_key("new")[_WEEK[1].key] == pytest.approx(keep + 20.0)


def test_a_weekly_budget_that_lasts_is_not_paced() -> None:
    # the 5-hour windows at their limit spend 8,400 a week: a budget of 9,000 lasts
    week = Dimension(Unit.REQUESTS, Window.WEEKLY, 9000)
    pool = _pool(tuple(Allocation(k, 25) for k in "abcd"), (_WEEK[0], week), mode=ShareMode.ACTIVE)
    now = 52 * _WEEK_MS + 24 * 3_600_000
    totals = {_WEEK[0].key: Count(0.0, 200.0), week.key: Count(0.0, 900.0)}
    assert long_budget_pace(pool, totals, now) == NO_PACE
    # a one-dimension pool has nothing to pace
    one = _pool((Allocation("a", 100),), (_WEEK[0],), mode=ShareMode.ACTIVE)
    assert long_budget_pace(one, totals, now) == NO_PACE


def test_a_full_previous_week_paces_itself() -> None:
    # with the previous week spent in full, the sliding count alone holds the pace: no room held
    pool = _week_pool()
    now = 52 * _WEEK_MS + 24 * 3_600_000
    totals = {_WEEK[0].key: Count(0.0, 200.0), _WEEK[1].key: Count(6000.0, 900.0)}
    pace = long_budget_pace(pool, totals, now)
    assert pace.held == {_WEEK[1].key: 0.0}


def test_a_check_plan_gives_the_same_checks_as_compiling_from_scratch() -> None:
    """The engine compiles with a plan built once per (pool, key, model); the checks must be
    exactly those compile_checks builds without one, whatever the request adds per call."""
    dims = (
        Dimension(Unit.REQUESTS, Window.HOURLY, 100),
        Dimension(Unit.TOKENS, Window.DAILY, 0),  # unknown: skipped
        Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100),  # provider-anchored
        Dimension(Unit.TOKENS, Window.WEEKLY, 1e6),
    )
    alloc = Allocation(
        "a",
        40,
        cap_value=5000,
        cap_unit=Unit.TOKENS,
        model_caps=(ModelCap("gpt-x", Unit.REQUESTS, 5), ModelCap("other", Unit.TOKENS, 9)),
    )
    anchor = Anchor(1_700_000_000_000, 7, "c0")
    for mode in (ShareMode.STATIC, ShareMode.ACTIVE):
        pool = _pool((alloc, Allocation("b", 60)), dims, members=2, mode=mode)
        plan = check_plan(pool, alloc, "gpt-x")
        assert plan.anchored
        kw: dict[str, Any] = {
            "model": "gpt-x",
            "signals": {"requests/hourly": 0.7},
            "levels": {"requests/hourly": 0.5} if mode is ShareMode.ACTIVE else None,
            "reserves": {"tokens/weekly": 12.0, "requests/hourly": -3.0},
            "anchors": {"percent/5h": anchor},
        }
        cost = {Unit.REQUESTS: 1, Unit.TOKENS: 700, Unit.PERCENT: 0.2}
        fresh = compile_checks(pool, alloc, cost, **kw)
        assert compile_checks(pool, alloc, cost, plan=plan, **kw) == fresh
        assert [c.key for c in fresh] == [
            "requests/hourly",
            "percent/5h",
            "tokens/weekly",
            "model:gpt-x:requests/hourly",
        ]
        assert fresh[1].anchor == anchor
        assert fresh[0].anchor is None
    epoch_only = _pool((alloc,), (Dimension(Unit.REQUESTS, Window.HOURLY, 100),))
    assert not check_plan(epoch_only, alloc).anchored


def test_a_dimension_key_is_its_counter_name() -> None:
    d = Dimension(Unit.TOKENS, Window.FIVE_HOURS, 10)
    assert d.key == "tokens/5h"
    assert d == Dimension(Unit.TOKENS, Window.FIVE_HOURS, 10)
    assert "key" not in repr(d)


# -- the share judged on the current window (active mode, issue 17) ----------------------------


def _win(**kw: Any) -> DimensionCheck:
    c = chk(**kw)
    return DimensionCheck(
        c.key,
        c.unit,
        c.window_ms,
        c.limit,
        c.fair_share,
        c.cap,
        c.cost,
        c.signal,
        c.scope,
        c.reserve,
        window_share=True,
    )


def test_a_window_share_check_judges_the_share_on_the_current_window() -> None:
    # 60 in the pool, the key's sliding count 55 (most of it last window), 5 in this window
    assert evaluate([chk()], [(60, 55, 5)], H, 0.5).reason is FAIR
    assert evaluate([_win()], [(60, 55, 5)], H, 0.5).outcome is ALLOW
    assert evaluate([_win()], [(60, 55, 50)], H, 0.5).reason is FAIR  # its window's share used
    assert evaluate([_win()], [(60, 55, 50)], S, 0.5).outcome is PEN
    assert evaluate([_win()], [(60, 55, 50)], B, 0.5).outcome is ALLOW


def test_a_window_share_check_keeps_the_cap_ceiling_and_borrowing_on_the_sliding_counts() -> None:
    assert evaluate([_win(cap=30)], [(60, 30, 5)], H, 0.5).reason is CAP  # the cap: sliding
    assert evaluate([_win()], [(100, 55, 5)], H, 0.5).reason is SAT  # the ceiling: sliding
    # generous (the pool under half used): a hard key borrows up to the limit on its sliding
    # count; a soft one is penalised over its share of the window
    assert evaluate([_win(limit=200)], [(60, 200, 5)], H, 0.5).reason is SAT
    assert evaluate([_win(limit=200, fair=10)], [(60, 40, 20)], S, 0.5).outcome is PEN
    assert evaluate([_win(limit=200, fair=30)], [(60, 40, 20)], S, 0.5).outcome is ALLOW


def test_a_window_share_block_waits_for_the_window_to_turn() -> None:
    now = T + HOUR // 4
    c = _win(fair=20)
    # the window's 20 drop when the hour turns, 45 minutes from now; the pool leaves strict
    # mode sooner (its 70 × (1 − e) + 30 reaches 50 at 43 minutes past), which ends it too
    total = Count(70, 30)
    wait = retry_after_ms(c, FAIR, total, Count(40, 20), now, 0.5)
    assert wait == ms_until_at_most(total, 50 - 1e-9, now, HOUR) < 3 * HOUR // 4
    # a pool that stays strict: the window's turn
    assert retry_after_ms(c, FAIR, Count(0, 90), Count(0, 20), now, 0.5) == 3 * HOUR // 4


def test_standing_is_the_window_unless_backlogged() -> None:
    c = Count(prev=60, curr=10)
    assert standing(c, T + HOUR // 2, HOUR, backlogged=False) == 10
    assert standing(c, T + HOUR // 2, HOUR, backlogged=True) == pytest.approx(40)


def test_active_checks_judge_on_the_window_but_where_the_key_is_backlogged() -> None:
    pool = make_pool(
        *_RPM_TPM,
        allocations=(Allocation("a", 50), Allocation("b", 50)),
        provider="mock",
        share_mode=ShareMode.ACTIVE,
    )
    cost = {Unit.REQUESTS: 1.0, Unit.TOKENS: 500.0}
    levels = dominant_levels(pool, ["a", "b"])
    checks = compile_checks(pool, pool.allocations[0], cost, levels=levels)
    assert [c.window_share for c in checks] == [True, True]
    held = compile_checks(
        pool, pool.allocations[0], cost, levels=levels, backlogged={_RPM_TPM[1].key}
    )
    assert [c.window_share for c in held] == [True, False]
    static = dataclasses.replace(pool, share_mode=ShareMode.STATIC)
    assert not any(c.window_share for c in compile_checks(static, static.allocations[0], cost))


def test_the_catch_up_compares_window_use_but_for_backlogged_keys() -> None:
    """A key that used 90 last hour and nothing yet in this one is not ahead of a waiting key
    (it leaves it nothing); backlogged, its sliding count puts it ahead (it leaves room)."""
    pool = make_pool(
        Dimension(Unit.REQUESTS, Window.HOURLY, 300),
        allocations=(Allocation("a", 1), Allocation("b", 1)),
        provider="mock",
        share_mode=ShareMode.ACTIVE,
    )
    dim = pool.dimensions[0].key
    now = T + HOUR // 6
    used = {"a": {dim: Count(prev=90, curr=0)}, "b": {dim: Count(prev=0, curr=10)}}
    levels = {dim: 150.0}
    fresh = waiting_reserves(Waiting(pool, levels, ["a", "b"], ["b"], used, now, {}))
    assert fresh.for_key("a").get(dim, 0.0) == 0.0  # a stands at 0 this hour, behind b
    back = waiting_reserves(Waiting(pool, levels, ["a", "b"], ["b"], used, now, {"a": {dim}}))
    assert back.for_key("a")[dim] == pytest.approx(90 * 5 / 6 - 10)  # 75 − 10: b catches up
