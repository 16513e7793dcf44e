"""The ``QuotaStore`` port: counters that admit, settle and release atomically.

Drivers: ``sqlite`` (default) and ``redis``. Both keep, per (pool, key, counter), two buckets of
the sliding window (SPEC §2), pool totals kept incrementally beside them, reservations with a
lease, a per-pool active set (``active`` share mode), a monotonic cumulative total per pool
counter (burn rate) and the pool's provider-anchored windows (one
:class:`~fairgate.quota.window.Anchor` per counter). The caller passes a counter's anchor with
each check, usage item and counter reference; the store computes the bucket from it.

Contract of ``admit`` (the promise tested on every driver): in ONE atomic step, reclaim a few
expired reservations of the pool, read every check's pool total and key count, evaluate the rule of
:func:`fairgate.quota.decision.evaluate`, and, when allowed, add each check's cost to the current
bucket (key, and pool total for pool-scope checks) and record the reservation. Because the
reservation is visible to the next admission, N concurrent admissions cannot all see the same
headroom: with a limit of 5 requests exactly 5 of 100 racers win.

Edges both drivers agree on (the contract suite pins them): a reservation is expired when
``expires_ms <= now`` and is reclaimed by an admission of its pool at most about a second
later (a driver may look at most once a second per pool); re-using a reservation id that is
still held raises ``ValueError``; the key id ``*`` is reserved for pool totals
(``ValueError``); ``admit`` and ``settle`` mark the key active, ``record`` does not;
un-reserving never takes a counter below zero; ``gc`` also reclaims expired reservations of
pools nobody admits to any more.

Outages: a driver lists, in a class attribute ``unavailable_errors``, the exceptions that mean
"the backend cannot be reached or cannot take writes right now" (as opposed to a refused
request, such as a ``ValueError``). The engine fails open and journals writes on those only
(:mod:`fairgate.quota.journal`); :func:`unavailable_errors` adds the OS-level ones every driver
can raise. Among them, ``timeout_errors`` are the ambiguous ones: a timeout may mean a dead
server or only an event loop too busy to read a reply in time, so the engine asks
:meth:`QuotaStore.confirm_alive` (a probe that the event loop cannot starve) before it calls a
timeout an outage (docs/design-notes.md, "Outage detection").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from fairgate.quota.decision import DimensionCheck, Scope, Verdict
from fairgate.quota.hold import HoldTicket, QueueFull, Waiter
from fairgate.quota.model import Policy
from fairgate.quota.window import Anchor, Count
from fairgate.records import camel_json, record

#: Reservations not settled within this lease are reclaimed (SPEC §4).
DEFAULT_LEASE_MS = 10 * 60_000
#: Expired reservations reclaimed per admission at most (bounded work on the hot path).
RECLAIM_BATCH = 16
#: Pool-total rows/keys use this key id.
TOTAL_KEY = "*"
#: Errors that mean "unavailable" for any driver: sockets, files, timeouts (``TimeoutError`` and
#: ``ConnectionError`` are ``OSError`` subclasses).
BASE_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (OSError,)


def unavailable_errors(store: object) -> tuple[type[BaseException], ...]:
    """The exceptions that mean ``store`` is down rather than that it refused a request."""
    own = getattr(store, "unavailable_errors", ())
    return BASE_UNAVAILABLE_ERRORS + tuple(own)


def timeout_errors(store: object) -> tuple[type[BaseException], ...]:
    """The unavailable errors of ``store`` that are timeouts: an outage only once confirmed."""
    return tuple(getattr(store, "timeout_errors", ()))


class ReservationExists(ValueError):
    """``admit`` was asked to reserve under an id that is already held. The engine retries an
    admission whose reply timed out under the same id, so this tells it that the first attempt
    did reserve (nothing is reserved twice)."""

    def __init__(self, reservation_id: str) -> None:
        super().__init__(f"reservation id {reservation_id!r} already exists")


@record
class AdmitRequest:
    pool_id: str
    key_id: str
    checks: tuple[DimensionCheck, ...]
    policy: Policy
    threshold: float
    reservation_id: str
    now_ms: int
    lease_ms: int = DEFAULT_LEASE_MS
    #: the pool holds requests that do not fit (``admission: hold``): this request's waiter
    hold: HoldTicket | None = None


@record
class AdmitResult:
    verdict: Verdict
    totals: tuple[Count, ...]  # per check: the pool total's buckets as read, before reserving
    mine: tuple[Count, ...]  # per check: this key's buckets as read, before reserving
    reserved: bool
    #: (``hold``) the request waits in the pool's queue now (refused for now, held)
    waiting: bool = False
    #: (``hold``) refused at once because the key's or the pool's queue is full
    queue_full: QueueFull | None = None


@record
class UsageItem:
    """Actual use of one counter. ``scope`` ``model`` counts only for the key, never the pool."""

    key: str
    window_ms: int
    amount: float
    scope: Scope = Scope.POOL
    anchor: Anchor | None = None  # the counter's provider-anchored window, if any


@dataclass(frozen=True, slots=True)
class GcResult:
    """What one ``gc`` removed: counter buckets (rows) past the retention, active-key entries
    older than the retention, expired reservations undone. ``skipped``: another process holds
    the store's GC lock (Redis: one replica at a time), so this one did nothing."""

    buckets: int = 0
    active_keys: int = 0
    reservations: int = 0
    skipped: bool = False

    def as_json(self) -> dict[str, object]:
        return camel_json(self)


