"""The test clock of real processes (fairgate.testclock): only under FAIRGATE_TESTING=1, moved
only forward, shared by processes given one anchor."""

from __future__ import annotations

import pytest

from fairgate.clock import SYSTEM_CLOCK, ManualClock
from fairgate.process.settings import Settings
from fairgate.testclock import (
    MAX_ADVANCE_MS,
    ProcessClock,
    ShiftedClock,
    TestClockError,
    advance_ms_of,
    clock_view,
    parse_instant,
    process_clock,
)


def given_clock(env: dict[str, str]) -> ProcessClock:
    """The clock the settings read from ``env`` describe."""
    return process_clock(Settings.load(env).test_clock)


START = "2026-06-24T12:30:00Z"
START_MS = 1_782_304_200_000


def test_parse_instant_iso_and_epoch_ms() -> None:
    assert parse_instant(START) == START_MS
    assert parse_instant("2026-06-24T14:30:00+02:00") == START_MS
    assert parse_instant(str(START_MS)) == START_MS
    with pytest.raises(ValueError, match="zone"):
        parse_instant("2026-06-24T12:30:00")


def test_runs_at_its_rate_from_the_anchor_and_only_moves_forward() -> None:
    real = ManualClock(1_000_000)
    clock = ShiftedClock(START_MS, rate=1.0, anchor_ms=999_000, real=real)
    assert clock.now_ms() == START_MS + 1_000  # the anchor was a second ago
    real.advance(500)
    assert clock.now_ms() == START_MS + 1_500
    clock.advance(3_600_000)
    assert clock.now_ms() == START_MS + 3_601_500
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)

    frozen = ShiftedClock(START_MS, rate=0, real=real)
    real.advance(10_000)
    assert frozen.now_ms() == START_MS
    frozen.advance(2_000)
    assert frozen.now_ms() == START_MS + 2_000

    fast = ShiftedClock(START_MS, rate=60, real=real)  # a minute per real second
    real.advance(1_000)
    assert fast.now_ms() == START_MS + 60_000
    assert clock_view(fast) == {
        "nowMs": START_MS + 60_000,
        "startMs": START_MS,
        "anchorMs": fast.anchor_ms,
        "rate": 60,
        "advancedMs": 0,
    }


def test_two_processes_with_one_anchor_agree() -> None:
    real = ManualClock(5_000_000)
    env = {
        "FAIRGATE_TESTING": "1",
        "FAIRGATE_TEST_CLOCK": START,
        "FAIRGATE_TEST_CLOCK_ANCHOR": "4000000",
    }
    a, b = given_clock(env).clock, given_clock(env).clock
    assert isinstance(a, ShiftedClock)
    assert isinstance(b, ShiftedClock)
    a._real = b._real = real  # both read one "real" time, as two processes on one host do
    assert a.now_ms() == b.now_ms() == START_MS + 1_000_000


def test_without_the_guard_the_system_clock_runs_and_says_why() -> None:
    assert given_clock({}).clock is SYSTEM_CLOCK
    assert given_clock({}).warning is None
    chosen = given_clock({"FAIRGATE_TEST_CLOCK": START})
    assert chosen.clock is SYSTEM_CLOCK
    assert chosen.warning is not None
    assert "ignored" in chosen.warning
    assert "FAIRGATE_TESTING=1" in chosen.warning
    assert given_clock({"FAIRGATE_TEST_CLOCK": START, "FAIRGATE_TESTING": "true"}).clock is (
        SYSTEM_CLOCK
    )


def test_under_the_guard_the_test_clock_runs_and_is_announced() -> None:
    chosen = given_clock(
        {"FAIRGATE_TESTING": "1", "FAIRGATE_TEST_CLOCK": START, "FAIRGATE_TEST_CLOCK_RATE": "0"}
    )
    assert isinstance(chosen.clock, ShiftedClock)
    assert chosen.clock.now_ms() == START_MS  # frozen
    assert chosen.warning is not None
    assert "TEST CLOCK" in chosen.warning
    assert "2026-06-24T12:30:00+00:00" in chosen.warning
    # a rate alone: the real time, slowed down
    slow = given_clock({"FAIRGATE_TESTING": "1", "FAIRGATE_TEST_CLOCK_RATE": "0.5"}).clock
    assert isinstance(slow, ShiftedClock)
    assert abs(slow.now_ms() - SYSTEM_CLOCK.now_ms()) < 60_000


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FAIRGATE_TEST_CLOCK", "tomorrow"),
        ("FAIRGATE_TEST_CLOCK", "2026-06-24T12:30:00"),
        ("FAIRGATE_TEST_CLOCK_RATE", "-1"),
        ("FAIRGATE_TEST_CLOCK_RATE", "nan"),
        ("FAIRGATE_TEST_CLOCK_RATE", "fast"),
        ("FAIRGATE_TEST_CLOCK_ANCHOR", "12.5"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(name: str, value: str) -> None:
    env = {"FAIRGATE_TESTING": "1", "FAIRGATE_TEST_CLOCK": START, name: value}
    with pytest.raises(TestClockError, match=name):
        given_clock(env)


def test_advance_body() -> None:
    assert advance_ms_of({"advanceMs": 1_000}) == 1_000
    assert advance_ms_of({"advanceMs": 0}) == 0
    for bad in (
        {},
        {"advanceMs": -1},
        {"advanceMs": 1.5},
        {"advanceMs": True},
        {"advanceMs": "5"},
        {"advanceMs": MAX_ADVANCE_MS + 1},
    ):
        with pytest.raises(TestClockError, match="advanceMs"):
            advance_ms_of(bad)
