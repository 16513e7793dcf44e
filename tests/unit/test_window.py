"""Two-bucket sliding window arithmetic at bucket boundaries (SPEC §2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.domain.units import WINDOW_MS, Window
from fairgate.quota.window import (
    Anchor,
    Count,
    bucket_index,
    ms_until_at_most,
    ms_until_under_line,
    sliding_value,
)

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


def test_ms_until_under_line() -> None:
    """A block by a paced budget's room: the room falls (the line rises) while the previous
    bucket fades; both linear within the bucket."""
    assert ms_until_under_line(Count(0, 5), 5, 0.001, T, H) == 0
    # nothing fades (no previous bucket): the line alone rises 1 per second to 10 over 5
    assert ms_until_under_line(Count(0, 10), 5, 0.001, T, H) == 5000
    # the line rises 1/s and the previous bucket of 3,600 fades 1/s: 20 over, 10 s
    assert ms_until_under_line(Count(3600, 20), 3600, 0.001, T, H) == 10_000
    # not before the bucket turns: None (the caller falls back on the total alone)
    assert ms_until_under_line(Count(0, 10), 5, 1e-9, T, H) is None
    assert ms_until_under_line(Count(0, 10), 5, 0.0, T, H) is None
    # an anchored counter does not fade: the line alone, up to the provider's reset
    anchored = Count(500, 10, anchor=Anchor(T + H // 2, 0))
    assert ms_until_under_line(anchored, 5, 0.001, T, H) == 5000


@given(
    prev=st.floats(0, 1e6),
    curr=st.floats(0, 1e6),
    offset=st.integers(0, H - 1),
    frac=st.floats(0, 0.999),
    rise=st.floats(1e-6, 1.0),
)
def test_ms_until_under_line_is_exact(
    prev: float, curr: float, offset: int, frac: float, rise: float
) -> None:
    now = T + offset
    c = Count(prev, curr)
    target = c.value(now, H) * frac
    wait = ms_until_under_line(c, target, rise, now, H)
    if wait is None:  # the line and the fade do not meet in this bucket
        end = (bucket_index(now, H) + 1) * H
        assert c.value(end - 1, H) > target + rise * (end - 1 - now) - 1e-6 * max(1.0, prev + curr)
        return
    later = now + wait
    assert bucket_index(later, H) == bucket_index(now, H)
    assert c.value(later, H) <= target + rise * wait + 1e-6 * max(1.0, prev + curr)
    if wait > 1:
        earlier = later - 2
        assert c.value(earlier, H) >= target + rise * (wait - 2) - 1e-6 * max(1.0, prev + curr)
