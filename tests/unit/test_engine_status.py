"""The standing a key is told (``x-ratelimit-remaining``, the routing view): never room it may
not use. In active mode that includes the room it must leave for keys waiting below their share
(issue 17)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import DimensionCheck, Outcome, Scope, evaluate
from fairgate.quota.model import Policy
from fairgate.quota.outcomes import dimension_status
from fairgate.quota.window import Anchor, Count, window_end_ms

HOUR = Window.HOURLY.ms
NOW = 1_700_002_800_000 + 30 * 60_000  # half an hour into an hourly bucket


def _check(reserve: float) -> DimensionCheck:
    return DimensionCheck(
        key="requests/hourly",
        unit=Unit.REQUESTS,
        window_ms=HOUR,
        limit=100,
        fair_share=80,
        cap=None,
        cost=1,
        reserve=reserve,
    )


def test_remaining_subtracts_the_room_held_for_waiting_keys() -> None:
    totals, mine = (Count(prev=0, curr=50),), (Count(prev=0, curr=40),)
    (free,) = dimension_status((_check(0),), totals, mine, NOW, 0.5, False)
    assert free.remaining == pytest.approx(40)  # its share: 80 − 40 (the pool has 50)
    (held,) = dimension_status((_check(30),), totals, mine, NOW, 0.5, False)
    assert held.remaining == pytest.approx(20)  # 100 − 50 − 30 held for the waiting keys
    assert held.limit == 80


def test_a_key_held_back_is_told_it_has_no_room() -> None:
    check = _check(60)
    totals, mine = (Count(prev=0, curr=50),), (Count(prev=0, curr=10),)
    verdict = evaluate((check,), [(50.0, 10.0, 10.0)], Policy.HARD, 0.5)
    assert verdict.outcome is Outcome.BLOCK  # 50 + 1 + 60 > 100: the request waits
    (st,) = dimension_status((check,), totals, mine, NOW, 0.5, False)
    assert st.remaining == 0


def _reference_status(
    checks: tuple[DimensionCheck, ...],
    totals: tuple[Count, ...],
    mine: tuple[Count, ...],
    now: int,
    threshold: float,
    reserved: bool,
) -> list[tuple[str, str, float, float, int]]:
    """The standing written with the window helpers themselves (what ``_status`` inlines)."""
    out = []
    for c, t, m in zip(checks, totals, mine, strict=True):
        w = c.window_ms
        total = t.value(now, w) + (c.cost if reserved and c.scope == "pool" else 0.0)
        used = m.value(now, w) + (c.cost if reserved else 0.0)
        if c.scope == "model":
            limit, remaining = c.limit, c.limit - used
        else:
            strict = max(total / c.limit, c.signal) >= threshold
            limit = c.fair_share if strict else c.limit
            remaining = min(c.limit - total - c.reserve, limit - used)
            if c.cap is not None:
                limit, remaining = min(limit, c.cap), min(remaining, c.cap - used)
        reset = window_end_ms(now, w, c.anchor) - now
        out.append((c.key, c.unit.value, limit, max(0.0, remaining), reset))
    return out


_counts = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    prev=st.tuples(_counts, _counts),
    curr=st.tuples(_counts, _counts),
    cost=_counts,
    signal=st.floats(min_value=0, max_value=1),
    reserve=_counts,
    cap=st.none() | st.floats(min_value=1, max_value=1e6),
    scope=st.sampled_from(list(Scope)),
    anchored=st.booleans(),
    reserved=st.booleans(),
    offset=st.integers(min_value=0, max_value=5 * HOUR),
    window=st.sampled_from([w.ms for w in Window]),
)
def test_status_is_the_window_arithmetic_to_the_last_bit(
    prev: tuple[float, float],
    curr: tuple[float, float],
    cost: float,
    signal: float,
    reserve: float,
    cap: float | None,
    scope: Scope,
    anchored: bool,
    reserved: bool,
    offset: int,
    window: int,
) -> None:
    now = NOW + offset
    anchor = Anchor(now + window // 3, now // window) if anchored else None
    check = DimensionCheck(
        "tokens/5h", Unit.TOKENS, window, 1e6, 4e5, cap, cost, signal, scope, reserve, anchor
    )
    totals = (Count(prev[0], curr[0], anchor),)
    mine = (Count(prev[1], curr[1], anchor),)
    got = dimension_status((check,), totals, mine, now, 0.5, reserved)
    want = _reference_status((check,), totals, mine, now, 0.5, reserved)
    assert [(s.key, s.unit, s.limit, s.remaining, s.reset_ms) for s in got] == want
    assert type(got[0].unit) is str
