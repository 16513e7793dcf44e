"""The ideal the simulator measures against: weighted max-min fairness, on hand-worked cases."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.quota.decision import water_fill_level
from fairgate.sim.ideal import (
    dominant_resource_fair,
    exact_dominant_resource_fair,
    exact_progressive_filling,
    max_min_fair,
    water_level,
)


def test_equal_weights_unbounded_demand_split_equally() -> None:
    assert max_min_fair(300, [1, 1, 1], [1000, 1000, 1000]) == [100, 100, 100]


def test_weights_split_in_proportion() -> None:
    # 1:3 of 100 → 25 and 75
    assert max_min_fair(100, [1, 3], [500, 500]) == [25, 75]


def test_worked_example_from_the_module_docstring() -> None:
    # capacity 600, weights 40/30/20/10, demands 400/100/200/30: the 30- and 10-weight keys want
    # less than their shares (180, 60) and are satisfied; the 470 left is split 40:20 between the
    # other two (λ = 470 / 60): 313.33 and 156.67, both below what they asked.
    alloc = max_min_fair(600, [40, 30, 20, 10], [400, 100, 200, 30])
    assert alloc == pytest.approx([470 * 40 / 60, 100, 470 * 20 / 60, 30])
    assert sum(alloc) == pytest.approx(600)


def test_demand_below_share_is_met_and_surplus_flows_to_the_others() -> None:
    # equal weights, 300: shares 100 each; B and C want 50, so A gets 200 (not 100)
    assert max_min_fair(300, [1, 1, 1], [1000, 50, 50]) == [200, 50, 50]


def test_everyone_below_capacity_gets_their_demand() -> None:
    assert max_min_fair(600, [50, 30, 20], [100, 80, 20]) == [100, 80, 20]


def test_cascading_satisfaction() -> None:
    # weights 1/1/1/1, capacity 100: D wants 10 → satisfied; level (90/3 = 30): C wants 25 →
    # satisfied; level (65/2 = 32.5): A and B get 32.5 each
    assert max_min_fair(100, [1, 1, 1, 1], [80, 90, 25, 10]) == pytest.approx([32.5, 32.5, 25, 10])


def test_zero_weight_keys_only_get_leftovers() -> None:
    assert max_min_fair(100, [50, 0], [30, 100]) == [30, 70]
    assert max_min_fair(100, [50, 0], [300, 100]) == [100, 0]


def test_no_demand_no_capacity() -> None:
    assert max_min_fair(0, [1, 1], [5, 5]) == [0, 0]
    assert max_min_fair(10, [1, 1], [0, 0]) == [0, 0]
    assert max_min_fair(10, [], []) == []
    with pytest.raises(ValueError, match="same length"):
        max_min_fair(10, [1], [1, 2])


def test_water_level() -> None:
    assert water_level(300, [1, 1, 1], [1000, 50, 50]) == 200
    assert math.isinf(water_level(300, [1, 1], [10, 10]))


@given(
    capacity=st.floats(0, 1e6),
    members=st.lists(st.tuples(st.floats(0.5, 100), st.floats(0, 1e5)), min_size=1, max_size=8),
)
def test_max_min_properties(capacity: float, members: list[tuple[float, float]]) -> None:
    weights = [w for w, _ in members]
    demands = [d for _, d in members]
    alloc = max_min_fair(capacity, weights, demands)
    # feasible and work-conserving: nobody above its demand, capacity used up to total demand
    assert all(a <= d * (1 + 1e-9) + 1e-9 for a, d in zip(alloc, demands, strict=True))
    assert sum(alloc) == pytest.approx(min(capacity, sum(demands)), rel=1e-9, abs=1e-6)
    # max-min: a key left short sits at the highest level of anyone (per unit of weight)
    short = [a / w for a, w, d in zip(alloc, weights, demands, strict=True) if a < d - 1e-6]
    if short:
        top = max(a / w for a, w in zip(alloc, weights, strict=True))
        assert all(s == pytest.approx(top, rel=1e-9) for s in short)


def test_agrees_with_the_engines_water_filling() -> None:
    # the engine's level (demand bounds as members) gives the same shares as the exact ideal
    weights, demands = [40, 30, 20, 10], [400, 100, 200, 30]
    level = water_fill_level(600, list(zip(weights, demands, strict=True)))
    engine_alloc = [min(d, level * w) for w, d in zip(weights, demands, strict=True)]
    assert engine_alloc == pytest.approx(max_min_fair(600, weights, demands))


# -- weighted dominant-resource fairness (issue 18) -----------------------------------------------


def test_drf_worked_example_chat_against_research() -> None:
    # 100 requests + 100,000 tokens; A: 500 tokens a request, B: 10,000; both want more
    a, b = dominant_resource_fair([100, 100_000], [1, 1], [[1, 500], [1, 10_000]], [1e9, 1e9])
    assert a == pytest.approx(200 / 3)  # two thirds of the requests (its dominant dimension)
    assert b == pytest.approx(20 / 3)  # two thirds of the tokens
    assert a * 500 + b * 10_000 == pytest.approx(100_000)  # tokens full, requests not


@pytest.mark.parametrize(
    ("weights", "demands"),
    [([40, 30, 20, 10], [400, 100, 200, 30]), ([1, 1, 1], [50, 500, 5000]), ([5, 0, 1], [9, 9, 9])],
)
def test_drf_with_one_dimension_is_max_min(weights: list[float], demands: list[float]) -> None:
    sizes = [3.0, 1.0, 7.0, 2.0][: len(weights)]
    drf = dominant_resource_fair([600], weights, [[s] for s in sizes], demands)
    mm = max_min_fair(600, weights, [d * s for d, s in zip(demands, sizes, strict=True)])
    assert [x * s for x, s in zip(drf, sizes, strict=True)] == pytest.approx(mm)


def test_drf_a_satisfied_key_leaves_the_rest_and_zero_weight_keys_come_last() -> None:
    # A asks 10 requests only; B (weight 1) and C (weight 0) want everything
    a, b, c = dominant_resource_fair(
        [100, 1e6], [1, 1, 0], [[1, 1], [1, 1], [1, 1]], [10, 1e9, 1e9]
    )
    assert (a, b, c) == (10, 90, 0)
    a, b, c = dominant_resource_fair([100, 1e6], [1, 1, 0], [[1, 1], [1, 1], [1, 1]], [10, 20, 1e9])
    assert (a, b, c) == (10, 20, 70)


def test_drf_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="one cost per dimension"):
        dominant_resource_fair([1, 2], [1], [[1]], [1])


def _reference_drf(
    caps: list[Fraction], weights: list[float], cost: list[list[Fraction]], want: list[Fraction]
) -> list[Fraction]:
    """The dense progressive filling the ideal used before the event heap: every event
    recomputed over every key and dimension. The heap must give the same fractions."""
    alloc = [Fraction(0)] * len(weights)
    for phase in (
        {i: Fraction(w) for i, w in enumerate(weights) if w > 0},
        {i: Fraction(1) for i, w in enumerate(weights) if w <= 0},
    ):
        dims = range(len(caps))
        used = [sum((alloc[i] * cost[i][d] for i in range(len(alloc))), Fraction(0)) for d in dims]
        rate: dict[int, Fraction] = {}
        for i, w in phase.items():
            if want[i] <= alloc[i] or any(cost[i][d] > 0 and used[d] >= caps[d] for d in dims):
                continue
            if all(c == 0 for c in cost[i]):
                alloc[i] = want[i]
                continue
            dom = max((cost[i][d] / caps[d] for d in dims if caps[d] > 0), default=Fraction(0))
            if dom > 0:
                rate[i] = w / dom
        base = {i: alloc[i] for i in rate}
        t = Fraction(0)
        while rate:
            events = [(want[i] - base[i]) / r for i, r in rate.items()]
            for d in dims:
                r_d = sum((r * cost[i][d] for i, r in rate.items()), Fraction(0))
                if r_d > 0:
                    events.append(t + (caps[d] - used[d]) / r_d)
            step = min(events)
            for i, r in rate.items():
                for d in dims:
                    used[d] += r * (step - t) * cost[i][d]
                alloc[i] = base[i] + r * step
            t = step
            for i in list(rate):
                if alloc[i] >= want[i] or any(cost[i][d] > 0 and used[d] >= caps[d] for d in dims):
                    del rate[i]
    return alloc


_small = st.sampled_from([0, 1, 2, 7, 10, 50, 100, 333, 1000])


@given(
    st.lists(_small, min_size=1, max_size=3).flatmap(
        lambda caps: st.tuples(
            st.just(caps),
            st.lists(
                st.tuples(
                    st.sampled_from([0, 1, 5, 25, 40]),
                    st.lists(_small, min_size=len(caps), max_size=len(caps)),
                    _small,
                ),
                max_size=6,
            ),
        )
    )
)
def test_the_event_heap_gives_the_dense_fillings_fractions(
    case: tuple[list[int], list[tuple[int, list[int], int]]],
) -> None:
    caps, members = case
    fcaps = [Fraction(c) for c in caps]
    weights = [float(w) for w, _, _ in members]
    cost = [[Fraction(c) for c in row] for _, row, _ in members]
    want = [Fraction(d) for _, _, d in members]
    exact = exact_dominant_resource_fair(fcaps, weights, cost, want)
    assert exact == _reference_drf(fcaps, weights, cost, want)


def test_progressive_filling_shares_a_budget_across_windows() -> None:
    # docs/fairness.md's example: 100 per 5 hours, 120 a week; A asks 100 in both windows, B 100
    # in the second. Constraints: window 1, window 2, the week. Every claimant costs 1 of its
    # window and 1 of the week, and has the same dominant share: max-min over the three.
    one = Fraction(1)
    rows = [{0: one, 2: one}, {1: one, 2: one}, {1: one, 2: one}]  # A in 1, A in 2, B in 2
    alloc = exact_progressive_filling(
        [Fraction(100), Fraction(100), Fraction(120)],
        [1, 1, 1],
        rows,
        [Fraction(100)] * 3,
        [Fraction(1, 100)] * 3,
    )
    assert alloc == [40, 40, 40]
