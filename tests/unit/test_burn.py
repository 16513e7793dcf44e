"""Burn rate over the window's own horizon, and time to exhaustion (SPEC §6, issue 48 item 6).

Traces with known answers: paced, bursty, idle, and the irregular sampling (a settle's samples
between a dashboard's reads) that made a moving average of per-interval rates read 0.53/s
against a pace of 0.067-0.115/s."""

from __future__ import annotations

import pytest

from fairgate.quota.burn import (
    MIN_SPAN_MS,
    BurnSeries,
    Sample,
    horizon_rate,
    time_to_exhaustion_ms,
    value_at,
)

HOUR = 3_600_000


def test_fewer_than_two_samples_means_no_rate() -> None:
    assert horizon_rate([], 0, HOUR) == 0
    assert horizon_rate([Sample(0, 10)], HOUR, HOUR) == 0
    assert time_to_exhaustion_ms(100, 0) is None


def test_value_between_samples_is_linear() -> None:
    s = [Sample(0, 0), Sample(1000, 10), Sample(3000, 30)]
    assert value_at(s, -5) == 0
    assert value_at(s, 500) == pytest.approx(5)
    assert value_at(s, 2000) == pytest.approx(20)
    assert value_at(s, 9000) == 30


def test_time_to_exhaustion() -> None:
    assert time_to_exhaustion_ms(100, 10) == 10_000
    assert time_to_exhaustion_ms(-5, 10) == 0


def test_a_paced_trace_reads_its_pace_whatever_the_sampling() -> None:
    """One unit every 9 s, then every 15 s, alternating (0.067-0.111/s, 0.083/s on average),
    sampled at each unit *and* half a second before it (a dashboard read just ahead of a
    settle): every short interval holds a whole unit, which is what pushed a moving average of
    the intervals' rates to several times the pace."""
    series = BurnSeries(horizon_ms=HOUR, min_interval_ms=0)
    t, used = 0, 0
    series.add(0, 0)
    while t < 2 * HOUR:
        for gap in (9_000, 15_000):
            series.add(t + gap - 500, used)
            t += gap
            used += 1
            series.add(t, used)
    assert series.rate(t) == pytest.approx(2 / 24, rel=0.02)
    remaining = 1000 - used / 2  # an hourly window's limit of 1000, half the use still in it
    assert time_to_exhaustion_ms(remaining, series.rate(t)) == pytest.approx(
        remaining * 12_000, rel=0.02
    )


def test_a_burst_counts_once_over_the_horizon() -> None:
    """An hour of nothing, then 20 in one second: 20 per hour, not "exhaustion in 11 s"."""
    series = BurnSeries(horizon_ms=HOUR)
    for t in range(0, HOUR + 1, 5_000):
        series.add(t, 0)
    series.add(HOUR + 1_000, 20)
    rate = series.rate(HOUR + 1_000)
    assert rate == pytest.approx(20 / 3_600, rel=0.01)
    ttl = time_to_exhaustion_ms(80, rate)
    assert ttl is not None
    assert ttl == pytest.approx(4 * HOUR, rel=0.01)  # 80 left at 20 an hour


def test_a_burst_soon_after_start_is_spread_over_what_was_seen() -> None:
    """No rate before a minute; then the burst over the time since the first sample."""
    series = BurnSeries(horizon_ms=HOUR, min_interval_ms=0)
    for t, used in ((0, 0), (400, 1), (800, 2), (1_000, 20)):
        series.add(t, used)
    assert series.rate(1_000) == 0
    assert series.rate(MIN_SPAN_MS - 1) == 0
    assert series.rate(MIN_SPAN_MS) == pytest.approx(20 / 60)
    assert series.rate(2 * MIN_SPAN_MS) == pytest.approx(20 / 120)  # read later, no new sample


def test_an_idle_pool_burns_nothing_once_the_horizon_passes_its_use() -> None:
    series = BurnSeries(horizon_ms=HOUR)
    for i in range(121):  # 600 units over the first 10 minutes, then idle
        series.add(i * 5_000, min(i, 120) * 5)
    assert series.rate(10 * 60_000) == pytest.approx(600 / 600)
    assert series.rate(HOUR) == pytest.approx(600 / 3_600, rel=0.01)
    assert series.rate(HOUR + 10 * 60_000) == 0
    assert time_to_exhaustion_ms(100, series.rate(2 * HOUR)) is None


def test_the_horizon_is_the_windows() -> None:
    """The same trace over a 5-hour window: the pace of five hours."""
    five = BurnSeries(horizon_ms=5 * HOUR)
    hourly = BurnSeries(horizon_ms=HOUR)
    for t in range(0, 5 * HOUR + 1, 60_000):  # 1/s for the first hour, then idle
        used = min(t, HOUR) / 1000
        five.add(t, used)
        hourly.add(t, used)
    assert five.rate(5 * HOUR) == pytest.approx(3_600 / (5 * 3_600), rel=0.01)
    assert hourly.rate(5 * HOUR) == 0


def test_series_is_bounded_throttled_and_its_head_fresh() -> None:
    series = BurnSeries(horizon_ms=HOUR, maxlen=12, min_interval_ms=5_000)
    assert series.due(0)
    for t in range(0, 3 * HOUR, 5_000):
        series.add(t, t / 1000)
    assert len(series.samples) <= 12 + 2
    assert series.samples[-1].t_ms == 3 * HOUR - 5_000  # the newest always kept
    assert series.samples[0].t_ms <= 2 * HOUR - 5_000  # reaches back a whole horizon
    assert series.rate() == pytest.approx(1.0)
    assert not series.due(3 * HOUR - 1)
    assert series.due(3 * HOUR)
    series.add(50_000, 1)  # out of order is ignored
    assert series.samples[-1].t_ms == 3 * HOUR - 5_000


def test_a_counter_reset_starts_the_series_over() -> None:
    series = BurnSeries(horizon_ms=HOUR, min_interval_ms=0)
    series.add(0, 100)
    series.add(120_000, 200)
    series.add(130_000, 5)  # the store forgot the counter
    assert series.samples == (Sample(130_000, 5),)
    assert series.rate(300_000) == 0
