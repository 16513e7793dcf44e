"""Burn rate EMA and time to exhaustion (SPEC §6)."""

from __future__ import annotations

import pytest

from fairgate.quota.burn import MIN_SPAN_MS, BurnSeries, Sample, ema_rate, time_to_exhaustion_ms


def test_fewer_than_two_samples_means_no_rate() -> None:
    assert ema_rate([]) == 0
    assert ema_rate([Sample(0, 10)]) == 0
    assert time_to_exhaustion_ms(100, 0) is None


def test_ema_over_samples() -> None:
    s = [Sample(0, 0), Sample(1000, 10), Sample(2000, 30)]
    # rates 10/s then 20/s → 0.3 × 20 + 0.7 × 10 = 13
    assert ema_rate(s) == pytest.approx(13)


def test_zero_dt_is_skipped_and_a_reset_counts_zero() -> None:
    assert ema_rate([Sample(0, 0), Sample(0, 50), Sample(1000, 10)]) == pytest.approx(10)
    assert ema_rate([Sample(0, 100), Sample(1000, 0)]) == 0


def test_time_to_exhaustion() -> None:
    assert time_to_exhaustion_ms(100, 10) == 10_000
    assert time_to_exhaustion_ms(-5, 10) == 0


def test_series_is_bounded_and_throttled() -> None:
    series = BurnSeries(maxlen=8, min_interval_ms=10_000)
    assert series.due(0)
    for t in range(0, 100_000, 10_000):
        series.add(t, t / 100)
    assert len(series.samples) == 8  # the last 70 s
    assert not series.due(95_000)
    assert series.due(100_000)
    series.add(50_000, 1)  # out of order is ignored
    assert series.samples[-1].t_ms == 90_000
    assert series.rate() == pytest.approx(10)


def test_no_rate_until_the_samples_span_a_minute() -> None:
    """Three requests in the first second are a burst, not a rate (it said "17 s left")."""
    series = BurnSeries(min_interval_ms=0)
    for t, used in ((0, 0), (400, 1), (800, 2), (1_000, 3)):
        series.add(t, used)
    assert series.rate() == 0
    assert time_to_exhaustion_ms(50, series.rate()) is None
    series.add(MIN_SPAN_MS - 1, 3)
    assert series.rate() == 0
    series.add(MIN_SPAN_MS, 4)
    assert series.rate() > 0
    assert time_to_exhaustion_ms(50, series.rate()) is not None
