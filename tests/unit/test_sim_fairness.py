"""Jain's index and the per-window figures of the simulator, on known inputs."""

from __future__ import annotations

from fractions import Fraction

import pytest

from fairgate.sim.fairness import (
    CapTimes,
    LongerWindow,
    WindowFigures,
    dominant_window_figures,
    jain,
    sliding_cap_room,
    summarize,
    well_behaved_keys,
    window_figures,
)


def test_jain_equal_is_one() -> None:
    assert jain([1, 1, 1, 1]) == 1.0
    assert jain([0.3, 0.3]) == pytest.approx(1.0)


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_jain_one_of_n_is_one_over_n(n: int) -> None:
    assert jain([1.0] + [0.0] * (n - 1)) == pytest.approx(1 / n)


def test_jain_known_values() -> None:
    # (1 + 2 + 3)² / (3 × (1 + 4 + 9)) = 36 / 42
    assert jain([1, 2, 3]) == pytest.approx(36 / 42)
    assert jain([]) == 1.0
    assert jain([0, 0]) == 1.0


def _windows() -> list[WindowFigures]:
    # capacity 100 per window, equal weights; window 0: A wants 80, B 20 → ideal 80/20;
    # window 1: both want 100 → ideal 50/50
    return window_figures(
        100,
        {"a": 50, "b": 50},
        {"a": None, "b": None},
        [{"a": 80, "b": 20}, {"a": 100, "b": 100}],
        [{"a": 80, "b": 20}, {"a": 70, "b": 30}],
    )


def test_window_ideal_and_jain() -> None:
    w0, w1 = _windows()
    assert w0.ideal == {"a": 80, "b": 20}
    assert w1.ideal == {"a": 50, "b": 50}
    assert w0.jain() == 1.0
    # ratios 70/50 and 30/50 → (2)² / (2 × (1.96 + 0.36))
    assert w1.jain() == pytest.approx(4 / (2 * (1.4**2 + 0.6**2)))
    assert w1.allowed == 100


def test_cap_bounds_the_ideal() -> None:
    (w,) = window_figures(
        100, {"a": 50, "b": 50}, {"a": 10, "b": None}, [{"a": 90, "b": 90}], [{"a": 10, "b": 90}]
    )
    assert w.ideal == {"a": 10, "b": 90}


def test_summary() -> None:
    m = summarize(
        _windows(),
        shares={"a": 50, "b": 50},
        overshoot={"requests/hourly": 0.0},
        blocked={"a": 3},
        dropped={},
        first_block_ms={"a": 1000},
        waits_ms={"a": [0, 10, 20], "b": []},
    )
    # a: 150 admitted of 130 owed; b: 50 of 70
    assert m.ratio == pytest.approx({"a": 150 / 130, "b": 50 / 70})
    assert m.jain == pytest.approx(jain([150 / 130, 50 / 70]))
    assert m.jain_worst_window == pytest.approx(_windows()[1].jain())
    assert m.utilisation == 1.0
    assert m.blocked == {"a": 3, "b": 0}
    assert m.well_behaved == []  # both asked for more than 50 in window 1
    assert m.first_block_well_behaved_ms is None
    assert m.wait_p95_ms == {"a": 20, "b": 0}


def test_utilisation_counts_what_demand_allowed() -> None:
    # one window, capacity 100, demand 60 in total: admitting 45 is 75 %
    w = window_figures(100, {"a": 1, "b": 1}, {}, [{"a": 40, "b": 20}], [{"a": 30, "b": 15}])
    m = summarize(
        w, shares={"a": 50, "b": 50}, overshoot={}, blocked={}, dropped={}, first_block_ms={}
    )
    assert m.utilisation == pytest.approx(0.75)


def test_well_behaved_keys_never_ask_beyond_their_share() -> None:
    w = window_figures(
        100,
        {"a": 50, "b": 50, "c": 0},
        {},
        [{"a": 80, "b": 20}, {"a": 40, "b": 50}],
        [{"a": 50, "b": 20}, {"a": 40, "b": 50}],
    )
    assert well_behaved_keys(w, {"a": 50, "b": 50, "c": 0}) == ["b"]


def _two_windows(weekly: float, longer: bool) -> list[WindowFigures]:
    """docs/fairness.md's example: 100 requests per 5 hours and ``weekly`` a week; A asks 100
    in both windows, B 100 in the second."""
    dims = {"requests/5h": 100.0, "requests/weekly": weekly}
    demand = [
        {d: {"A": 100.0} for d in dims},
        {d: {"A": 100.0, "B": 100.0} for d in dims},
    ]
    spans = {"requests/weekly": LongerWindow(buckets=[0, 0], per_window=Fraction(5, 168))}
    return dominant_window_figures(
        dims, {"A": 50, "B": 50}, {}, demand, demand, spans if longer else None
    )


def test_a_weekly_budget_is_shared_across_the_windows() -> None:
    w1, w2 = _two_windows(120, longer=True)
    # one level for the three (key, window) pairs: 40 each, the week full, window 2 not
    assert w1.ideal == {"A": 40, "B": 0}
    assert w2.ideal == {"A": 40, "B": 40}
    assert w1.ideal_by_dim["requests/weekly"]["A"] == 40
    # the week sustains 120 × 5/168 = 3.6 a window: every key's dominant dimension
    assert w2.dominant == {"A": "requests/weekly", "B": "requests/weekly"}
    assert w2.capacities["requests/weekly"] == pytest.approx(120 * 5 / 168)
    assert w2.bottleneck == "requests/weekly"
    # each window on its own would hand out 200, past the week's 120
    v1, v2 = _two_windows(120, longer=False)
    assert v1.ideal == {"A": 100, "B": 0}
    assert v2.ideal == {"A": 50, "B": 50}


