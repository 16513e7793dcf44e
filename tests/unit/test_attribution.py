"""Per-key charging of a provider-reported percent (SPEC §4 [better])."""

from __future__ import annotations

import pytest

from fairgate.quota.attribution import (
    EXPLAINED_FACTOR,
    MAX_STEP,
    PLAN_MIN_TOKENS,
    SMOOTHING,
    PercentAttributor,
)


def test_worked_example() -> None:
    a = PercentAttributor()
    assert a.observe(10.0) == {}  # first reading is the baseline
    a.add_tokens("A", 3000)
    a.add_tokens("B", 1000)
    charges = a.observe(14.0)
    assert charges == pytest.approx({"A": 3.0, "B": 1.0})
    assert a.estimate(1000) == pytest.approx(1.0)


def test_window_rollover_charges_nothing() -> None:
    a = PercentAttributor()
    a.observe(90)
    a.add_tokens("A", 500)
    assert a.observe(3) == {}
    assert a.tokens_since == {}


def test_no_change_keeps_tokens_for_the_next_rise() -> None:
    a = PercentAttributor()
    a.observe(10)
    a.add_tokens("A", 100)
    assert a.observe(10) == {}
    a.add_tokens("B", 100)
    assert a.observe(12) == pytest.approx({"A": 1, "B": 1})


def test_a_reading_older_than_the_applied_one_only_adds_its_tokens() -> None:
    """A long stream settling after a shorter, later request: its lower reading is no reset."""
    a = PercentAttributor()
    a.observe(10.0, at_ms=1_000)
    a.add_tokens("A", 100)
    assert a.observe(12.0, at_ms=3_000) == pytest.approx({"A": 2.0})
    a.add_tokens("B", 100)
    assert a.observe(11.0, at_ms=2_000) == {}  # older: not a window reset
    assert a.tokens_since == {"B": 100}
    assert a.observe(14.0, at_ms=4_000) == pytest.approx({"B": 2.0})


def test_an_unexplained_rise_goes_to_the_pool_only() -> None:
    """Use from outside the gateway: the keys are charged what their tokens explain (at most
    EXPLAINED_FACTOR × the rate), the rest to nobody."""
    a = PercentAttributor()
    a.observe(0.0)
    a.add_tokens("A", 1_000)
    assert a.observe(1.0) == pytest.approx({"A": 1.0})  # 0.001 % a token
    a.add_tokens("B", 1_000)
    charges = a.observe(31.0)  # +30 %: the owner's own session used most of it
    assert charges == pytest.approx({"B": EXPLAINED_FACTOR * 1.0})
    assert a.unexplained == pytest.approx(30.0 - EXPLAINED_FACTOR)


def test_the_estimate_is_smoothed_step_limited_and_bounded_by_the_plan() -> None:
    a = PercentAttributor()
    a.observe(0.0)
    a.add_tokens("A", 10_000)
    a.observe(10.0)  # 0.001 % a token
    a.add_tokens("A", 10)
    a.observe(12.0)  # one odd rise (0.2 % a token): at most EXPLAINED_FACTOR × the rate is theirs
    expected = (1 - SMOOTHING) * 0.001 + SMOOTHING * 0.001 * EXPLAINED_FACTOR
    assert a.percent_per_token == pytest.approx(expected)
    a.add_tokens("A", 10_000)
    a.observe(12.0 + 0.0001)  # a sample far below the rate counts as 1 / MAX_STEP of it
    expected = (1 - SMOOTHING) * expected + SMOOTHING * expected / MAX_STEP
    assert a.percent_per_token == pytest.approx(expected)
    assert a.estimate(1_000) == pytest.approx(1_000 * expected)
    steep = PercentAttributor()
    steep.observe(0.0)
    steep.add_tokens("A", 10)
    steep.observe(5.0)  # 0.5 % a token: the plan bound prices a token at 100 % / 10,000
    assert steep.estimate(1_000) == pytest.approx(1_000 * 100 / PLAN_MIN_TOKENS)
