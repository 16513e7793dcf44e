"""Each key's dominant dimension and share in the pool usage snapshot (issue 18)."""

from __future__ import annotations

import pytest

from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Allocation, Dimension, ShareMode
from fairgate.quota.usage import build_usage
from fairgate.quota.window import Count
from quota_support import make_pool

REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 100)
TOK = Dimension(Unit.TOKENS, Window.HOURLY, 100_000)
WEEK = Dimension(Unit.TOKENS, Window.WEEKLY, 0)  # unknown limit: not enforced


def test_dominant_share_is_the_largest_share_of_an_enforced_dimension() -> None:
    pool = make_pool(
        REQ,
        TOK,
        WEEK,
        allocations=(Allocation("chat", 50), Allocation("agent", 50), Allocation("idle", 0)),
        provider="openai",
        share_mode=ShareMode.ACTIVE,
    )
    per_key = {
        "chat": {REQ.key: Count(0, 40), TOK.key: Count(0, 20_000), WEEK.key: Count(0, 9e9)},
        "agent": {REQ.key: Count(0, 4), TOK.key: Count(0, 40_000)},
    }
    usage = build_usage(pool, {}, per_key, 0, 0.5, {})
    for dim in usage.dimensions:  # the same in every dimension's row of a key
        rows = {k.key_id: k for k in dim.keys}
        assert (rows["chat"].dominant_dimension, rows["chat"].dominant_share) == (
            REQ.key,
            pytest.approx(0.4),
        )
        assert (rows["agent"].dominant_dimension, rows["agent"].dominant_share) == (
            TOK.key,
            pytest.approx(0.4),
        )
        assert (rows["idle"].dominant_dimension, rows["idle"].dominant_share) == (None, 0.0)
