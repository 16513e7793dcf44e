"""Windowed per-target metrics with bounded memory (fairgate.routing.metrics)."""

from __future__ import annotations

import pytest

from fairgate.routing.metrics import MINUTE_MS, TargetMetrics

T0 = 1_700_002_800_000  # minute-aligned


def test_latency_ewma_and_p95_over_the_last_n_successes() -> None:
    m = TargetMetrics(samples=100, ewma_alpha=0.5)
    m.record("k", 100, True, T0)
    m.record("k", 200, True, T0)
    assert m.ewma_ms("k") == pytest.approx(150)
    m2 = TargetMetrics(samples=100)
    for i in range(1, 101):
        m2.record("k", float(i), True, T0)
    assert m2.p95_ms("k") == 95
    m2.record("k", 5_000, False, T0)  # failures do not count as latency
    assert m2.p95_ms("k") == 95
    for _ in range(100):  # the ring forgets the old samples
        m2.record("k", 10.0, True, T0)
    assert m2.p95_ms("k") == 10
    assert m2.p95_ms("nothing") is None
    assert m2.ewma_ms("nothing") is None


def test_success_rate_and_uses_cover_only_the_last_window() -> None:
    m = TargetMetrics(window_minutes=15)
    for _ in range(3):
        m.record("k", 100, True, T0, tokens=10)
    m.record("k", 100, False, T0 + 1_000)
    assert m.success_rate("k", T0 + 2_000) == pytest.approx(0.75)
    assert m.error_rate("k", T0 + 2_000) == pytest.approx(0.25)
    assert m.uses("k", T0 + 2_000) == 4
    assert m.tokens("k", T0 + 2_000) == 30
    later = T0 + 14 * MINUTE_MS
    assert m.uses("k", later) == 4  # still inside the 15-minute window
    m.record("k", 100, True, later)
    gone = T0 + 15 * MINUTE_MS
    assert m.uses("k", gone) == 1  # the first minute fell out
    assert m.success_rate("k", gone) == 1.0
    assert m.success_rate("k", T0 + 60 * MINUTE_MS) is None


def test_late_records_land_in_their_minute() -> None:
    m = TargetMetrics(window_minutes=5)
    m.record("k", 1, True, T0 + 3 * MINUTE_MS)
    m.record("k", 1, False, T0 + 1 * MINUTE_MS)  # an attempt that started earlier, ends late
    m.record("k", 1, True, T0 + 3 * MINUTE_MS + 5)
    assert m.uses("k", T0 + 3 * MINUTE_MS) == 3
    assert m.success_rate("k", T0 + 3 * MINUTE_MS) == pytest.approx(2 / 3)
    assert m.minute_count("k") == 2


def test_last_known_good_and_stats() -> None:
    m = TargetMetrics()
    m.record("k", 100, True, T0)
    m.record("k", 100, False, T0 + 10)
    assert m.last_ok_ms("k") == T0
    assert m.last_error_ms("k") == T0 + 10
    s = m.stats("k", T0 + 20)
    assert (s.requests, s.errors, s.success_rate) == (2, 1, 0.5)
    assert m.last_ok_ms("other") is None


def test_memory_is_bounded_in_targets_samples_and_minutes() -> None:
    m = TargetMetrics(max_targets=100, samples=256, window_minutes=15)
    for i in range(10_000):
        m.record(f"t{i}", 10.0, True, T0 + i * MINUTE_MS)
    assert len(m) == 100
    assert "t9999" in m
    assert "t0" not in m
    for i in range(10_000):
        m.record("hot", float(i), i % 3 != 0, T0 + i * 10_000)
    assert m.sample_count("hot") <= 256
    assert m.minute_count("hot") <= 15
    assert len(m) == 100


def test_recording_refreshes_lru_position() -> None:
    m = TargetMetrics(max_targets=2)
    m.record("a", 1, True, T0)
    m.record("b", 1, True, T0)
    m.record("a", 1, True, T0)  # a is now the most recent
    m.record("c", 1, True, T0)
    assert set(m.keys()) == {"a", "c"}
