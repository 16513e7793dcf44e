"""``@record``: a frozen dataclass for the type checker, cheap to build at run time; equal and
hashed by its fields as a frozen dataclass is (``eq=False``: by identity)."""

from __future__ import annotations

import dataclasses

from fairgate.domain.units import Unit
from fairgate.quota.decision import DimensionCheck
from fairgate.quota.outcomes import Ticket
from fairgate.quota.window import Count
from fairgate.records import record


@record
class _Point:
    x: int
    y: str = "y"


@dataclasses.dataclass(frozen=True, slots=True)
class _FrozenPoint:
    x: int
    y: str = "y"


def test_a_record_compares_and_hashes_as_the_frozen_dataclass() -> None:
    a, b = _Point(1), _Point(1, "y")
    assert a == b
    assert hash(a) == hash(b) == hash(_FrozenPoint(1))
    assert a != _Point(2)
    assert len({a, b, _Point(2)}) == 2
    assert repr(a) == "_Point(x=1, y='y')"
    assert dataclasses.replace(a, x=3) == _Point(3)
    assert not hasattr(a, "__dict__")  # slots


def test_an_identity_record_equals_only_itself() -> None:
    check = DimensionCheck("requests/hourly", Unit.REQUESTS, 3_600_000, 10.0, 5.0, None, 1.0)
    one, two = Ticket("p", "k", "r1", (check,)), Ticket("p", "k", "r1", (check,))
    assert one in {one}
    assert one != two
    assert len({one, two}) == 2


def test_the_quota_records_keep_their_fields_and_values() -> None:
    check = DimensionCheck("requests/hourly", Unit.REQUESTS, 3_600_000, 10.0, 5.0, None, 1.0)
    assert check == DimensionCheck(
        "requests/hourly", Unit.REQUESTS, 3_600_000, 10.0, 5.0, None, 1.0
    )
    assert [f.name for f in dataclasses.fields(DimensionCheck)] == [
        "key",
        "unit",
        "window_ms",
        "limit",
        "fair_share",
        "cap",
        "cost",
        "signal",
        "scope",
        "reserve",
        "anchor",
        "window_share",
    ]
    assert Count(1.0, 2.0) == Count(1.0, 2.0, None)
    assert hash(Count(1.0, 2.0)) == hash(Count(1.0, 2.0))
