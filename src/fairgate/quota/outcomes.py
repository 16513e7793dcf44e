"""What the quota engine hands out: tickets, admissions, a key's standing per dimension, the
store's health, and the window arithmetic of the ``x-ratelimit-*`` headers.

Plain records and pure functions, apart from the engine's orchestration
(:mod:`fairgate.quota.engine`), so the request path, the admin API and the tests read them
without the engine's store, journal and caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from fairgate.domain.units import Unit
from fairgate.quota.decision import DimensionCheck, Outcome, Reason
from fairgate.quota.hold import QueueFull
from fairgate.quota.window import Count, window_end_ms
from fairgate.records import camel, record

__all__ = [
    "ALLOW_UNGOVERNED",
    "Admission",
    "DimensionStatus",
    "Standing",
    "StoreHealth",
    "Ticket",
    "dimension_status",
    "unread_status",
]


@record(eq=False)
class Ticket:
    """What settle/release need to find the reservation again. ``reserved`` is False for an
    admission that failed open: nothing to release, and its settle is plain usage.

    A ticket is one reservation, so it equals only itself (``eq=False``: identity, as its
    reservation id is unique): the request path keeps the open ones in a set, and a hash of
    every field would hash each check's eleven fields twice per request."""

    pool_id: str
    key_id: str
    reservation_id: str
    checks: tuple[DimensionCheck, ...]
    reserved: bool = True


@record
class DimensionStatus:
    """The key's standing on one counter, for ``x-ratelimit-*`` headers. ``remaining`` is None
    when the store could not be read (a fail-open admission, or a reply lost to a timeout):
    the limit and the reset are known from the pool, what is left is not."""

    key: str
    unit: str
    limit: float
    remaining: float | None
    reset_ms: int


@record
class Admission:
    outcome: Outcome
    reason: Reason | None = None
    dimension: str | None = None
    retry_after_ms: int | None = None
    ticket: Ticket | None = None
    status: tuple[DimensionStatus, ...] = ()
    fail_open: bool = False
    #: (``admission: hold``) the store holds this request in its pool's queue: refused for now,
    #: the engine waits and asks again
    waiting: bool = False
    #: (``admission: hold``) refused at once because the key's or the pool's queue is full
    queue_full: QueueFull | None = None
    #: (``admission: hold``) how long the request waited before this outcome (ms)
    waited_ms: int = 0

    @property
    def allowed(self) -> bool:
        return self.outcome is not Outcome.BLOCK

    @property
    def penalized(self) -> bool:
        return self.outcome is Outcome.PENALIZE


ALLOW_UNGOVERNED = Admission(Outcome.ALLOW)


@dataclass(frozen=True, slots=True)
class Standing:
    """A key's standing in a pool for one prospective request (:meth:`QuotaEngine.standing`):
    the outcome an admission would have, and per check its status and the pool's burn rate
    (units per second, 0 unknown)."""

    outcome: Outcome
    checks: tuple[DimensionCheck, ...]
    status: tuple[DimensionStatus, ...]
    burn_per_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What ``/health`` and the admin health API show about the quota store's availability."""

    down: bool
    down_since_ms: int | None
    outages: int
    #: timeouts the out-of-loop probe showed to be a busy event loop, not an outage
    slow_timeouts: int
    last_outage_ms: int | None
    fail_open: int
    store_errors: int
    last_error: str | None
    journal_pending: int
    journal_appended: int
    journal_replayed: int
    journal_dropped: int
    journal_compactions: int

    def as_json(self) -> dict[str, object]:
        """Every field under its camelCase name, the ``journal_*`` ones nested as ``journal``."""
        out: dict[str, object] = {}
        journal: dict[str, object] = {}
        for f in fields(self):
            short = f.name.removeprefix("journal_")
            (out if short == f.name else journal)[camel(short)] = getattr(self, f.name)
        out["journal"] = journal
        return out


#: A unit's text (``Unit.value`` is an enum property: a dictionary lookup is a third of it).
_UNIT_TEXT: Mapping[Unit, str] = {u: u.value for u in Unit}


def dimension_status(
    checks: tuple[DimensionCheck, ...],
    totals: tuple[Count, ...],
    mine: tuple[Count, ...],
    now_ms: int,
    threshold: float,
    reserved: bool,
    own: bool = False,
) -> tuple[DimensionStatus, ...]:
    """Remaining = what this key could still use now: its share in strict mode, the pool's free
    room in generous mode (never more than the pool has left), less the room it must leave for
    keys waiting below their share (active mode, ``DimensionCheck.reserve``): a key held back
    for a waiting one is never told it has room.

    ``own`` (the ``x-ratelimit-*`` headers a tenant reads): the key's own room in both modes,
    its share less its use, never the pool's free room in generous mode, which moved with every
    other key's request and let a tenant read their use request by request (issue 43, N11).
    The pool's room still caps it (a key is never told room the pool has not got), which can
    bind only once other keys use more than their own shares. The routing view keeps the
    generous room: what a key may borrow decides where it is sent, not what it is told.

    Every admission runs this for its ``x-ratelimit-*`` headers, so the window arithmetic of
    :meth:`~fairgate.quota.window.Count.value` and :func:`~fairgate.quota.window.window_end_ms`
    is written out here, once per check for both counts (the same expressions, so the same
    floats to the last bit; ``tests/unit/test_engine_status.py`` holds them together)."""
    out: list[DimensionStatus] = []
    for c, t, m in zip(checks, totals, mine, strict=True):
        w = c.window_ms
        start = now_ms // w * w  # the epoch bucket's start
        fade = 1.0 - (now_ms - start) / w  # what of the previous bucket still counts
        total = t.curr if t.anchor is not None else t.prev * fade + t.curr
        used = m.curr if m.anchor is not None else m.prev * fade + m.curr
        window = m.curr  # what a window_share check judges the share on
        if reserved:
            used += c.cost
            window += c.cost
            if c.scope == "pool":
                total += c.cost
        if c.scope == "model":
            limit, remaining = c.limit, c.limit - used
        else:
            strict = max(total / c.limit, c.signal) >= threshold
            limit = c.fair_share if strict or own else c.limit
            share_use = window if strict and c.window_share else used
            remaining = min(c.limit - total - c.reserve, limit - share_use)
            if c.cap is not None:
                limit, remaining = min(limit, c.cap), min(remaining, c.cap - used)
        anchor = c.anchor
        end = start + w if anchor is None else window_end_ms(now_ms, w, anchor)
        out.append(
            DimensionStatus(c.key, _UNIT_TEXT[c.unit], limit, max(0.0, remaining), end - now_ms)
        )
    return tuple(out)


def unread_status(checks: tuple[DimensionCheck, ...], now_ms: int) -> tuple[DimensionStatus, ...]:
    """What the headers can say without the store: each dimension's limit for this key (its
    share of the pool, as :func:`dimension_status` tells it, or the key's cap or model cap when
    lower) and when its window turns."""
    out = []
    for c in checks:
        limit = c.limit if c.scope == "model" else c.fair_share
        limit = limit if c.cap is None else min(limit, c.cap)
        reset = window_end_ms(now_ms, c.window_ms, c.anchor) - now_ms
        out.append(DimensionStatus(c.key, c.unit.value, limit, None, reset))
    return tuple(out)
