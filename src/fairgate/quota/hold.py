"""Hold, don't refuse (issue 45, item 1): who is next among the requests waiting for room.

In a pool whose ``admission`` is ``hold``, a request that does not fit is not refused at once:
it waits, up to its patience (the pool's ``max_wait_ms``, which a client may shorten), in its
key's queue, and room that frees (a settlement, a release, the window sliding) goes to the
waiting key with the least use of the current window per unit of weight (its dominant share
over the pool's dimensions), oldest request first: the ``las`` reference of
:mod:`fairgate.sim.reference`, made online.

The queue lives in the store, beside the counters, so every replica sees every waiter and the
admission that would jump it is refused in the same atomic step that would have reserved
(:func:`jumps_queue`). This module is the whole rule, pure: the SQLite driver calls it, the
Redis driver's ``admit.lua`` mirrors it line for line, and the engine's hold loop
(:meth:`fairgate.quota.engine.QuotaEngine.admit`) only retries until admitted, out of
patience, or cancelled.

A waiter's ``share`` is the one its key had at the waiter's last attempt (each attempt
refreshes it). Between attempts it can only be too high (the window slid, or the key's own
settlement came in under its estimate), never too low, as the key's use grows only by an
admission, which is its own: so a stale share lets a newcomer through sooner, it never blocks
one that the fresh share would have let pass.

Only a waiter that is *owed* room blocks others: one refused because the pool had no room
for it (or because a waiter ranked before it). One refused for its own share (a hard key past
its fair share, a cap) waits too, since the window sliding may let it in, but it is owed
nothing, so it never holds room back from the keys behind it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_MAX_WAIT_MS",
    "DEFAULT_QUEUE_PER_KEY",
    "DEFAULT_QUEUE_PER_POOL",
    "MAX_WAIT_HEADER",
    "NO_HOLD",
    "AdmissionMode",
    "HoldSettings",
    "HoldStep",
    "HoldTicket",
    "QueueFull",
    "Waiter",
    "client_max_wait_ms",
    "dominant_share",
    "hold_step",
    "jumps_queue",
    "live",
    "next_waiter",
    "queue_full",
    "rank",
]

#: The header in which a client shortens its patience (never lengthens it): ms, 0 = never wait.
MAX_WAIT_HEADER = "x-fairgate-max-wait-ms"
#: A held request's patience when the pool sets none (ms).
DEFAULT_MAX_WAIT_MS = 30_000
#: Requests of one key waiting in one pool at most (more are refused at once).
DEFAULT_QUEUE_PER_KEY = 32
#: Requests waiting in one pool at most, all keys together.
DEFAULT_QUEUE_PER_POOL = 256


class AdmissionMode(StrEnum):
    """What a pool does with a request that does not fit: ``refuse`` it at once (429 with
    ``Retry-After``), or ``hold`` it until room frees or its patience runs out."""

    HOLD = "hold"
    REFUSE = "refuse"


class QueueFull(StrEnum):
    """Why a request could not join the queue (it is refused at once)."""

    KEY = "key"
    POOL = "pool"


@dataclass(frozen=True, slots=True)
class HoldSettings:
    """A pool's admission setting: its mode, a held request's patience (ms) and the queue
    limits. Stored as one JSON object beside the pool (:meth:`as_json`)."""

    mode: AdmissionMode = AdmissionMode.REFUSE
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    queue_per_key: int = DEFAULT_QUEUE_PER_KEY
    queue_per_pool: int = DEFAULT_QUEUE_PER_POOL

    @property
    def holds(self) -> bool:
        """Whether admissions to the pool go through its queue (a request with no patience
        left, ``max_wait_ms`` 0 or the client's header 0, never waits but may still not
        take room owed to a waiter)."""
        return self.mode is AdmissionMode.HOLD

    def as_json(self) -> dict[str, object]:
        return {
            "admission": self.mode.value,
            "maxWaitMs": self.max_wait_ms,
            "queuePerKey": self.queue_per_key,
            "queuePerPool": self.queue_per_pool,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> HoldSettings:
        """The stored form back; a field missing or of the wrong type takes its default (a
        row written before the setting existed is ``{}``: refuse, as before)."""

        def num(name: str, default: int) -> int:
            v = data.get(name)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default

        mode = data.get("admission")
        return cls(
            mode=AdmissionMode(mode) if mode in ("hold", "refuse") else AdmissionMode.REFUSE,
            max_wait_ms=num("maxWaitMs", DEFAULT_MAX_WAIT_MS),
            queue_per_key=max(1, num("queuePerKey", DEFAULT_QUEUE_PER_KEY)),
            queue_per_pool=max(1, num("queuePerPool", DEFAULT_QUEUE_PER_POOL)),
        )


#: A pool's setting unless it says otherwise: refuse at once (as before issue 45's hold).
NO_HOLD = HoldSettings()


@dataclass(frozen=True, slots=True)
class Waiter:
    """One held request as the store keeps it."""

    waiter_id: str
    key_id: str
    enqueued_ms: int
    deadline_ms: int
    #: the key's dominant share per unit of weight at this waiter's last attempt
    share: float
    #: refused for want of pool room (or behind a waiter ranked before it), not for its own
    #: share: room that frees is held for it
    owed: bool = True


@dataclass(frozen=True, slots=True)
class HoldTicket:
    """What an admission in a ``hold`` pool tells the store about itself: which waiter it is
    (the same id on every attempt of one request), since when it waits, until when, its key's
    weight (percent) and the queue limits."""

    waiter_id: str
    enqueued_ms: int
    deadline_ms: int
    weight: float
    per_key: int = DEFAULT_QUEUE_PER_KEY
    per_pool: int = DEFAULT_QUEUE_PER_POOL


def dominant_share(uses: Iterable[tuple[float, float]], weight: float) -> float:
    """The largest ``use / limit`` over ``(use, limit)`` pairs, per unit of ``weight``
    (percent): the ``las`` order. A limit ≤ 0 counts nothing; a key of weight 0 comes after
    every other (``inf``)."""
    share = max((u / lim for u, lim in uses if lim > 0), default=0.0)
    if weight <= 0:
        return math.inf
    return share / weight


def rank(share: float, enqueued_ms: int, waiter_id: str) -> tuple[float, int, str]:
    """The queue order: the least share first, then the oldest, then the id (a total order,
    the same on every replica)."""
    return (share, enqueued_ms, waiter_id)


def live(waiters: Iterable[Waiter], now_ms: int) -> list[Waiter]:
    """The waiters whose patience has not run out at ``now_ms`` (a deadline at ``now`` has)."""
    return [w for w in waiters if w.deadline_ms > now_ms]


def jumps_queue(
    waiters: Iterable[Waiter],
    key_id: str,
    share: float,
    hold: HoldTicket,
    now_ms: int,
) -> Waiter | None:
    """The live, owed waiter that an admission of ``key_id`` (its key's dominant share per
    weight now: ``share``) would overtake, or None when it may take the room. Against a waiter
    of its own key only age counts (both have the key's share; the waiter's is only older)."""
    mine = rank(share, hold.enqueued_ms, hold.waiter_id)
    ahead: list[tuple[tuple[float, int, str], Waiter]] = []
    for w in waiters:
        if w.waiter_id == hold.waiter_id or not w.owed or w.deadline_ms <= now_ms:
            continue
        theirs = rank(share if w.key_id == key_id else w.share, w.enqueued_ms, w.waiter_id)
        if theirs < mine:
            ahead.append((theirs, w))
    return min(ahead, key=lambda a: a[0])[1] if ahead else None


def next_waiter(waiters: Iterable[Waiter], now_ms: int) -> Waiter | None:
    """The live, owed waiter that freed room goes to (None: nobody is owed room)."""
    owed = [w for w in live(waiters, now_ms) if w.owed]
    return min(owed, key=lambda w: rank(w.share, w.enqueued_ms, w.waiter_id), default=None)


def queue_full(
    waiters: Iterable[Waiter], key_id: str, hold: HoldTicket, now_ms: int
) -> QueueFull | None:
    """Whether the request of ``hold`` may not join (or stay in) the queue: its key has
    ``per_key`` live waiters besides it, or the pool ``per_pool``."""
    others = [w for w in live(waiters, now_ms) if w.waiter_id != hold.waiter_id]
    if sum(1 for w in others if w.key_id == key_id) >= hold.per_key:
        return QueueFull.KEY
    if len(others) >= hold.per_pool:
        return QueueFull.POOL
    return None


@dataclass(frozen=True, slots=True)
class HoldStep:
    """What the store does with the queue in the atomic step of one admission of a ``hold``
    pool (:func:`hold_step`): ``blocked`` the admission (the decision's refusal, or a jump
    refused: ``jumped``), ``join`` put or refresh this request's waiter (``owed`` or not), or
    else take it out of the queue (admitted, out of patience, not holdable, or the queue is
    ``full``)."""

    blocked: bool
    jumped: Waiter | None = None
    join: bool = False
    owed: bool = False
    full: QueueFull | None = None

    def waiter(self, key_id: str, share: float, hold: HoldTicket) -> Waiter:
        """The waiter to store when :attr:`join`."""
        return Waiter(hold.waiter_id, key_id, hold.enqueued_ms, hold.deadline_ms, share, self.owed)


def hold_step(
    waiters: Iterable[Waiter],
    key_id: str,
    share: float,
    hold: HoldTicket,
    now_ms: int,
    *,
    allowed: bool,
    owed: bool,
    holdable: bool,
) -> HoldStep:
    """The queue's part of one admission. ``allowed``: what the fair-share decision said;
    ``owed``/``holdable``: for a refusal, whether it was for want of pool room (owed) or for
    the key's own share (held, owed nothing); a cap's refusal is not ``holdable`` (refused at
    once). An allowed admission that would overtake a waiter ranked before it
    (:func:`jumps_queue`) is refused and waits as owed."""
    ws = list(waiters)
    if allowed:
        ahead = jumps_queue(ws, key_id, share, hold, now_ms)
        if ahead is None:
            return HoldStep(blocked=False)
        owed, holdable = True, True
    else:
        ahead = None
    if not holdable or hold.deadline_ms <= now_ms:
        return HoldStep(blocked=True, jumped=ahead)
    full = queue_full(ws, key_id, hold, now_ms)
    if full is not None:
        return HoldStep(blocked=True, jumped=ahead, full=full)
    return HoldStep(blocked=True, jumped=ahead, join=True, owed=owed)


def client_max_wait_ms(headers: Mapping[str, str]) -> int | None:
    """The patience the client asks for in :data:`MAX_WAIT_HEADER` (None: it asks none; the
    pool's ``max_wait_ms`` caps it). A value that is not a whole number of ms from 0 to
    600000 raises ValueError naming the header."""
    raw = headers.get(MAX_WAIT_HEADER)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) > 600_000:
        raise ValueError(
            f"{MAX_WAIT_HEADER} must be a whole number of milliseconds from 0 to 600000"
        )
    return int(text)
