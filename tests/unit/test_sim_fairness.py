"""Jain's index and the per-window figures of the simulator, on known inputs."""

from __future__ import annotations

import pytest

from fairgate.sim.fairness import (
    WindowFigures,
    jain,
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
