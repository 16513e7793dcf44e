"""Surviving a quota store outage: the circuit that stops asking a dead store, and the bounded
journal that keeps the writes it could not take until they can be replayed.

Why (SPEC §2 **[better]**): with Redis as the quota store an outage must neither stall requests
(each would wait for a connect or read timeout) nor lose the usage of the requests served
meanwhile. So, in the engine:

- the first store call that fails with an *unavailability* error (connection refused, timeout,
  a locked SQLite file; see :func:`fairgate.quota.ports.unavailable_errors`) opens the
  :class:`Circuit`. While it is open every admission fails open at once, without touching the
  store (counted in ``fail_open_count``); after ``open_ms`` one caller is let through as a probe,
  and its success closes the circuit again;
- ``settle``, ``record`` and ``release`` that fail that way, or arrive while the circuit is open,
  are appended to the :class:`Journal` with their original timestamp; a background task replays
  the journal, oldest first, as soon as the store answers again, so each write lands in the
  window bucket it belongs to and enforcement sees what was used during the outage.

Bounds: the journal keeps at most ``max_entries`` raw writes (one per request, each a few hundred
bytes: 10,000 is a few MB). When it is full it is *compacted*: usage is summed per (pool, key,
counter, bucket), which is exact for the counters (additions commute), and each settled
reservation is kept only as a tiny release (its id), so a store that kept its data (a network
blip, not a restart) still drops the reservation at once instead of at its lease. A compacted
journal of an outage of hours holds one entry per key, counter and window bucket. Should even
that exceed half the bound, the oldest releases go first (those reservations then expire with
their lease, as if the process had died), then the oldest usage (counted in ``dropped`` and
logged as an error: the only case in which usage is lost).

Delivery is at least once: an entry leaves the journal only after the store acknowledged it. A
write whose reply was lost (a read timeout after the server applied it) is therefore applied
twice, which over-counts, the safe side for a quota. The journal lives in memory: a gateway
process that dies while its store is down loses it (what its last requests used); that is the
price of not writing to a local disk on every request of an outage.

Everything here is pure bookkeeping with the time passed in; the engine does the I/O.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from fairgate.quota.decision import Scope
from fairgate.quota.ports import UsageItem
from fairgate.quota.window import Anchor, bucket_index

log = logging.getLogger("fairgate.quota")

Op = Literal["settle", "record", "release"]

#: Writes kept before the journal compacts itself.
DEFAULT_MAX_ENTRIES = 10_000
#: How long the circuit stays open before one caller may probe the store again.
DEFAULT_OPEN_MS = 1_000


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One store write that did not happen yet, exactly as the engine would have made it.

    ``reserved`` says whether ``reservation_id`` names a reservation the store may hold (an
    admission that failed open reserved nothing, so its settle is plain usage)."""

    op: Op
    pool_id: str
    key_id: str
    reservation_id: str
    usage: tuple[UsageItem, ...]
    now_ms: int
    reserved: bool = True


