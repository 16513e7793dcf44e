"""The standing a key is told (``x-ratelimit-remaining``, the routing view): never room it may
not use. In active mode that includes the room it must leave for keys waiting below their share
(issue 17)."""

from __future__ import annotations

import pytest

from fairgate.quota.decision import DimensionCheck, Outcome, evaluate
from fairgate.quota.engine import _status
from fairgate.quota.model import Policy
from fairgate.quota.units import Unit, Window
from fairgate.quota.window import Count

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
    (free,) = _status((_check(0),), totals, mine, NOW, 0.5, False)
    assert free.remaining == pytest.approx(40)  # its share: 80 − 40 (the pool has 50)
    (held,) = _status((_check(30),), totals, mine, NOW, 0.5, False)
    assert held.remaining == pytest.approx(20)  # 100 − 50 − 30 held for the waiting keys
    assert held.limit == 80


def test_a_key_held_back_is_told_it_has_no_room() -> None:
    check = _check(60)
    totals, mine = (Count(prev=0, curr=50),), (Count(prev=0, curr=10),)
    verdict = evaluate((check,), [(50.0, 10.0)], Policy.HARD, 0.5)
    assert verdict.outcome is Outcome.BLOCK  # 50 + 1 + 60 > 100: the request waits
    (st,) = _status((check,), totals, mine, NOW, 0.5, False)
    assert st.remaining == 0
