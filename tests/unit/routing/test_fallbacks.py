"""Windowed fallback counts per combo and reason: the last 15 minutes, bounded memory."""

from __future__ import annotations

import pytest

from fairgate.routing.fallbacks import MINUTE_MS, FallbackCounts

T0 = 1_700_000_000_000


def test_counts_by_reason_within_the_window() -> None:
    f = FallbackCounts(window_minutes=15)
    f.record("fast", "rate_limit", T0)
    f.record("fast", "rate_limit", T0 + 1000)
    f.record("fast", "server_error", T0 + 5 * MINUTE_MS)
    f.record("other", "timeout", T0)
    assert f.counts("fast", T0 + 5 * MINUTE_MS) == {"rate_limit": 2, "server_error": 1}
    assert f.counts("other", T0) == {"timeout": 1}
    assert f.counts("nobody", T0) == {}
    # 15 minutes later the first minute has left the window; 20 later, everything has
    assert f.counts("fast", T0 + 15 * MINUTE_MS) == {"server_error": 1}
    assert f.counts("fast", T0 + 20 * MINUTE_MS) == {}


def test_memory_is_bounded_in_combos_and_minutes() -> None:
    f = FallbackCounts(window_minutes=3, max_combos=2)
    for i in range(100):
        f.record("a", "rate_limit", T0 + i * MINUTE_MS)
    f.record("b", "timeout", T0)
    f.record("c", "timeout", T0)  # "a" was recorded least recently: dropped
    assert len(f) == 2
    assert f.counts("a", T0 + 99 * MINUTE_MS) == {}
    assert f.counts("c", T0) == {"timeout": 1}
    f.record("b", "x", T0 + 99 * MINUTE_MS)
    assert f.counts("b", T0 + 99 * MINUTE_MS) == {"x": 1}


def test_a_late_record_counts_in_the_newest_minute() -> None:
    f = FallbackCounts()
    f.record("a", "rate_limit", T0 + 2 * MINUTE_MS)
    f.record("a", "timeout", T0)  # finished out of order
    assert f.counts("a", T0 + 2 * MINUTE_MS) == {"rate_limit": 1, "timeout": 1}


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="window_minutes"):
        FallbackCounts(window_minutes=0)
