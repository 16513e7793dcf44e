"""The SQLite quota store's ``memory`` mode: authoritative counters in memory, written behind.

When one process is the only user of a quota file (it holds the file's owner lock,
:mod:`fairgate.store.sqlite.owner`), nobody else can change the file, so the file's content plus
this process's changes since the last write *is* the state. :class:`MemoryCounters` keeps that
state (counter buckets loaded on first use, every live reservation, pending active marks and
cumulative additions) and answers the same primitive operations the transactional path runs as
SQL (the store's admission code is written once against them), in memory, in O(1).
:class:`WriteBehind` commits what changed ``flush_ms`` (a few milliseconds) after the first
change, everything as ONE batch: a commit per interval whatever the request rate, instead of
two transactions per request. A commit appends the batch to the file's journal, and about once
a second (``fold_ms``) one write transaction folds what was appended into the quota tables
(:mod:`fairgate.store.sqlite.batches`: a SQLite transaction per commit was most of a commit's
cost).

Durability (docs/performance.md): a ``kill -9`` loses what changed since the last commit, at
most ``flush_ms`` plus however late a busy event loop runs the commit (measured in
``benchmarks/admission.py``); a graceful close commits and folds everything first. Each commit
is one snapshot taken under the counters' lock, so what survives is always a consistent state
(a reservation and the amounts it added are lost or kept together).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import select
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from fairgate.quota.ports import TOTAL_KEY, ReservationExists
from fairgate.quota.window import Anchor, Count
from fairgate.store.sqlite.batches import Batch, BatchJournal, Unfolded, mark_folded, write_batch
from fairgate.store.sqlite.parts import Expired, Part, dump_parts, load_parts

log = logging.getLogger("fairgate.store")

#: (pool id, key id, counter, bucket)
CounterKey = tuple[str, str, str, int]
#: a live reservation: (pool id, key id, expires_ms, parts)
_Reservation = tuple[str, str, int, list[Part]]

_LOAD = (
    "SELECT value FROM quota_counter"
    " WHERE pool_id = ? AND key_id = ? AND counter = ? AND bucket = ?"
)
_LOAD_RESERVATIONS = "SELECT id, pool_id, key_id, expires_ms, parts FROM quota_reservation"
_NEWEST_BUCKETS = (
    "SELECT pool_id, counter, MAX(bucket) FROM quota_counter GROUP BY pool_id, counter"
)
#: Default milliseconds between two write-behind commits (``QUOTA_SQLITE_FLUSH_MS``).
DEFAULT_FLUSH_MS = 5
#: Default milliseconds between two folds of the journal into the quota tables under traffic...
DEFAULT_FOLD_MS = 1000
#: ...or as soon as a fold would write this many rows (the fold runs on the event loop: a
#: bound on its pause; its cost a row: docs/performance.md, "Figures behind the code")
FOLD_ROWS = 256
#: How long the watcher sleeps when nothing is pending and a doorbell wakes it for a sharer
#: (seconds): its only other duties then are ones that ring it too (a change made outside a
#: running loop, a failed commit, the stop).
IDLE_WAIT_S = 1.0


class MemoryCounters:
    """The authoritative state of an owned quota file; the
    :class:`~fairgate.store.sqlite.store._Ops` of the in-memory path. Every method runs under
    :attr:`lock` (the caller takes it)."""

    def __init__(
        self, reader: sqlite3.Connection, reader_lock: AbstractContextManager[object]
    ) -> None:
        #: held by the event loop for one admission/settle and by the flusher for a snapshot
        self.lock = threading.Lock()
        # loads a bucket not yet in memory (the file is the truth for it), on the store's
        # connection under the store's connection lock (taken after this one, never before)
        self._reader = reader
        self._reader_lock = reader_lock
        # value None: no row in the file (an undo must not create one, as the SQL UPDATE)
        self._counters: dict[CounterKey, float | None] = {}
        # (pool id, counter) → its window: a counter's window never changes, and one entry per
        # counter instead of per bucket is a fifth less memory at 100,000 keys
        self._windows: dict[tuple[str, str], int] = {}
        self._dirty: set[CounterKey] = set()
        self._res: dict[str, _Reservation] = {}
        self._res_heap: dict[str, list[tuple[int, str]]] = {}
        self._res_dirty: dict[str, _Reservation | None] = {}
        self._res_in_db: set[str] = set()
        self._res_resync = False
        self._touch: dict[tuple[str, str], int] = {}
        self._cum: dict[tuple[str, str], float] = {}
        self._first_change = 0.0
        #: changes made so far (admissions, settles, …): with :attr:`durable_seq`, what a crash
        #: now would lose
        self.seq = 0
        self.durable_seq = 0
        self._taken_seq = 0  # ``seq`` at the last snapshot
        #: called at the first change after a snapshot (schedules its commit)
        self.on_first_change: Callable[[], None] | None = None
        with reader_lock:
            rows = reader.execute(_LOAD_RESERVATIONS).fetchall()
            newest = reader.execute(_NEWEST_BUCKETS).fetchall()
        # (pool id, counter) → the newest bucket the file held when this process became its
        # owner. Every row written since is this process's and in memory, so a bucket above
        # it is not in the file: no query. A key's first use, and every key's first use of a
        # new window, asked the file for rows it could not hold (two queries an admission at
        # 100,000 keys: docs/performance.md, "Figures behind the code").
        self._file_newest: dict[tuple[str, str], int] = {
            (str(p), str(c)): int(b) for p, c, b in newest
        }
        for rid, pool, key, expires, raw in rows:
            parts = load_parts(raw)
            self._res[str(rid)] = (str(pool), str(key), int(expires), parts)
            self._res_in_db.add(str(rid))
            heapq.heappush(self._res_heap.setdefault(str(pool), []), (int(expires), str(rid)))

    # -- the _Ops of the store's admission code --------------------------------------------

    def _changed(self) -> None:
        if self.seq == self._taken_seq:  # the first change since the last snapshot
            self._first_change = time.monotonic()
            if self.on_first_change is not None:
                self.on_first_change()
        self.seq += 1

    def _value(self, k: CounterKey, window_ms: int) -> float | None:
        try:
            return self._counters[k]
        except KeyError:
            newest = self._file_newest.get((k[0], k[2]))
            if newest is None or k[3] > newest:  # newer than any row the file held: none
                v = None
            else:
                with self._reader_lock:
                    row = self._reader.execute(_LOAD, k).fetchone()
                v = None if row is None else float(row[0])
            self._counters[k] = v
            self._windows[(k[0], k[2])] = window_ms
            return v

    def counts(
        self,
        pool_id: str,
        key_id: str,
        counter: str,
        window_ms: int,
        curr: int,
        total: bool,
        anchor: Anchor | None,
    ) -> tuple[Count, Count]:
        mine = self._pair(pool_id, key_id, counter, window_ms, curr, anchor)
        if not total:
            return Count(0.0, 0.0, anchor), mine
        return self._pair(pool_id, TOTAL_KEY, counter, window_ms, curr, anchor), mine

    def _pair(
        self,
        pool_id: str,
        key_id: str,
        counter: str,
        window_ms: int,
        curr: int,
        anchor: Anchor | None,
    ) -> Count:
        """One owner's previous and current bucket: two dictionary lookups when both are in
        memory (every admission reads four), :meth:`_value` (which loads) otherwise."""
        prev_k, curr_k = (pool_id, key_id, counter, curr - 1), (pool_id, key_id, counter, curr)
        counters = self._counters
        try:
            return Count(counters[prev_k] or 0.0, counters[curr_k] or 0.0, anchor)
        except KeyError:
            v = self._value
            return Count(v(prev_k, window_ms) or 0.0, v(curr_k, window_ms) or 0.0, anchor)

    def add(self, pool_id: str, key_id: str, part: Part) -> None:
        counter, window_ms, bucket, amount, scope = part
        self._bump((pool_id, key_id, counter, bucket), window_ms, amount)
        if scope == "pool":
            self._bump((pool_id, TOTAL_KEY, counter, bucket), window_ms, amount)
        self._changed()

    def _bump(self, k: CounterKey, window_ms: int, amount: float) -> None:
        old = self._value(k, window_ms)
        self._counters[k] = amount if old is None else old + amount
        self._dirty.add(k)

    def sub(self, pool_id: str, key_id: str, part: Part) -> None:
        counter, window_ms, bucket, amount, scope = part
        changed = self._lower((pool_id, key_id, counter, bucket), window_ms, amount)
        if scope == "pool":
            changed |= self._lower((pool_id, TOTAL_KEY, counter, bucket), window_ms, amount)
        if changed:
            self._changed()

    def _lower(self, k: CounterKey, window_ms: int, amount: float) -> bool:
        """Take ``amount`` off a count, never below 0; False (nothing done) when the count has
        no row, as the SQL UPDATE of a missing row."""
        old = self._value(k, window_ms)
        if old is None:
            return False
        self._counters[k] = max(0.0, old - amount)
        self._dirty.add(k)
        return True

    def expired(self, pool_id: str | None, now_ms: int, limit: int) -> list[Expired]:
        out: list[Expired] = []
        pools = list(self._res_heap) if pool_id is None else [pool_id]
        for pool in pools:
            heap = self._res_heap.get(pool)
            while heap and heap[0][0] <= now_ms and len(out) < limit:
                expires, rid = heapq.heappop(heap)
                res = self._res.get(rid)
                if res is not None and res[2] == expires and res[0] == pool:
                    out.append((rid, pool, res[1], res[3]))
        return out

    def take(self, reservation_id: str, pool_id: str) -> tuple[str, list[Part]] | None:
        res = self._res.get(reservation_id)
        if res is None or res[0] != pool_id:
            return None
        self.drop(reservation_id)
        return res[1], res[3]

    def drop(self, reservation_id: str) -> None:
        if self._res.pop(reservation_id, None) is None:
            return
        if reservation_id in self._res_in_db:
            self._res_dirty[reservation_id] = None
        else:  # never written: nothing to delete
            self._res_dirty.pop(reservation_id, None)
        self._changed()

    def holds(self, reservation_id: str) -> bool:
        return reservation_id in self._res

    def put(
        self, reservation_id: str, pool_id: str, key_id: str, expires_ms: int, parts: list[Part]
    ) -> None:
        if self.holds(reservation_id):
            raise ReservationExists(reservation_id)
        res = (pool_id, key_id, expires_ms, parts)
        self._res[reservation_id] = res
        self._res_dirty[reservation_id] = res
        heap = self._res_heap.setdefault(pool_id, [])
        heapq.heappush(heap, (expires_ms, reservation_id))
        if len(heap) > 2 * len(self._res) + 1024:  # settled ones leave stale entries behind
            self._res_heap[pool_id] = [(r[2], i) for i, r in self._res.items() if r[0] == pool_id]
            heapq.heapify(self._res_heap[pool_id])
        self._changed()

    def touch(self, pool_id: str, key_id: str, now_ms: int) -> None:
        k = (pool_id, key_id)
        self._touch[k] = max(self._touch.get(k, now_ms), now_ms)
        self._changed()

    def cum_add(self, pool_id: str, counter: str, amount: float) -> None:
        k = (pool_id, counter)
        self._cum[k] = self._cum.get(k, 0.0) + amount
        self._changed()

    # -- write-behind -----------------------------------------------------------------------

    def pending_since(self) -> float | None:
        """Monotonic time of the oldest change not yet taken by a snapshot (None: none)."""
        return None if self.seq == self._taken_seq else self._first_change

    def snapshot(self) -> Batch | None:
        """Everything changed since the last snapshot, as rows (None: nothing). Under lock."""
        if self.seq == self._taken_seq:
            return None
        b = Batch(first_change=self._first_change, seq=self.seq)
        counters = self._counters
        windows = self._windows
        for k in self._dirty:
            value = counters.get(k)
            if value is not None:
                b.counters.append((k[0], k[1], k[2], k[3], windows[(k[0], k[2])], value))
        self._dirty = set()
        if self._res_resync:
            b.res_resync = True
            self._res_resync = False
            self._res_dirty = dict(self._res)
            self._res_in_db = set()
        for rid, res in self._res_dirty.items():
            if res is None:
                b.res_del.append((rid,))
                self._res_in_db.discard(rid)
            else:
                b.res_put.append((rid, res[0], res[1], res[2], dump_parts(res[3])))
                self._res_in_db.add(rid)
        self._res_dirty = {}
        b.touches = [(p, k, t) for (p, k), t in self._touch.items()]
        self._touch = {}
        b.cumulative = [(p, c, v) for (p, c), v in self._cum.items()]
        self._cum = {}
        self._taken_seq = self.seq
        return b

    def restore(self, b: Batch) -> None:
        """A batch could not be written: mark its changes pending again. Under lock."""
        for p, k, c, bucket, _, _ in b.counters:
            self._dirty.add((p, k, c, bucket))
        self._res_resync = True  # rewrite every reservation (which rows landed is unknown)
        for p, k, t in b.touches:
            self._touch[(p, k)] = max(self._touch.get((p, k), t), t)
        for p, c, v in b.cumulative:
            self._cum[(p, c)] = self._cum.get((p, c), 0.0) + v
        self._first_change = min(self._first_change, b.first_change)
        self._taken_seq = -1  # something is pending

    def forget_pool(self, pool_id: str) -> None:
        """Drop a cleared pool's state (its rows are deleted in the file). Under lock, after
        a flush."""
        for k in [k for k in self._counters if k[0] == pool_id]:
            del self._counters[k]
        for w in [w for w in self._windows if w[0] == pool_id]:
            del self._windows[w]
        for rid in [i for i, r in self._res.items() if r[0] == pool_id]:
            del self._res[rid]
            self._res_in_db.discard(rid)
        self._res_heap.pop(pool_id, None)

    def forget_old(self, now_ms: int, retention_ms: int) -> int:
        """Drop clean buckets that ``gc`` deletes from the file (same rule); how many."""
        windows = self._windows
        old = []
        for k in self._counters:
            w = windows[(k[0], k[2])]
            if (k[3] + 1) * w < now_ms - max(retention_ms, 2 * w) and k not in self._dirty:
                old.append(k)
        for k in old:
            del self._counters[k]
        return len(old)


class WriteBehind:
    """Commits a :class:`MemoryCounters`' changes ``flush_ms`` after the first of them, as one
    batch appended to the journal, and folds the journal into the tables every ``fold_ms``
    (and whenever the tables must be whole: :meth:`quiesce`, the hand-over, the close).

    The commit runs on the event loop that made the change (a timer set at the first change
    after a commit): a commit per ``flush_ms`` at most, whatever the request rate. A thread
    would keep it off the loop but not off the GIL: with the loop busy, each of the commit's
    statements waited up to a switch interval for the GIL to come back, and the commits came
    far apart (docs/performance.md, "Figures behind the code"). The thread kept here only
    watches: every ``flush_ms`` it asks ``handover_wanted``, and when yes (another process wants
    to share the file) it commits everything while holding the counters' lock and calls
    ``handover`` before letting go, so no admission happens between the last in-memory one and
    the switch to the transactional path; it also commits changes that no loop committed
    within two intervals (made outside a running loop, or after a failed commit).

    While nothing is pending the watcher has nothing to commit, only a sharer to notice: with
    a ``doorbell`` (:meth:`~fairgate.store.sqlite.owner.FileUse.doorbell`, rung by a sharer as
    it announces itself) it sleeps on it for up to :data:`IDLE_WAIT_S` instead of waking every
    ``flush_ms``, and a ring wakes it at once (a handover starts within one commit of the
    announcement, not one interval). Without one it polls every ``flush_ms``."""

    def __init__(
        self,
        memory: MemoryCounters,
        write: Callable[[], AbstractContextManager[sqlite3.Connection]],
        *,
        flush_ms: int,
        journal: BatchJournal,
        journal_seq: int,
        fold_ms: int = DEFAULT_FOLD_MS,
        handover_wanted: Callable[[], bool],
        handover: Callable[[], None],
        doorbell: socket.socket | None = None,
    ) -> None:
        """``write`` is the store's write transaction (its connection, pragmas, lock and
        periodic checkpoint): a connection of our own would need every pragma repeated, and
        one missed (``synchronous``, ``wal_autocheckpoint``) made each commit fsync or
        checkpoint (docs/performance.md, "Figures behind the code")."""
        self.memory = memory
        self._flush_s = flush_ms / 1000.0
        self._fold_s = fold_ms / 1000.0
        self._tx = write
        self._flush_lock = threading.Lock()  # one commit at a time, in snapshot order
        self._stop = threading.Event()
        self._wanted = handover_wanted
        self._handover = handover
        #: the oldest change's age at each commit, in ms (the last few thousand commits): how
        #: much counting a ``kill -9`` just before that commit would have lost
        self.lags_ms: deque[float] = deque(maxlen=4096)
        self.failures = 0
        self._journal = journal
        # the last batch appended to the journal, and the last the tables hold
        self._seq = self._folded_seq = journal_seq
        self._must_fold = False
        #: batches journaled since the last fold, merged (:mod:`fairgate.store.sqlite.batches`)
        self._unfolded = Unfolded()
        self._folded_at = time.monotonic()
        #: how many times the journal was folded into the tables
        self.folds = 0
        #: how many times the watcher woke up (idle cost: benchmarks/admission.py)
        self.wakeups = 0
        self._bell = doorbell
        memory.on_first_change = self._schedule
        self._thread = threading.Thread(target=self._run, name="fairgate-sqlite-flush", daemon=True)
        self._thread.start()

    def _schedule(self) -> None:
        """(Counters' lock held) Commit ``flush_ms`` from now on the running loop, if any."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._wake()  # no loop: the watcher thread commits it
            return
        loop.call_later(self._flush_s, self._flush_on_loop)

    def _flush_on_loop(self) -> None:
        if not self._stop.is_set():
            self.flush()

    def _wake(self) -> None:
        """Ring our own doorbell: the watcher stops sleeping (a no-op without one: it polls)."""
        bell = self._bell
        if bell is not None:
            # a full queue already wakes it; a closed socket means it is stopping
            with contextlib.suppress(OSError):
                bell.sendto(b"!", bell.getsockname())

    def _sleep(self) -> bool:
        """Wait for the next round; False once stopped."""
        self.wakeups += 1
        bell = self._bell
        if bell is None:
            return not self._stop.wait(self._flush_s)
        with self.memory.lock:
            idle = self.memory.pending_since() is None
        if self._stop.is_set():
            return False
        # OSError, ValueError: the socket closed under us (a stop that gave up waiting)
        with contextlib.suppress(OSError, ValueError):
            select.select([bell], [], [], IDLE_WAIT_S if idle else self._flush_s)
            while True:  # drain the rings: one round answers them all
                bell.recv(16)
        return not self._stop.is_set()

    def _run(self) -> None:
        while self._sleep():
            try:
                if self._wanted():
                    with self._flush_lock, self.memory.lock:
                        if self._commit_locked():  # else: retried next round, still owner
                            self._handover()
                            return
                    continue
                with self.memory.lock:
                    pending = self.memory.pending_since()
                now = time.monotonic()
                if pending is not None and now - pending > 2 * self._flush_s:
                    self.flush()
                elif self._unfolded and now - self._folded_at > 2 * self._fold_s:
                    self.flush(fold=True)  # traffic stopped: the tables catch up
            except Exception:  # never let the thread die: the next round retries
                log.exception("quota store: write-behind round failed")

    def flush(self, *, fold: bool = False) -> bool:
        """Commit what changed now (from any thread), and with ``fold`` write everything into
        the tables; False if the write failed (it is kept pending and retried by the next
        round)."""
        with self._flush_lock:
            with self.memory.lock:
                batch = self.memory.snapshot()
            return self._commit(batch, fold=fold)

    def _commit_locked(self) -> bool:
        """Commit and fold with the counters' lock already held (a quiet moment for the
        caller): the tables alone are then the whole state."""
        return self._commit(self.memory.snapshot(), locked=True, fold=True)

    def _commit(self, batch: Batch | None, *, locked: bool = False, fold: bool) -> bool:
        """:meth:`_write` a snapshot (``None``: nothing changed since the last one), unless
        there is nothing to write: no change, and no fold asked for with batches to fold."""
        if batch is None and not (fold and self._unfolded):
            return True
        return self._write(batch or Batch(), locked=locked, fold=fold)

    @contextmanager
    def quiesce(self) -> Iterator[None]:
        """Hold both locks (flush, then counters) after committing everything: while held,
        the file is the whole state and nothing changes it but the holder."""
        with self._flush_lock, self.memory.lock:
            if not self._commit_locked():
                msg = "the quota file cannot be written"
                raise sqlite3.OperationalError(msg)
            yield

    def _write(self, b: Batch, *, locked: bool = False, fold: bool = False) -> bool:
        """Commit ``b``: appended to the journal, or written into the tables with everything
        journaled since the last fold (which the journal then forgets) when ``fold`` is asked
        for or due. Under the flush lock."""
        now = time.monotonic()
        unfolded = self._unfolded
        fold = (
            fold
            or self._must_fold
            or now - self._folded_at >= self._fold_s
            or len(unfolded) + len(b.counters) + len(b.res_put) >= FOLD_ROWS
        )
        try:
            if fold:
                with self._tx() as c:
                    if unfolded:
                        write_batch(c, unfolded.batch())
                    write_batch(c, b)
                    if self._seq != self._folded_seq:
                        mark_folded(c, self._seq)
            else:
                self._journal.append(self._seq + 1, b)
                self._seq += 1
        except (sqlite3.Error, OSError) as exc:
            self.failures += 1
            # a failed append may have left half a record, which would end the journal for
            # every record after it: until a fold has emptied it, commit into the tables
            self._must_fold = True
            log.warning("quota store: write-behind commit failed (%s); retrying", exc)
            # (a fold with nothing new restores nothing: what it folds stays journaled and
            # unfolded)
            if b.seq:
                with contextlib.nullcontext() if locked else self.memory.lock:
                    self.memory.restore(b)
            self._wake()  # the watcher retries it
            return False
        if fold:
            self._unfolded = Unfolded()
            self._folded_at = now
            self._folded_seq = self._seq
            self.folds += 1
            try:  # the tables hold every batch in it: a crash from here on skips them
                self._journal.clear()
                self._must_fold = False
            except OSError as exc:
                log.warning("quota store: the journal could not be emptied (%s)", exc)
        else:
            unfolded.add(b)
        if b.seq:  # an empty batch (a fold with nothing new) is not a commit of changes
            lag = (time.monotonic() - b.first_change) * 1000.0
            self.lags_ms.append(lag)
            self.memory.durable_seq = b.seq
        return True

    def stop(self) -> None:
        """Stop the thread and commit what is left (a graceful close loses nothing)."""
        self._stop.set()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._bell is not None:
            # kept bound after a handover: no other process can own the file before this one
            # lets go of its lock, which happens after this close
            self._bell.close()
        self.flush(fold=True)
