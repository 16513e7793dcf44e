"""Per-key charging of a provider-reported percent (SPEC §4 [better])."""

from __future__ import annotations

import pytest

from fairgate.quota.attribution import PercentAttributor


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