@dataclass(frozen=True, slots=True)
class CounterRef:
    key: str
    window_ms: int
    anchor: Anchor | None = None  # the counter's provider-anchored window, if any


@dataclass(frozen=True, slots=True)
class PoolCounts:
    totals: Mapping[str, Count]
    per_key: Mapping[str, Mapping[str, Count]] = field(default_factory=dict)


@runtime_checkable
class QuotaStore(Protocol):
    name: str

    async def admit(self, req: AdmitRequest) -> AdmitResult: ...

    async def settle(
        self,
        pool_id: str,
        key_id: str,
        reservation_id: str,
        usage: Sequence[UsageItem],
        now_ms: int,
    ) -> None:
        """Replace the reservation with the actual use (the reservation may have expired)."""
        ...

    async def release(self, pool_id: str, reservation_id: str, now_ms: int) -> bool:
        """Drop a reservation on failure; True if it was still held."""
        ...

    async def record(
        self, pool_id: str, key_id: str, usage: Sequence[UsageItem], now_ms: int
    ) -> None:
        """Add use that had no reservation (e.g. percent attributed after the fact)."""
        ...

    async def peek(
        self, pool_id: str, key_id: str, counters: Sequence[CounterRef], now_ms: int
    ) -> dict[str, Count]: ...

    async def leave(self, pool_id: str, waiter_id: str) -> bool:
        """Take a held request out of the pool's queue (its client went away, its patience ran
        out); True if it was there. Nothing else is held for a waiter: no reservation, no
        slot."""
        ...

    async def waiters(self, pool_id: str, now_ms: int) -> list[Waiter]:
        """The pool's held requests whose patience has not run out (views and tests)."""
        ...

    async def pool_usage(
        self,
        pool_id: str,
        key_ids: Sequence[str],
        counters: Sequence[CounterRef],
        now_ms: int,
    ) -> PoolCounts:
        """Pool totals and each listed key's counts (for the dashboard; not the hot path)."""
        ...

    async def active_keys(self, pool_id: str, since_ms: int) -> list[str]: ...

    async def cumulative(self, pool_id: str, counter_keys: Sequence[str]) -> dict[str, float]:
        """Monotonic total of everything ever settled or recorded per pool counter."""
        ...

    async def anchors(self, pool_id: str) -> dict[str, Anchor]:
        """The pool's provider-anchored windows, by counter (``percent/5h``): every replica
        reads the same ones (docs/subscriptions.md, "Provider-anchored windows")."""
        ...

    async def set_anchor(
        self,
        pool_id: str,
        counter: str,
        window_ms: int,
        reset_ms: int,
        now_ms: int,
        source: str,
    ) -> Anchor | None:
        """Apply a reading's stated reset to the pool's anchor of ``counter`` atomically, by
        :func:`fairgate.quota.window.reanchor`; returns the anchor stored afterwards (None:
        there is none)."""
        ...

    async def clear(self, pool_id: str) -> None:
        """Delete every counter, reservation and sample of a pool (pool deletion)."""
        ...

    async def gc(self, now_ms: int, retention_ms: int) -> GcResult:
        """Delete buckets older than the retention but never one within 2 × its window, forget
        keys inactive for longer than the retention, undo expired reservations of every pool;
        say what was removed."""
        ...

    async def ping(self) -> bool: ...

    async def confirm_alive(self) -> bool:
        """After a timeout: does the store answer a probe that does not depend on this
        process's event loop being responsive (a thread with its own socket deadline)?"""
        ...

    async def warm(self) -> None:
        """Open the connections before traffic arrives (a no-op where there are none)."""
        ...

    async def close(self) -> None: ...


class SlotLeases(Protocol):
    """Concurrency slots held across processes: a connection (``slot_key``) has at most ``cap``
    unexpired leases. A lease lasts ``ttl_ms`` from its acquisition or last renewal, so the
    slots of a process that died come back by themselves. Time is the caller's clock."""

    async def acquire(
        self, slot_key: str, cap: int, lease_id: str, now_ms: int, ttl_ms: int
    ) -> bool: ...

    async def release(self, slot_key: str, lease_id: str) -> bool: ...

    async def renew(
        self, slot_key: str, lease_ids: Sequence[str], now_ms: int, ttl_ms: int
    ) -> int: ...


@runtime_checkable
class SlotLeaseSource(Protocol):
    """A quota store that can share concurrency slots between replicas (the Redis one)."""

    def slot_leases(self) -> SlotLeases: ...


class AgedLog(Protocol):
    """An event log trimmed by age on the retention GC's schedule (the admission log,
    :class:`fairgate.store.admission_log.SharedPoolLog`): the port the GC needs of it, so the
    quota core does not import the store that implements it."""

    async def gc(self) -> int:
        """Remove the events past their age; the number removed."""
        ...