def test_a_budget_that_does_not_bind_leaves_every_window_on_its_own() -> None:
    # a week of 10,000: the 5-hour windows bind, and the ideal is theirs, to the last bit
    across = _two_windows(10_000, longer=True)
    alone = window_figures(
        100, {"A": 50, "B": 50}, {}, [w.demand for w in across], [w.admitted for w in across]
    )
    assert [w.ideal for w in across] == [w.ideal for w in alone]
    assert [w.ideal for w in across] == [{"A": 100, "B": 0}, {"A": 50, "B": 50}]


def test_a_cap_holds_over_the_longer_window_too() -> None:
    # A capped at 60 requests (per 5 hours and per week, as the engine applies a cap to every
    # dimension of its unit): 30 + 30 over the week, B takes what A leaves of the 120
    dims = {"requests/5h": 100.0, "requests/weekly": 120.0}
    demand = [{d: {"A": 100.0} for d in dims}, {d: {"A": 100.0, "B": 100.0} for d in dims}]
    w1, w2 = dominant_window_figures(
        dims,
        {"A": 50, "B": 50},
        {"A": {"requests/5h": 60, "requests/weekly": 60}},
        demand,
        demand,
        {"requests/weekly": LongerWindow(buckets=[0, 0], per_window=Fraction(5, 168))},
    )
    assert (w1.ideal["A"], w2.ideal["A"], w2.ideal["B"]) == (30, 30, 60)


MIN = 60_000
HOUR = 60 * MIN


def test_a_sliding_cap_lets_a_key_take_only_what_its_last_window_left() -> None:
    """docs/fairness.md's example: cap 30 an hour; 12 used in the last minutes of the previous
    hour, an on-phase of 28 requests over the first 28 minutes of this one."""
    asked = [(i * MIN, 1.0) for i in range(28)]
    room = sliding_cap_room(asked, prev=12, cap=30, patience_ms=2 * MIN, window_ms=HOUR)
    # at t minutes the count is 12 × (1 − t/60) + served: it may reach 30 − 12 × (1 − t/60)
    assert 24 <= room <= 25
    assert sliding_cap_room(asked, prev=0, cap=30, patience_ms=2 * MIN, window_ms=HOUR) == 28
    # what is asked late in the window can use the cap the fading hour frees
    late = [(50 * MIN + i * 20_000, 1.0) for i in range(30)]
    assert sliding_cap_room(late, prev=30, cap=30, patience_ms=10 * MIN, window_ms=HOUR) >= 25


def test_a_request_is_served_within_its_patience_or_not_at_all() -> None:
    # the previous hour used 40 against a cap of 30 (the cap lowered since): the count stays at
    # or above 30 until 15 minutes past, so a request that waits 10 minutes never gets in
    asked = [(0, 1.0)]
    assert sliding_cap_room(asked, 40, 30, 10 * MIN, HOUR) == 0
    assert sliding_cap_room(asked, 40, 30, 20 * MIN, HOUR) == 1


def test_the_ideal_holds_a_capped_key_to_its_sliding_cap() -> None:
    """Two windows, A capped at 30 and asking 40 in each, early in the second (minutes 0-10):
    the first window gives it 30, which leaves it 30 × t/60 in the second by t minutes, not
    another 30 (B, uncapped, takes the rest of the 100)."""
    demand = [{"r": {"A": 40.0, "B": 100.0}}, {"r": {"A": 40.0, "B": 100.0}}]
    asked = {
        "A": [
            [(i * 90_000, 1.0) for i in range(40)],  # spread over the first hour
            [(i * 15_000, 1.0) for i in range(40)],  # all in the second one's first 10 minutes
        ]
    }
    times = CapTimes(HOUR, asked, {"A": 2 * MIN})
    w1, w2 = dominant_window_figures(
        {"r": 100.0}, {"A": 50, "B": 50}, {"A": {"r": 30.0}}, demand, demand, None, times
    )
    assert w1.ideal["A"] == pytest.approx(30)
    assert 5 <= w2.ideal["A"] <= 6  # 30 × (1 − 10/60) + served < 30 by minute 10: about 5
    assert w2.ideal["B"] == pytest.approx(100 - w2.ideal["A"])
    # without the times, the calendar-hour cap: 30 again
    _, v2 = dominant_window_figures(
        {"r": 100.0}, {"A": 50, "B": 50}, {"A": {"r": 30.0}}, demand, demand
    )
    assert v2.ideal["A"] == 30


def test_a_shorter_last_window_is_owed_its_length_of_the_week() -> None:
    """The run ends 3 hours into its second 5-hour window: that window sustains 3/5 of what a
    whole one does of the weekly budget, so a key asking in both is owed 3/5 as much there."""
    dims = {"requests/5h": 100.0, "requests/weekly": 120.0}
    demand = [{d: {"A": 100.0} for d in dims}, {d: {"A": 100.0} for d in dims}]
    whole = LongerWindow(buckets=[0, 0], per_window=Fraction(5, 168))
    short = LongerWindow(buckets=[0, 0], per_window=Fraction(5, 168), covers=[1, Fraction(3, 5)])
    weekly = "requests/weekly"
    w1, w2 = dominant_window_figures(dims, {"A": 100}, {}, demand, demand, {weekly: whole})
    assert (w1.ideal["A"], w2.ideal["A"]) == (60, 60)
    s1, s2 = dominant_window_figures(dims, {"A": 100}, {}, demand, demand, {weekly: short})
    assert (s1.ideal["A"], s2.ideal["A"]) == (75, 45)  # 120 in the ratio 5 : 3
    assert s2.capacities["requests/weekly"] == pytest.approx(120 * 3 / 168)
