"""Windows anchored to the provider's reset (``fairgate.quota.window``): the pure arithmetic and
the one re-anchoring rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairgate.domain.units import Unit, Window, WindowAnchor
from fairgate.quota.decision import compile_checks
from fairgate.quota.model import Allocation, Dimension
from fairgate.quota.window import (
    ANCHOR_TOLERANCE_MS,
    Anchor,
    Count,
    bucket_index,
    ms_until_at_most,
    natural_index,
    reanchor,
    window_end_ms,
)
from quota_support import make_pool

MIN = 60_000
W = 300 * MIN  # the 5-hour window
T = 1_782_297_000_000  # 2026-06-24T10:30Z: mid 5-hour epoch bucket (08:00-13:00)
# the provider's window: first use at 09:00, so it resets at 14:00
R = T - 90 * MIN + W
A = Anchor(R, natural_index(R, W), "codex-1")


def test_the_worked_example_of_the_module() -> None:
    """W = 5 h, a reading at 10:30 says "resets at 14:00": the window is 09:00-14:00; at 13:59
    a count is the current bucket; at 14:00 the next window (14:00-19:00) starts at 0."""
    assert R - W == T - 90 * MIN  # 09:00
    before, at = R - 1, R
    assert bucket_index(before, W, A) == A.index
    assert bucket_index(at, W, A) == A.index + 1
    assert bucket_index(R - W, W, A) == A.index  # the first ms of the window
    assert window_end_ms(T, W, A) == R
    assert window_end_ms(R, W, A) == R + W  # later windows follow at the same phase
    assert bucket_index(R + 3 * W + 5, W, A) == A.index + 4


def test_anchored_indices_stay_in_the_epoch_index_space() -> None:
    # the retention and reservation rules compare an index with floor(now / W)
    for now in (R - W, T, R - 1):
        assert abs(bucket_index(now, W, A) - bucket_index(now, W)) <= 1


def test_epoch_aligned_without_an_anchor() -> None:
    assert bucket_index(T, W) == T // W
    assert window_end_ms(T, W) == (T // W + 1) * W


def test_an_anchored_count_is_its_current_bucket_and_drops_at_the_reset() -> None:
    c = Count(prev=80.0, curr=30.0, anchor=A)
    assert c.value(T, W) == 30.0  # the previous window never counts: the provider reset it
    assert Count(80.0, 30.0).value(T, W) > 30.0  # the sliding window would still count it
    # over the target: blocked until the provider's reset, then 0
    assert ms_until_at_most(c, 20.0, T, W) == R - T
    assert ms_until_at_most(c, 30.0, T, W) == 0
    assert ms_until_at_most(c, -1.0, T, W) is None


def test_first_reading_anchors_and_carries_the_current_epoch_bucket() -> None:
    got = reanchor(None, R, W, T, "codex-1")
    assert got is not None
    assert got.reset_ms == R
    assert got.source == "codex-1"
    # never an index below the one in use (the epoch bucket holding this window's use so far)
    assert got.index >= bucket_index(T, W)
    assert got.index == max(natural_index(R, W), bucket_index(T, W))


def test_the_same_window_restated_changes_nothing() -> None:
    assert reanchor(A, R, W, T, "codex-1") is None
    assert reanchor(A, R + 2_000, W, T, "codex-1") is None  # a second's jitter
    assert reanchor(A, R - ANCHOR_TOLERANCE_MS, W, T, "codex-1") is None


def test_the_next_window_at_the_same_phase_moves_the_reset_not_the_counts() -> None:
    later = R + W + 1_000
    got = reanchor(A, later, W, R + 10 * MIN, "codex-1")
    assert got == Anchor(later, A.index + 1, "codex-1")
    # the bucket in use does not change by it
    assert bucket_index(R + 10 * MIN, W, got) == bucket_index(R + 10 * MIN, W, A)


def test_a_reading_of_another_member_does_not_move_a_live_anchor() -> None:
    other = T + 2 * 60 * MIN + W // 3  # another account, another phase
    assert reanchor(A, other, W, T, "codex-2") is None
    assert reanchor(A, R + W, W, T, "codex-2") is None


def test_another_member_takes_over_once_the_anchor_lapsed() -> None:
    now = R + 30 * MIN  # the owner's window ended, it stated no new one
    got = reanchor(A, now + W - 5 * MIN, W, now, "codex-2")
    assert got is not None
    assert got.source == "codex-2"
    assert got.index >= bucket_index(now, W, A)


def test_early_reset_starts_a_fresh_bucket() -> None:
    """The provider reset the window at 11:00 (before its 14:00): the next reading says
    "resets at 16:00". The counts of 09:00-11:00 must not carry into the new window."""
    now = T + 30 * MIN  # 11:00
    got = reanchor(A, now + W, W, now, "codex-1")
    assert got is not None
    assert got.index == bucket_index(now, W, A) + 1
    assert bucket_index(now, W, got) == got.index
    assert window_end_ms(now, W, got) == now + W


def test_first_use_after_idle_keeps_the_use_since_the_last_reset() -> None:
    """The window ended at 14:00 unused; at 16:20 the first request starts a new one (resets at
    21:20). The bucket in use since 14:00 holds only this new window's use: kept."""
    now = R + 140 * MIN
    got = reanchor(A, now + W, W, now, "codex-1")
    assert got is not None
    assert got.index == max(natural_index(now + W, W), bucket_index(now, W, A))
    assert got.index >= bucket_index(now, W, A)


def test_resets_that_cannot_be_this_window_are_ignored() -> None:
    assert reanchor(A, T - 1, W, T, "codex-1") is None  # in the past
    assert reanchor(A, T, W, T, "codex-1") is None
    assert reanchor(None, T + W + ANCHOR_TOLERANCE_MS + 1, W, T, "codex-1") is None  # > W away


@given(
    st.lists(
        st.tuples(
            st.integers(1, 3 * W),  # time passing
            st.integers(1, W),  # the stated reset, ahead of now
            st.sampled_from(["codex-1", "codex-2"]),
        ),
        max_size=30,
    )
)
def test_the_index_in_use_never_goes_back(steps: list[tuple[int, int, str]]) -> None:
    """Whatever readings arrive, the bucket the current window is counted in never moves to an
    older one (that would revive counts of a window that ended), and it always contains now."""
    now, anchor = T, None
    for advance, ahead, source in steps:
        before = bucket_index(now, W, anchor)
        got = reanchor(anchor, now + ahead, W, now, source)
        if got is not None:
            anchor = got
        assert bucket_index(now, W, anchor) >= before
        assert now < window_end_ms(now, W, anchor) <= now + W
        now += advance


def test_checks_carry_an_anchor_only_for_provider_anchored_dimensions() -> None:
    """``compile_checks`` is the one place a dimension gets its anchor: a percent window with
    the default ``window_anchor``, never an epoch one, another unit or a model cap."""
    pool = make_pool(
        Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100),
        Dimension(Unit.PERCENT, Window.WEEKLY, 100, WindowAnchor.EPOCH),
        Dimension(Unit.REQUESTS, Window.FIVE_HOURS, 100),
        allocations=(Allocation("a", 100),),
        provider="codex",
        connections=("codex-1",),
    )
    anchors = {"percent/5h": A, "percent/weekly": A, "requests/5h": A}
    alloc = pool.allocation("a")
    assert alloc is not None
    checks = compile_checks(pool, alloc, {Unit.PERCENT: 1.0}, anchors=anchors)
    assert [c.anchor for c in checks] == [A, None, None]
    assert [c.anchor for c in compile_checks(pool, alloc, {})] == [None, None, None]
