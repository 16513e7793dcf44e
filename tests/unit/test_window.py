"""Two-bucket sliding window arithmetic at bucket boundaries (SPEC §2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.quota.units import WINDOW_MS, Window
from fairgate.quota.window import Count, bucket_index, ms_until_at_most, sliding_value

H = 3_600_000
T = 1_700_002_800_000  # a multiple of one hour


def test_window_lengths() -> None:
    assert WINDOW_MS[Window.HOURLY] == 3_600_000
    assert WINDOW_MS[Window.FIVE_HOURS] == 18_000_000
    assert WINDOW_MS[Window.DAILY] == 86_400_000
    assert WINDOW_MS[Window.WEEKLY] == 604_800_000
    assert WINDOW_MS[Window.MONTHLY] == 2_592_000_000


def test_worked_example_from_docstring() -> None:
    assert sliding_value(40, 10, T + H // 4, H) == 40


def test_boundaries() -> None:
    assert T % H == 0
    assert bucket_index(T - 1, H) + 1 == bucket_index(T, H)
    # first ms of a bucket: prev counts in full
    assert sliding_value(10, 0, T, H) == 10
    # last ms: prev almost gone
    assert sliding_value(10, 0, T + H - 1, H) == pytest.approx(10 / H)
    # half way
    assert sliding_value(10, 4, T + H // 2, H) == 9


def test_ms_until_at_most() -> None:
    assert ms_until_at_most(Count(0, 5), 5, T, H) == 0
    assert ms_until_at_most(Count(0, 5), -1, T, H) is None
    # curr 10 now at bucket start; target 5: wait the rest of this bucket + half of the next
    assert ms_until_at_most(Count(0, 10), 5, T, H) == H + H // 2
    # only prev: 10 → 5 at half of this bucket
    assert ms_until_at_most(Count(10, 0), 5, T, H) == H // 2
    # target 0 with curr > 0: two full fades
    assert ms_until_at_most(Count(0, 10), 0, T, H) == 2 * H


@given(
    prev=st.floats(0, 1e6),
    curr=st.floats(0, 1e6),
    offset=st.integers(0, H - 1),
    frac=st.floats(0, 0.999),
)
def test_ms_until_at_most_is_exact(prev: float, curr: float, offset: int, frac: float) -> None:
    now = T + offset
    c = Count(prev, curr)
    target = c.value(now, H) * frac
    wait = ms_until_at_most(c, target, now, H)
    assert wait is not None
    later = now + wait
    # after the wait the buckets have shifted by however many windows passed
    shift = bucket_index(later, H) - bucket_index(now, H)
    moved = c if shift == 0 else (Count(curr, 0) if shift == 1 else Count())
    assert moved.value(later, H) <= target + 1e-6 * max(1.0, prev + curr)
    if wait > 1:
        earlier = later - 2
        shift_e = bucket_index(earlier, H) - bucket_index(now, H)
        moved_e = c if shift_e == 0 else (Count(curr, 0) if shift_e == 1 else Count())
        assert moved_e.value(earlier, H) >= target - 1e-6 * max(1.0, prev + curr)
