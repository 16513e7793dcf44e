"""The forwarding frames' codec (issue 48, item 1): every record and enum a forwarder sends or
an owner answers comes back equal (enum members identical), and every enum inside those
records has the compact encoding, so a record type that gains an enum field cannot fall back
to pickle's slow path unnoticed."""

from __future__ import annotations

import enum
import pickle
import typing
from typing import Any

import pytest

from fairgate.domain.units import Unit
from fairgate.quota.decision import DimensionCheck, Outcome, Reason, Scope, Verdict
from fairgate.quota.hold import HoldTicket, QueueFull
from fairgate.quota.model import Policy
from fairgate.quota.ports import (
    AdmitRequest,
    AdmitResult,
    CounterRef,
    GcResult,
    PoolCounts,
    UsageItem,
)
from fairgate.quota.window import Anchor, Count
from fairgate.store.sqlite import forward
from fairgate.store.sqlite.forward import _ENUMS, _RECORDS, _Framer, _Frames

ANCHOR = Anchor(1_700_000_000_000, 3, "conn-a")
CHECK = DimensionCheck(
    key="tokens/5h",
    unit=Unit.TOKENS,
    window_ms=18_000_000,
    limit=1e6,
    fair_share=5e5,
    cap=2e5,
    cost=120.0,
    signal=0.25,
    scope=Scope.MODEL,
    reserve=10.0,
    anchor=ANCHOR,
    window_share=True,
)
REQUEST = AdmitRequest(
    pool_id="p",
    key_id="k",
    checks=(CHECK, DimensionCheck("requests/hourly", Unit.REQUESTS, 3_600_000, 10, 5, None, 1)),
    policy=Policy.BURST,
    threshold=0.5,
    reservation_id="r1",
    now_ms=1_700_000_000_123,
    lease_ms=60_000,
    hold=HoldTicket("w1", 1, 2, 50.0, per_key=3, per_pool=9),
)
RESULT = AdmitResult(
    verdict=Verdict(Outcome.BLOCK, Reason.FAIR_SHARE, 1),
    totals=(Count(1.0, 2.0), Count(0.0, 3.0, ANCHOR)),
    mine=(Count(0.5, 1.0), Count()),
    reserved=False,
    waiting=True,
    queue_full=QueueFull.POOL,
)
USAGE = [UsageItem("tokens/5h", 18_000_000, 40.0, Scope.MODEL, ANCHOR), UsageItem("r", 1, 1.0)]

#: one of each: the calls of a frame (``(id, method, args)``) and the answers (``(id, ok,
#: value)``) as they cross the socket
CALLS: list[tuple[int, str, tuple[Any, ...]]] = [
    (1, "admit", (REQUEST,)),
    (2, "settle", ("p", "k", "r1", USAGE, 5)),
    (3, "record", ("p", "k", USAGE, 6)),
    (4, "peek", ("p", "k", [CounterRef("tokens/5h", 18_000_000, ANCHOR)], 7)),
    (5, "release", ("p", "r1", 8)),
]
ANSWERS: list[tuple[int, bool, Any]] = [
    (1, True, RESULT),
    (2, True, None),
    (4, True, {"tokens/5h": Count(1.0, 2.0, ANCHOR)}),
    (6, True, PoolCounts({"a": Count(1.0, 2.0)}, {"k": {"a": Count(0.0, 1.0)}})),
    (7, True, GcResult(buckets=3, active_keys=1, reservations=2, skipped=True)),
    (8, True, ANCHOR),
    (9, False, ("exists", "reservation id 'r1' already exists")),
]


def _through(payload: object) -> Any:
    """``payload`` framed as a forwarder or an owner frames it, then split and read back."""
    data = _Framer().frame(payload)
    (one,) = _Frames().feed(data)
    return pickle.loads(one)


@pytest.mark.parametrize("payload", [CALLS, ANSWERS], ids=["calls", "answers"])
def test_every_forwarded_record_round_trips(payload: list[Any]) -> None:
    assert _through(payload) == payload


def test_enum_members_come_back_as_themselves() -> None:
    """Read by index: the very members (``is``), in every position they take."""
    back = _through([REQUEST, RESULT, USAGE])
    req, res, usage = back
    assert req.policy is Policy.BURST
    assert [c.unit for c in req.checks] == [Unit.TOKENS, Unit.REQUESTS]
    assert req.checks[0].scope is Scope.MODEL
    assert req.checks[1].scope is Scope.POOL
    assert res.verdict.outcome is Outcome.BLOCK
    assert res.verdict.reason is Reason.FAIR_SHARE
    assert res.queue_full is QueueFull.POOL
    assert usage[0].scope is Scope.MODEL
    for member in forward._MEMBERS:  # every member of every enum, alone in a frame
        assert _through(member) is member


def test_enum_members_are_framed_by_index_not_by_class() -> None:
    """A member is written as a small index, never as its class and value (pickle's own way,
    which calls the enum class again on load)."""
    data = _Framer().frame([Scope.MODEL, Policy.SOFT, Unit.TOKENS])
    assert b"Scope" not in data
    assert b"Policy" not in data
    assert b"Unit" not in data
    assert b"model" not in data
    assert b"tokens" not in data


def _enums_in(hint: Any) -> set[type[enum.Enum]]:
    """The enum classes a type hint names (through unions, tuples, mappings)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {hint}
    found: set[type[enum.Enum]] = set()
    for arg in typing.get_args(hint):
        found |= _enums_in(arg)
    return found


def test_every_enum_inside_a_forwarded_record_has_the_compact_encoding() -> None:
    """Walks the fields of every record the forwarder encodes: an enum field whose class is
    not in ``_ENUMS`` fails here (it would still cross, the slow way)."""
    seen: set[type[enum.Enum]] = set()
    for cls in _RECORDS:
        for hint in typing.get_type_hints(cls).values():
            seen |= _enums_in(hint)
    assert seen, "the walk found no enum at all: it is not looking"
    assert seen <= set(_ENUMS), f"not encoded compactly: {seen - set(_ENUMS)}"