class Journal:
    """A FIFO of :class:`JournalEntry`, bounded by compaction (see the module docstring)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 2:
            raise ValueError("max_entries must be at least 2")
        self.max_entries = max_entries
        self._entries: deque[JournalEntry] = deque()
        self._ids = itertools.count(1)
        #: writes ever appended, replayed (acknowledged by the store), and dropped unreplayed
        self.appended = 0
        self.replayed = 0
        self.dropped = 0
        self.compactions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[JournalEntry]:
        return iter(tuple(self._entries))

    def append(self, entry: JournalEntry) -> None:
        if len(self._entries) >= self.max_entries:
            self.compact()
        self._entries.append(entry)
        self.appended += 1

    def head(self) -> JournalEntry | None:
        return self._entries[0] if self._entries else None

    def done(self, entry: JournalEntry, *, replayed: bool = True) -> None:
        """``entry`` (the head when the replay read it) was applied, or is given up on.

        A no-op when the head changed meanwhile (a compaction or :meth:`forget` rewrote the
        journal): the rewritten journal no longer holds the entry as such, and the replay simply
        continues with the new head."""
        if self._entries and self._entries[0] is entry:
            self._entries.popleft()
            if replayed:
                self.replayed += 1
            else:
                self.dropped += 1

    def forget(self, pool_id: str) -> int:
        """Drop every write of a deleted pool (replaying them would recreate its counters)."""
        kept = deque(e for e in self._entries if e.pool_id != pool_id)
        gone = len(self._entries) - len(kept)
        self._entries = kept
        return gone

    def compact(self) -> None:
        """Sum usage per (op, pool, key, counter, window, scope, bucket); keep reservations as
        releases; then cut to half the bound if still needed (releases first, oldest first)."""
        self.compactions += 1
        releases: list[JournalEntry] = []
        sums: dict[tuple[Op, str, str, str, int, str, int], tuple[float, int, Anchor | None]] = {}
        for e in self._entries:
            if e.reserved and e.op in ("settle", "release"):
                releases.append(
                    JournalEntry("release", e.pool_id, e.key_id, e.reservation_id, (), e.now_ms)
                )
            if e.op == "release":
                continue
            for item in e.usage:
                if item.amount == 0:
                    continue
                b = bucket_index(e.now_ms, item.window_ms, item.anchor)
                k = (e.op, e.pool_id, e.key_id, item.key, item.window_ms, item.scope, b)
                total, last, _ = sums.get(k, (0.0, e.now_ms, None))
                sums[k] = (total + item.amount, max(last, e.now_ms), item.anchor)
        usage: list[JournalEntry] = []
        for (op, pool_id, key_id, counter, window_ms, scope, _), found in sums.items():
            amount, at, anchor = found
            # a settle without a reservation: marks the key active, adds the use
            rid = f"journal-{next(self._ids)}" if op == "settle" else ""
            item = UsageItem(counter, window_ms, amount, Scope(scope), anchor)
            usage.append(JournalEntry(op, pool_id, key_id, rid, (item,), at, reserved=False))
        usage.sort(key=lambda e: e.now_ms)
        releases.sort(key=lambda e: e.now_ms)
        room = self.max_entries // 2
        over = len(releases) + len(usage) - room
        if over > 0:
            cut = min(over, len(releases))
            releases = releases[cut:]
            over -= cut
            log.warning("quota journal full: %d reservations left to expire with their lease", cut)
        if over > 0:
            lost = usage[:over]
            usage = usage[over:]
            self.dropped += len(lost)
            log.error("quota journal full: dropped %d usage records of the store outage", len(lost))
        self._entries = deque(sorted(releases + usage, key=lambda e: e.now_ms))


class Circuit:
    """Whether the store is considered down, and who may try it.

    Closed (store up): everyone calls the store. Open (down): nobody does until ``open_ms``
    after the last failure; then exactly one caller is let through as the probe (the others keep
    failing open at once), and its outcome closes or re-opens the circuit. Time is an argument,
    so the rules are tested without sleeping."""

    def __init__(self, open_ms: int = DEFAULT_OPEN_MS) -> None:
        self.open_ms = open_ms
        self.down_since_ms: int | None = None
        self.retry_at_ms = 0
        self._probing = False
        #: how many times the store went down, and how long the last outage lasted
        self.outages = 0
        self.last_outage_ms: int | None = None

    @property
    def down(self) -> bool:
        return self.down_since_ms is not None

    def allow(self, now_ms: int) -> bool:
        """True when the caller should call the store (the circuit is closed, or the caller is
        the one probe of an open circuit whose wait has passed)."""
        if self.down_since_ms is None:
            return True
        if now_ms >= self.retry_at_ms and not self._probing:
            self._probing = True
            return True
        return False

    def failure(self, now_ms: int) -> bool:
        """The store failed as unavailable; True when this opened the circuit (an outage began)."""
        self._probing = False
        self.retry_at_ms = now_ms + self.open_ms
        if self.down_since_ms is None:
            self.down_since_ms = now_ms
            self.outages += 1
            return True
        return False

    def success(self, now_ms: int) -> int | None:
        """The store answered; the outage's length in ms when this closed the circuit."""
        self._probing = False
        if self.down_since_ms is None:
            return None
        self.last_outage_ms = max(0, now_ms - self.down_since_ms)
        self.down_since_ms = None
        return self.last_outage_ms

    def probe_abandoned(self) -> None:
        """The probe ended without a verdict (cancelled, or failed for another reason): let the
        next caller probe instead of leaving the circuit open for good."""
        self._probing = False

    def reset(self) -> None:
        """A different store was swapped in: nothing is known about it yet."""
        self.down_since_ms = None
        self.retry_at_ms = 0
        self._probing = False
