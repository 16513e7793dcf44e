"""The SQLite quota store (the default driver).

One file, WAL journal, shared safely by several gateway processes: every read-modify-write runs
inside ``BEGIN IMMEDIATE`` so the write lock is taken before anything is read, and two processes
can never both see the same headroom. The methods are ``async`` for the :class:`QuotaStore`
port but do their work inline: each transaction is a handful of primary-key lookups plus a WAL
commit (some tens of microseconds, most of it the commit), less than the hop to a worker thread
would add. The cost is that a writer waiting for another process's transaction blocks the event
loop until that one commits (on the file's writers' lock, :meth:`FileUse.writing`, polled in
microseconds rather than SQLite's millisecond sleeps), at most ``busy_timeout_ms``.

That is the ``transactional`` mode, and what every process does while several share the file.
Its writes are group-committed: the admissions, settles, releases and records asked in one loop
turn share one write transaction (in the order asked, a savepoint each: each decision sees the
ones before it), and each caller is answered after that commit.
In ``memory`` mode (the default) a process that has the file to itself answers the same
operations from memory and commits them every few milliseconds
(:mod:`fairgate.store.sqlite.memory`); the admission code below is written once against
:class:`_Ops` and runs unchanged on both. A gateway's second process on the file (``serve
--workers N``) forwards its calls to that process instead of making it hand over
(``forward``, :mod:`fairgate.store.sqlite.forward`).

Layout (all primary-key addressed, so admission is O(checks) whatever the number of keys):

- ``quota_counter``: one row per (pool, key, counter, bucket); the key id :data:`TOTAL_KEY`
  holds the pool total, maintained beside the key row on every pool-scope write.
- ``quota_reservation``: what an admission added, so it can be undone exactly on settle, release
  or lease expiry; ``parts`` is JSON ``[[counter, window_ms, bucket, amount, scope], ...]``.
- ``quota_active``: when each key last asked (share mode ``active``).
- ``quota_cumulative``: monotonic per pool counter (burn rate), never decremented.
- ``quota_anchor``: per (pool, counter) the provider-anchored window (reset, bucket index, the
  connection that set it), read by every process that shares the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from asyncio import Future
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

from fairgate.quota.decision import Outcome, Scope, Verdict, evaluate
from fairgate.quota.hold import QueueFull, Waiter
from fairgate.quota.ports import (
    RECLAIM_BATCH,
    TOTAL_KEY,
    AdmitRequest,
    AdmitResult,
    CounterRef,
    GcResult,
    PoolCounts,
    ReservationExists,
    UsageItem,
)
from fairgate.quota.queue import queued_admission
from fairgate.quota.window import Anchor, Count, bucket_index, fade, reanchor
from fairgate.sqlite_journal import use_wal
from fairgate.store.sqlite.batches import (
    CUMULATIVE_ADD,
    DELETE_RESERVATION,
    FOLDED_SCHEMA,
    TOUCH,
    BatchJournal,
    replay,
)
from fairgate.store.sqlite.forward import ForwardClient, ForwardServer, Later, Unsent
from fairgate.store.sqlite.memory import (
    DEFAULT_FLUSH_MS,
    DEFAULT_FOLD_MS,
    MemoryCounters,
    WriteBehind,
)
from fairgate.store.sqlite.owner import FileUse
from fairgate.store.sqlite.parts import Expired, Part
from fairgate.store.sqlite.parts import dump_parts as _dump_parts
from fairgate.store.sqlite.parts import load_parts as _load_parts
from fairgate.store.sqlite.waiters import SCHEMA as WAITER_SCHEMA
from fairgate.store.sqlite.waiters import MemoryWaiters, SqlWaiters, WaiterQueue

log = logging.getLogger("fairgate.store")
T = TypeVar("T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS quota_counter (
        pool_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        counter TEXT NOT NULL,
        bucket INTEGER NOT NULL,
        window_ms INTEGER NOT NULL,
        value REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (pool_id, key_id, counter, bucket)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS quota_reservation (
        id TEXT PRIMARY KEY,
        pool_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        expires_ms INTEGER NOT NULL,
        parts TEXT NOT NULL
    )""",
    """CREATE INDEX IF NOT EXISTS quota_reservation_expiry
        ON quota_reservation (pool_id, expires_ms)""",
    """CREATE TABLE IF NOT EXISTS quota_active (
        pool_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        last_ms INTEGER NOT NULL,
        PRIMARY KEY (pool_id, key_id)
    ) WITHOUT ROWID""",
    """CREATE INDEX IF NOT EXISTS quota_active_recent ON quota_active (pool_id, last_ms)""",
    """CREATE TABLE IF NOT EXISTS quota_cumulative (
        pool_id TEXT NOT NULL,
        counter TEXT NOT NULL,
        value REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (pool_id, counter)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS quota_anchor (
        pool_id TEXT NOT NULL,
        counter TEXT NOT NULL,
        window_ms INTEGER NOT NULL,
        reset_ms INTEGER NOT NULL,
        bucket INTEGER NOT NULL,
        source TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (pool_id, counter)
    ) WITHOUT ROWID""",
    FOLDED_SCHEMA,
    *WAITER_SCHEMA,
)

_ADD = (
    "INSERT INTO quota_counter (pool_id, key_id, counter, bucket, window_ms, value)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (pool_id, key_id, counter, bucket) DO UPDATE SET value = value + excluded.value"
)
# UPDATE, not UPSERT: undoing a part whose row is gone (cleared) must not leave a negative row.
# The clamp only absorbs float residue (0.1 + 0.2 - 0.1 - 0.2), never a real over-subtraction.
_SUB = (
    "UPDATE quota_counter SET value = MAX(0.0, value - ?)"
    " WHERE pool_id = ? AND key_id = ? AND counter = ? AND bucket = ?"
)
_READ_ONE = (
    "SELECT key_id, bucket, value FROM quota_counter"
    " WHERE pool_id = ? AND key_id = ? AND counter = ? AND bucket BETWEEN ? AND ?"
)
_READ_PAIR = (
    "SELECT key_id, bucket, value FROM quota_counter"
    " WHERE pool_id = ? AND key_id IN (?, ?) AND counter = ? AND bucket BETWEEN ? AND ?"
)
_EXPIRED = (
    "SELECT id, key_id, parts FROM quota_reservation"
    " WHERE pool_id = ? AND expires_ms <= ? ORDER BY expires_ms LIMIT ?"
)
_EXPIRED_ANY = (
    "SELECT id, pool_id, key_id, parts FROM quota_reservation"
    " WHERE expires_ms <= ? ORDER BY expires_ms LIMIT ?"
)
# take a reservation out in one statement (RETURNING needs SQLite ≥ 3.35, Python 3.11 ships 3.40+)
_RES_TAKE = "DELETE FROM quota_reservation WHERE id = ? AND pool_id = ? RETURNING key_id, parts"
_RES_HELD = "SELECT 1 FROM quota_reservation WHERE id = ?"
_RES_PUT = (
    "INSERT INTO quota_reservation (id, pool_id, key_id, expires_ms, parts) VALUES (?, ?, ?, ?, ?)"
)
_ACTIVE = "SELECT key_id FROM quota_active WHERE pool_id = ? AND last_ms >= ? ORDER BY key_id"
_CUM_GET = "SELECT value FROM quota_cumulative WHERE pool_id = ? AND counter = ?"
_ANCHORS = "SELECT counter, reset_ms, bucket, source FROM quota_anchor WHERE pool_id = ?"
_ANCHOR_GET = "SELECT reset_ms, bucket, source FROM quota_anchor WHERE pool_id = ? AND counter = ?"
_ANCHOR_PUT = (
    "INSERT INTO quota_anchor (pool_id, counter, window_ms, reset_ms, bucket, source)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pool_id, counter) DO UPDATE SET"
    " window_ms = excluded.window_ms, reset_ms = excluded.reset_ms, bucket = excluded.bucket,"
    " source = excluded.source"
)
_CLEAR = (
    "DELETE FROM quota_counter WHERE pool_id = ?",
    "DELETE FROM quota_reservation WHERE pool_id = ?",
    "DELETE FROM quota_active WHERE pool_id = ?",
    "DELETE FROM quota_cumulative WHERE pool_id = ?",
    "DELETE FROM quota_anchor WHERE pool_id = ?",
)
# A bucket is kept while its end is within max(retention, 2 × its window) of now.
_GC_COUNTERS = (
    "DELETE FROM quota_counter WHERE (bucket + 1) * window_ms < ? - MAX(?, 2 * window_ms)"
)
_GC_ACTIVE = "DELETE FROM quota_active WHERE last_ms < ?"

#: How often (ms) one process re-checks a pool for expired reservations and re-marks a key
#: active; and how many such entries it remembers at most.
_HOUSEKEEPING_MS = 1_000
_HOUSEKEEPING_ENTRIES = 100_000

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL")

#: Seconds between the writer's own (inline) checkpoints; see ``_write``.
_INLINE_CHECKPOINT_S = 1.0

#: The store's modes (``QUOTA_SQLITE_MODE``): see :class:`SqliteQuotaStore`.
MODES = ("transactional", "memory")
#: ``memory``: a process alone on its file counts in memory (admission + settle far cheaper:
#: docs/performance.md, "Figures behind the code");
#: any second process on the file switches every process to ``transactional`` anyway.
DEFAULT_MODE = "memory"
#: The longest write-behind interval allowed: a crash may lose this much counting.
MAX_FLUSH_MS = 1000

#: Expired reservations undone per gc transaction (keeps each write lock short).
_GC_RESERVATION_BATCH = 256

# A part of a reservation: (counter, window_ms, bucket, amount, scope).
_Part = Part
#: A scope as a part stores it (``str(scope)`` of the enum, a dictionary lookup here).
_SCOPE_TEXT: dict[str, str] = {s: s.value for s in Scope}


class _Ops(Protocol):
    """The primitive reads and writes the admission algorithms below are written in.

    Two implementations: :class:`_SqlOps` runs each as a statement inside the caller's
    transaction (the shared, exact path); :class:`~fairgate.store.sqlite.memory.MemoryCounters`
    runs them on counters held in memory and written behind (the single-owner path). The
    algorithms (what an admission reads, decides and reserves) exist once, so a rule change
    lands in both modes."""

    def expired(self, pool_id: str | None, now_ms: int, limit: int) -> list[Expired]: ...

    def take(self, reservation_id: str, pool_id: str) -> tuple[str, list[_Part]] | None: ...

    def drop(self, reservation_id: str) -> None: ...

    def holds(self, reservation_id: str) -> bool: ...

    def put(
        self, reservation_id: str, pool_id: str, key_id: str, expires_ms: int, parts: list[_Part]
    ) -> None: ...

    def touch(self, pool_id: str, key_id: str, now_ms: int) -> None: ...

    def counts(
        self,
        pool_id: str,
        key_id: str,
        counter: str,
        window_ms: int,
        curr: int,
        total: bool,
        anchor: Anchor | None,
    ) -> tuple[Count, Count]: ...

    def add(self, pool_id: str, key_id: str, part: _Part) -> None:
        """Add the part's amount to the key's count in the part's bucket and, for a pool
        dimension (scope ``pool``), to the pool's total: the two always move together, and one
        call for both is half the calls on the in-memory path, where every admission and
        settle makes several."""

    def sub(self, pool_id: str, key_id: str, part: _Part) -> None:
        """Take the part's amount off (never below 0, and never creating a count), as
        :meth:`add`."""

    def cum_add(self, pool_id: str, counter: str, amount: float) -> None: ...


class _SqlOps:
    """:class:`_Ops` as statements on a connection inside an open transaction."""

    __slots__ = ("c",)

    def __init__(self, c: sqlite3.Connection) -> None:
        self.c = c

    def expired(self, pool_id: str | None, now_ms: int, limit: int) -> list[Expired]:
        if pool_id is None:
            rows = self.c.execute(_EXPIRED_ANY, (now_ms, limit)).fetchall()
            return [(str(r), str(p), str(k), _load_parts(raw)) for r, p, k, raw in rows]
        rows = self.c.execute(_EXPIRED, (pool_id, now_ms, limit)).fetchall()
        return [(str(r), pool_id, str(k), _load_parts(raw)) for r, k, raw in rows]

    def take(self, reservation_id: str, pool_id: str) -> tuple[str, list[_Part]] | None:
        row = self.c.execute(_RES_TAKE, (reservation_id, pool_id)).fetchone()
        return None if row is None else (str(row[0]), _load_parts(row[1]))

    def drop(self, reservation_id: str) -> None:
        self.c.execute(DELETE_RESERVATION, (reservation_id,))

    def holds(self, reservation_id: str) -> bool:
        return self.c.execute(_RES_HELD, (reservation_id,)).fetchone() is not None

    def put(
        self, reservation_id: str, pool_id: str, key_id: str, expires_ms: int, parts: list[_Part]
    ) -> None:
        try:
            self.c.execute(
                _RES_PUT, (reservation_id, pool_id, key_id, expires_ms, _dump_parts(parts))
            )
        except sqlite3.IntegrityError as exc:  # rolls the whole admission back
            raise ReservationExists(reservation_id) from exc

    def touch(self, pool_id: str, key_id: str, now_ms: int) -> None:
        self.c.execute(TOUCH, (pool_id, key_id, now_ms))

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
        if total:
            rows = self.c.execute(
                _READ_PAIR, (pool_id, TOTAL_KEY, key_id, counter, curr - 1, curr)
            ).fetchall()
        else:
            rows = self.c.execute(_READ_ONE, (pool_id, key_id, counter, curr - 1, curr)).fetchall()
        return _counts(rows, key_id, curr, anchor)

    def add(self, pool_id: str, key_id: str, part: _Part) -> None:
        counter, window_ms, bucket, amount, scope = part
        self.c.execute(_ADD, (pool_id, key_id, counter, bucket, window_ms, amount))
        if scope == "pool":
            self.c.execute(_ADD, (pool_id, TOTAL_KEY, counter, bucket, window_ms, amount))

    def sub(self, pool_id: str, key_id: str, part: _Part) -> None:
        counter, _, bucket, amount, scope = part
        self.c.execute(_SUB, (amount, pool_id, key_id, counter, bucket))
        if scope == "pool":
            self.c.execute(_SUB, (amount, pool_id, TOTAL_KEY, counter, bucket))

    def cum_add(self, pool_id: str, counter: str, amount: float) -> None:
        self.c.execute(CUMULATIVE_ADD, (pool_id, counter, amount))


class SqliteQuotaStore:
    """:class:`~fairgate.quota.ports.QuotaStore` on one SQLite file."""

    name = "sqlite"
    #: locked past the busy timeout, disk full, I/O error: the engine fails open and journals
    unavailable_errors: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        checkpoint_interval_s: float = 1.0,
        synchronous: str = "OFF",
        mode: str = DEFAULT_MODE,
        flush_ms: int = DEFAULT_FLUSH_MS,
        fold_ms: int = DEFAULT_FOLD_MS,
        forward: bool = False,
    ) -> None:
        """``synchronous`` OFF (the default) never fsyncs on the event loop: committed counters
        are in the OS page cache, so they survive a crash or ``kill -9`` of the gateway, and
        only a power loss or kernel crash can lose the last moments of counting. NORMAL or FULL
        add the fsync of every checkpoint (a stall once a second under load: docs/performance.md,
        "Figures behind the code") for durability against power loss too.

        ``mode`` ``memory`` (the default): while this process is the file's only user,
        counters are authoritative in memory and written behind every ``flush_ms`` (a
        ``kill -9`` loses at most the last ``flush_ms`` plus one commit of changes, a close
        nothing); as soon as another process opens the file, this one commits and switches to
        the transactional path (:mod:`fairgate.store.sqlite.owner`). Each write-behind commit
        appends its batch to a journal in the file, folded into the quota tables every
        ``fold_ms`` and whenever the tables must be whole (a read of them, a hand-over, a
        close); every process that opens the file folds what a dead owner left first
        (:mod:`fairgate.store.sqlite.batches`). ``transactional``: every admission and settle
        is a transaction, nothing committed is ever lost.

        ``forward`` (memory mode; what ``serve`` uses): a process that finds the file owned
        sends its calls to the owner over a local socket instead of making it hand over
        (:mod:`fairgate.store.sqlite.forward`), so the counters stay in the owner's memory
        with any number of workers; if the owner goes away, the next call finds a new one
        (this process, or whichever took the file). Without it (the default for a store made
        directly: tools, tests of the hand-over) a second process shares the file
        transactionally as before. An owner serves forwarded calls either way, when it is
        made on a running event loop."""
        if synchronous.upper() not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if not 1 <= flush_ms <= MAX_FLUSH_MS:
            raise ValueError(f"flush_ms must be from 1 to {MAX_FLUSH_MS}")
        if fold_ms < flush_ms:
            raise ValueError("fold_ms must be at least flush_ms")
        self._synchronous = synchronous.upper()
        self._busy_timeout_ms = busy_timeout_ms
        self._path = os.fspath(path)
        self._lock = threading.Lock()  # the connection is shared; transactions must not interleave
        self._conn = sqlite3.connect(
            self._path,
            timeout=busy_timeout_ms / 1000.0,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=64,
        )
        self._closed = False
        # when this process last looked for expired reservations (per pool) and last marked a
        # key active: both matter at the scale of seconds (leases are minutes, the active window
        # a quarter hour), so doing them on every transaction would only cost writes
        self._reclaimed: dict[str, int] = {}
        self._touched: dict[tuple[str, str], int] = {}
        #: transactional writes waiting for this loop turn's group commit, with their callers
        self._group: list[tuple[Callable[[_SqlOps], Any], Future[Any], bool]] = []
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self._inline_checkpoint_at = time.monotonic()
        self._memory: MemoryCounters | None = None
        #: the held requests while this process owns the file (memory mode; store/sqlite/waiters)
        self._waiters = MemoryWaiters()
        self._behind: WriteBehind | None = None
        self._use: FileUse | None = None
        self._mode, self._forward = mode, forward
        self._flush_ms, self._fold_ms = flush_ms, fold_ms
        #: (forwarder) the connection to the owner that counts for this process
        self._fwd: ForwardClient | None = None
        #: (owner) where other processes' forwarded calls arrive
        self._server: ForwardServer | None = None
        # the write-behind's journal (memory mode), folded by every opener of a file
        self._journal = BatchJournal(self._path, sync=self._synchronous == "FULL")
        try:
            if self._path != ":memory:":
                self._use = FileUse(self._path)
                self._fwd = self._join()
            if self._fwd is None:
                self._start_counting()
        except BaseException:
            self._conn.close()
            if self._use is not None:
                self._use.close()
            raise
        if checkpoint_interval_s > 0 and self._path != ":memory:":
            # A WAL checkpoint fsyncs the database; left to autocheckpoint it lands on whichever
            # commit crosses 1000 pages, i.e. on the event loop as a multi-millisecond stall in
            # 1 % of admissions. A background thread with its own connection copies the frames
            # instead. Under non-stop writes its checkpoints never quite catch up (frames keep
            # arriving while it copies), so the WAL would never restart and would grow without
            # end; once a second the writer runs a checkpoint itself between two transactions,
            # which finds only the frames since the thread's last pass and lets the next write
            # reset the WAL. The thread runs once a second too, not ten times: a hot page is then
            # copied once a second however often it was committed, and each pass takes the GIL
            # from the event loop once (less CPU per governed request in paired runs:
            # docs/performance.md, "Figures behind the code").
            self._conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop,
                args=(checkpoint_interval_s, busy_timeout_ms),
                name="fairgate-sqlite-checkpoint",
                daemon=True,
            )
            self._checkpointer.start()

    def _join(self) -> ForwardClient | None:
        """This process's part on the file: the owner (memory mode, if it can have the file
        alone), a forwarder (the connection returned: ``forward`` and an owner that serves),
        else a sharer (transactional; an owner hands over first). A forwarder touches nothing
        in the file, its journal included: that is the owner's."""
        use = self._use
        assert use is not None
        if self._mode == "memory":
            if use.try_own():
                return None
            if self._forward:
                sock = use.connect_owner(self._busy_timeout_ms // 5)
                if sock is not None:
                    return ForwardClient(sock, self._busy_timeout_ms / 1000.0)
                if use.try_own():  # the owner went away meanwhile
                    return None
        use.share(self._busy_timeout_ms)
        return None

    def _start_counting(self) -> None:
        """(Owner or sharer) Fold what the file's journal holds, then count: in memory, serving
        forwarders, as the owner; transactionally as a sharer."""
        journal_seq = self._init(self._busy_timeout_ms)
        if self._use is None or not self._use.owner:
            return
        self._memory = MemoryCounters(self._conn, self._lock)
        self._behind = WriteBehind(
            self._memory,
            self._write,
            flush_ms=self._flush_ms,
            journal=self._journal,
            journal_seq=journal_seq,
            fold_ms=self._fold_ms,
            handover_wanted=self._use.sharer_waiting,
            handover=self._hand_over,
            doorbell=self._use.doorbell(),
        )
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop to serve on: a newcomer shares the file instead
            return
        sock = self._use.forward_listener()
        if sock is not None:
            self._server = ForwardServer(sock, self._answer)

    def _rejoin(self) -> None:
        """(Forwarder) The owner went away: find the file's next owner, or be it."""
        fwd, self._fwd = self._fwd, None
        if fwd is not None:
            fwd.close()
        self._fwd = self._join()
        if self._fwd is None:
            self._start_counting()
        log.info("quota store: the owner of %s went away; now %s", self._path, self.mode)

    async def _forwarded(self, name: str, *args: Any) -> Any:
        return await self._forward_call(name, args, later=False)

    async def _forwarded_later(self, name: str, *args: Any) -> Any:
        """:meth:`_forwarded` for a call nobody waits for on a request's path (a settle, a
        release, a record): it goes with the next admission's frame, within 2 ms."""
        return await self._forward_call(name, args, later=True)

    async def _forward_call(self, name: str, args: tuple[Any, ...], *, later: bool) -> Any:
        """(Forwarder) ``name(*args)`` run by the owner; first a new owner if it went away.
        A call in flight when it did fails (module docstring of
        :mod:`fairgate.store.sqlite.forward`): it is never sent twice."""
        fwd = self._fwd
        if fwd is not None and not fwd.lost:
            try:
                return await fwd.call(name, args, later=later)
            except Unsent:  # the owner stopped without reading it: the next owner's
                pass
        if self._fwd is fwd:  # not found by a call that failed with this one
            self._rejoin()
        if self._fwd is not None:  # once: a new owner that goes away at once is an error
            return await self._fwd.call(name, args, later=later)
        return await getattr(self, name)(*args)

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        """(Owner) A forwarded call: answered at once from memory, or :class:`Later` by the
        method itself (counting transactionally since a hand-over, or a call with no memory
        path)."""
        mem = self._memory
        if mem is not None and name in _AT_ONCE:
            with mem.lock:
                if self._memory is mem:
                    return _AT_ONCE[name](self, mem, *args)
        return Later(getattr(self, name)(*args))

    def _hand_over(self) -> None:
        """(The flusher, everything committed, the counters' lock held) Another process wants
        the file: from now on this one takes the transactional path too."""
        assert self._use is not None
        self._memory = None
        self._use.hand_over()
        log.info("quota store: another process opened %s; counting transactionally", self._path)

    @property
    def mode(self) -> str:
        """``memory`` while this process owns the file and counts in memory, ``forwarding``
        while its owner counts for it, else ``transactional`` (also after a hand-over)."""
        if self._fwd is not None:
            return "forwarding"
        return "memory" if self._memory is not None else "transactional"

    @property
    def forwarded(self) -> int:
        """Calls this process has sent to the file's owner (on its current connection)."""
        fwd = self._fwd
        return 0 if fwd is None else fwd.calls

    def durability(self, *, reset: bool = False) -> dict[str, float]:
        """What a ``kill -9`` now would lose, for tests and benchmarks: changes made and
        committed so far (their difference is at risk), commits, and how long the oldest change
        of each commit had waited for it (ms: median, 99th percentile, longest, over the last
        few thousand commits; ``reset`` starts those over). Empty in transactional mode
        (nothing is ever at risk)."""
        mem, wb = self._memory, self._behind
        if mem is None or wb is None:
            return {}
        lags = sorted(wb.lags_ms)
        if reset:
            wb.lags_ms.clear()

        def pct(q: float) -> float:
            return lags[min(len(lags) - 1, int(len(lags) * q))] if lags else 0.0

        return {
            "changes": mem.seq,
            "committed": mem.durable_seq,
            "commits": len(lags),
            "p50_lag_ms": pct(0.5),
            "p99_lag_ms": pct(0.99),
            "max_lag_ms": lags[-1] if lags else 0.0,
            "failed_commits": wb.failures,
            "folds": wb.folds,
        }

    async def flush(self) -> None:
        """Commit the in-memory changes now (memory mode, or the owner's when forwarding; a
        no-op otherwise)."""
        if self._fwd is not None:
            await self._forwarded("flush")
            return
        with self._quiet():
            pass

    @contextmanager
    def _quiet(self) -> Iterator[MemoryCounters | None]:
        """Memory mode: everything committed and nothing changing while held (the file is the
        whole state), yielding the counters; otherwise nothing to do, yielding None."""
        wb = self._behind
        if wb is None or self._memory is None:
            yield None
            return
        with wb.quiesce():
            yield self._memory  # None if it was handed over just before

    def _checkpoint_loop(self, interval_s: float, busy_timeout_ms: int) -> None:
        conn = sqlite3.connect(self._path, timeout=busy_timeout_ms / 1000.0, isolation_level=None)
        try:
            while not self._stop.wait(interval_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    continue  # busy or locked: the next round catches up
        finally:
            conn.close()

    def _init(self, busy_timeout_ms: int) -> int:
        """Pragmas, schema, and the journal folded; the journal's last sequence number (0
        for an in-memory database, which has none)."""
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        use_wal(conn, busy_timeout_ms / 1000.0, name=self._path)
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        # counters of a 100,000-key pool are ~15 MB; the 2 MB default cache would go to the OS
        # for most random-key admissions
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # truncate the WAL file after reset
        with self._write() as c:
            for stmt in _SCHEMA:
                c.execute(stmt)
            if self._use is None:  # ":memory:": no other process, no journal
                return 0
            # a memory-mode owner that died left up to its last second in the journal: folded
            # before anything is read (an owner's memory, a sharer's admissions)
            seq = replay(c, self._journal)
        self._journal.clear()  # once the tables hold it
        return seq

    @contextmanager
    def _tx(self, begin: str, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction on the shared connection (the lock keeps them from interleaving);
        a ``write`` one holds the file's writers' lock too (:meth:`_write`)."""
        use = self._use if write else None
        with (
            self._lock,
            use.writing(self._busy_timeout_ms) if use is not None else contextlib.nullcontext(),
        ):
            conn = self._conn
            conn.execute(begin)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: the lock is taken at BEGIN, so reads inside see final state.
        Other processes' writers queue on the file's writers' lock first (``FileUse.writing``:
        no sleep in SQLite's busy handler)."""
        with self._tx("BEGIN IMMEDIATE", write=True) as conn:
            yield conn
        if self._checkpointer is not None:
            now = time.monotonic()
            if now - self._inline_checkpoint_at >= _INLINE_CHECKPOINT_S:
                self._inline_checkpoint_at = now
                with self._lock, contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A read snapshot, so several queries (totals vs keys) agree with each other."""
        return self._tx("BEGIN")

    # -- hot path ---------------------------------------------------------------------------

    @staticmethod
    def _due(seen: dict[Any, int], key: Any, now_ms: int) -> bool:
        last = seen.get(key)
        if last is not None and 0 <= now_ms - last < _HOUSEKEEPING_MS:
            return False
        if len(seen) >= _HOUSEKEEPING_ENTRIES:
            seen.clear()  # bounded memory; the cost is one extra write per key afterwards
        seen[key] = now_ms
        return True

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        _check_key(req.key_id)
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:  # not handed over meanwhile
                    return self._admit(mem, req)
        if self._fwd is not None:
            return await self._forwarded("admit", req)  # type: ignore[no-any-return]
        # an admission whose caller went away before the commit is not made: nobody would
        # settle or release what it reserved
        return await self._grouped(lambda ops: self._admit(ops, req), for_caller_only=True)

    def _admit(self, ops: _Ops, req: AdmitRequest) -> AdmitResult:
        """The admission of :class:`~fairgate.quota.ports.QuotaStore` (one atomic step: the
        caller holds the transaction, or the lock of the in-memory counters)."""
        pool, key, now = req.pool_id, req.key_id, req.now_ms
        if self._due(self._reclaimed, pool, now):
            expired = ops.expired(pool, now, RECLAIM_BATCH)
            for rid, _, rkey, rparts in expired:
                _undo(ops, pool, rkey, rparts, now)
                ops.drop(rid)
            if len(expired) == RECLAIM_BATCH:  # more may be waiting: look again next time
                self._reclaimed.pop(pool, None)
        if self._due(self._touched, (pool, key), now):
            ops.touch(pool, key, now)

        totals: list[Count] = []
        mine: list[Count] = []
        values: list[tuple[float, float, float]] = []
        parts: list[_Part] = []
        for check in req.checks:
            w = check.window_ms
            anchor = check.anchor
            curr = now // w if anchor is None else bucket_index(now, w, anchor)
            total, own = ops.counts(pool, key, check.key, w, curr, check.scope == "pool", anchor)
            totals.append(total)
            mine.append(own)
            if anchor is None:  # Count.value, the fade shared by both counts
                f = fade(now, w)
                values.append((total.prev * f + total.curr, own.prev * f + own.curr, own.curr))
            else:  # an anchored window counts its current bucket alone
                values.append((total.curr, own.curr, own.curr))
            if check.cost != 0:  # what a reservation would add, in the bucket just read
                parts.append((check.key, w, curr, check.cost, _SCOPE_TEXT[check.scope]))

        verdict = evaluate(req.checks, values, req.policy, req.threshold)
        waiting, full = False, None
        if req.hold is not None:
            queue = SqlWaiters(ops.c) if isinstance(ops, _SqlOps) else self._waiters
            verdict, waiting, full = _queue_step(queue, req, values, verdict)
        if verdict.outcome is Outcome.BLOCK:
            # a retry of an admission whose reply was lost must learn that it reserved, however
            # full the pool is by now (what admit.lua says before deciding); asked here only, an
            # admission that reserves finds the id held at ``put``, at no extra read
            if ops.holds(req.reservation_id):
                raise ReservationExists(req.reservation_id)
            return AdmitResult(verdict, tuple(totals), tuple(mine), False, waiting, full)

        # the reservation first: an id already held refuses before anything is added
        ops.put(req.reservation_id, pool, key, now + req.lease_ms, parts)
        for part in parts:
            ops.add(pool, key, part)
        return AdmitResult(verdict, tuple(totals), tuple(mine), reserved=True)

    async def settle(
        self,
        pool_id: str,
        key_id: str,
        reservation_id: str,
        usage: Sequence[UsageItem],
        now_ms: int,
    ) -> None:
        _check_key(key_id)
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    self._settle(mem, pool_id, key_id, reservation_id, usage, now_ms)
                    return
        if self._fwd is not None:
            await self._forwarded_later("settle", pool_id, key_id, reservation_id, usage, now_ms)
            return
        await self._grouped(
            lambda ops: self._settle(ops, pool_id, key_id, reservation_id, usage, now_ms)
        )

    def _grouped(self, op: Callable[[_SqlOps], T], *, for_caller_only: bool = False) -> Future[T]:
        """``op`` in this loop turn's group commit (:meth:`_commit_group`); its result.
        ``for_caller_only``: skipped if its caller is cancelled before the group runs (a
        settle, a release, a record are made all the same: they account for work done)."""
        loop = asyncio.get_running_loop()
        done: Future[T] = loop.create_future()
        if not self._group:
            loop.call_soon(self._commit_group)
        self._group.append((op, done, for_caller_only))
        return done

    def _commit_group(self) -> None:
        """Group commit (transactional mode): every write asked in one loop turn (admissions,
        settles, releases, records) in one write transaction, in the order asked (an admission
        decides on what the ones before it wrote: exact as one transaction each), each in a
        savepoint of its own, so one that fails leaves the others intact. Each caller is
        answered after the commit (a write that returned is on disk, as before); what the group
        saves is a transaction per request, which is what several processes on one file queue
        for."""
        batch, self._group = self._group, []
        if not batch:
            return
        results: list[tuple[Any, BaseException | None]] = []
        try:
            with self._write() as c:
                ops = _SqlOps(c)
                for op, done, for_caller_only in batch:
                    if for_caller_only and done.cancelled():
                        results.append((None, None))
                        continue
                    c.execute("SAVEPOINT op")
                    try:
                        results.append((op(ops), None))
                    except Exception as exc:  # handed to that write's caller
                        c.execute("ROLLBACK TO op")
                        results.append((None, exc))
                    c.execute("RELEASE op")
        except Exception as exc:  # the whole group's failure is every caller's
            for _, done, _ in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        for (_, done, _), (result, error) in zip(batch, results, strict=True):
            if done.done():  # its caller went away: it was written all the same
                continue
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)

    def _settle(
        self,
        ops: _Ops,
        pool_id: str,
        key_id: str,
        reservation_id: str,
        usage: Sequence[UsageItem],
        now_ms: int,
    ) -> None:
        taken = ops.take(reservation_id, pool_id)
        # Net the reservation against the actual use per (counter, bucket): usually both sit
        # in the current bucket, so a settle is one write per counter (none when the
        # estimate was exact, as for requests) instead of an undo plus an add.
        delta: dict[tuple[str, int, int, str], float] = {}
        owner = key_id
        if taken is not None:
            owner = taken[0]
            for counter, window_ms, bucket, amount, scope in taken[1]:
                if bucket >= now_ms // window_ms - 1:  # still counts: current or previous
                    k = (counter, window_ms, bucket, scope)
                    delta[k] = delta.get(k, 0.0) - amount
        if owner != key_id:  # a mismatched key must not move one key's counts to another
            _apply_delta(ops, pool_id, owner, delta)
            delta = {}
        for item in usage:
            amount = float(item.amount)
            if amount == 0:
                continue
            w, anchor = item.window_ms, item.anchor
            bucket = now_ms // w if anchor is None else bucket_index(now_ms, w, anchor)
            k = (item.key, w, bucket, item.scope)
            delta[k] = delta.get(k, 0.0) + amount
            if item.scope == "pool":
                ops.cum_add(pool_id, item.key, amount)
        _apply_delta(ops, pool_id, key_id, delta)
        if self._due(self._touched, (pool_id, key_id), now_ms):
            ops.touch(pool_id, key_id, now_ms)

    async def release(self, pool_id: str, reservation_id: str, now_ms: int) -> bool:
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    return _drop(mem, pool_id, reservation_id, now_ms)
        if self._fwd is not None:
            return bool(await self._forwarded_later("release", pool_id, reservation_id, now_ms))
        return await self._grouped(lambda ops: _drop(ops, pool_id, reservation_id, now_ms))

    async def record(
        self, pool_id: str, key_id: str, usage: Sequence[UsageItem], now_ms: int
    ) -> None:
        _check_key(key_id)
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    _apply_usage(mem, pool_id, key_id, usage, now_ms)
                    return
        if self._fwd is not None:
            await self._forwarded_later("record", pool_id, key_id, usage, now_ms)
            return
        await self._grouped(lambda ops: _apply_usage(ops, pool_id, key_id, usage, now_ms))

    # -- reads ------------------------------------------------------------------------------

    async def peek(
        self, pool_id: str, key_id: str, counters: Sequence[CounterRef], now_ms: int
    ) -> dict[str, Count]:
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    return {r.key: _read_one(mem, pool_id, key_id, r, now_ms) for r in counters}
        if self._fwd is not None:
            return await self._forwarded("peek", pool_id, key_id, counters, now_ms)  # type: ignore[no-any-return]
        with self._read() as c:
            ops = _SqlOps(c)
            return {ref.key: _read_one(ops, pool_id, key_id, ref, now_ms) for ref in counters}

    async def leave(self, pool_id: str, waiter_id: str) -> bool:
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    return self._waiters.remove(pool_id, waiter_id)
        if self._fwd is not None:
            return await self._forwarded("leave", pool_id, waiter_id)  # type: ignore[no-any-return]
        return await self._grouped(lambda ops: SqlWaiters(ops.c).remove(pool_id, waiter_id))

    async def waiters(self, pool_id: str, now_ms: int) -> list[Waiter]:
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    return [w for w in self._waiters.list(pool_id) if w.deadline_ms > now_ms]
        if self._fwd is not None:
            return await self._forwarded("waiters", pool_id, now_ms)  # type: ignore[no-any-return]
        with self._read() as c:
            return [w for w in SqlWaiters(c).list(pool_id) if w.deadline_ms > now_ms]

    async def pool_usage(
        self,
        pool_id: str,
        key_ids: Sequence[str],
        counters: Sequence[CounterRef],
        now_ms: int,
    ) -> PoolCounts:
        mem = self._memory
        if mem is not None:
            with mem.lock:
                if self._memory is mem:
                    return _pool_counts(mem, pool_id, key_ids, counters, now_ms)
        if self._fwd is not None:
            return await self._forwarded("pool_usage", pool_id, key_ids, counters, now_ms)  # type: ignore[no-any-return]
        with self._read() as c:
            return _pool_counts(_SqlOps(c), pool_id, key_ids, counters, now_ms)

    async def active_keys(self, pool_id: str, since_ms: int) -> list[str]:
        if self._fwd is not None:
            return await self._forwarded("active_keys", pool_id, since_ms)  # type: ignore[no-any-return]
        with self._quiet(), self._lock:
            return [str(r[0]) for r in self._conn.execute(_ACTIVE, (pool_id, since_ms))]

    async def anchors(self, pool_id: str) -> dict[str, Anchor]:
        if self._fwd is not None:
            return await self._forwarded("anchors", pool_id)  # type: ignore[no-any-return]
        with self._lock:
            rows = self._conn.execute(_ANCHORS, (pool_id,)).fetchall()
        return {str(k): Anchor(int(r), int(b), str(s)) for k, r, b, s in rows}

    async def set_anchor(
        self,
        pool_id: str,
        counter: str,
        window_ms: int,
        reset_ms: int,
        now_ms: int,
        source: str,
    ) -> Anchor | None:
        if self._fwd is not None:
            return await self._forwarded(  # type: ignore[no-any-return]
                "set_anchor", pool_id, counter, window_ms, reset_ms, now_ms, source
            )
        with self._write() as c:
            row = c.execute(_ANCHOR_GET, (pool_id, counter)).fetchone()
            current = None if row is None else Anchor(int(row[0]), int(row[1]), str(row[2]))
            moved = reanchor(current, reset_ms, window_ms, now_ms, source)
            if moved is None:
                return current
            c.execute(
                _ANCHOR_PUT,
                (pool_id, counter, window_ms, moved.reset_ms, moved.index, moved.source),
            )
            return moved

    async def cumulative(self, pool_id: str, counter_keys: Sequence[str]) -> dict[str, float]:
        if self._fwd is not None:
            return await self._forwarded("cumulative", pool_id, counter_keys)  # type: ignore[no-any-return]
        out: dict[str, float] = {}
        with self._quiet(), self._read() as c:
            for k in counter_keys:
                row = c.execute(_CUM_GET, (pool_id, k)).fetchone()
                out[k] = float(row[0]) if row is not None else 0.0
        return out

    # -- maintenance ------------------------------------------------------------------------

    async def clear(self, pool_id: str) -> None:
        if self._fwd is not None:
            await self._forwarded("clear", pool_id)
            return
        with self._quiet() as mem:
            with self._write() as c:
                for stmt in _CLEAR:
                    c.execute(stmt, (pool_id,))
                SqlWaiters(c).clear(pool_id)
            if mem is not None:
                mem.forget_pool(pool_id)
            self._waiters.clear(pool_id)

    async def gc(self, now_ms: int, retention_ms: int) -> GcResult:
        """Besides old buckets, undo expired reservations of every pool.

        Admission reclaims only its own pool, a few at a time; a pool nobody asks any more would
        otherwise keep stale reservations (and their amounts) forever. Undoing them is exactly
        what the next admission would do, so it is safe at any time.
        """
        if self._fwd is not None:
            return await self._forwarded("gc", now_ms, retention_ms)  # type: ignore[no-any-return]
        with self._quiet() as mem:
            if mem is not None:  # the reservations are in memory, the rest is in the file
                undone = 0
                while (n := _reclaim_all(mem, now_ms, _GC_RESERVATION_BATCH)) > 0:
                    undone += n
                deleted, forgotten = self._gc_rows(now_ms, retention_ms)
                mem.forget_old(now_ms, retention_ms)
                return GcResult(deleted, forgotten, undone)
        undone = 0
        while True:
            with self._write() as c:
                n = _reclaim_all(_SqlOps(c), now_ms, _GC_RESERVATION_BATCH)
            undone += n
            if n < _GC_RESERVATION_BATCH:
                break
        deleted, forgotten = self._gc_rows(now_ms, retention_ms)
        return GcResult(deleted, forgotten, undone)

    def _gc_rows(self, now_ms: int, retention_ms: int) -> tuple[int, int]:
        """Delete old buckets and forget keys inactive past the retention: (buckets, keys)."""
        with self._write() as c:
            deleted = c.execute(_GC_COUNTERS, (now_ms, retention_ms)).rowcount
            forgotten = c.execute(_GC_ACTIVE, (now_ms - retention_ms,)).rowcount
        return max(0, deleted), max(0, forgotten)

    async def ping(self) -> bool:
        if self._fwd is not None:
            try:
                return bool(await self._forwarded("ping"))
            except sqlite3.Error:
                return False
        try:
            with self._lock:
                row = self._conn.execute("SELECT 1").fetchone()
        except sqlite3.Error:
            return False
        return row is not None and row[0] == 1

    async def confirm_alive(self) -> bool:
        """The file is local: a ping answers whatever the event loop's state."""
        return await self.ping()

    async def warm(self) -> None:
        """Nothing to open: the connection exists from the constructor on."""

    async def close(self) -> None:
        """Commits what memory mode holds first: a graceful stop loses nothing."""
        if self._fwd is not None:
            await self._fwd.drain()
            self._fwd.close()
            self._fwd = None
        if self._server is not None:  # forwarders find the next owner
            self._server.close()
            self._server = None
        self._commit_group()
        if self._behind is not None:
            self._behind.stop()
            self._behind = None
            self._memory = None
        self._journal.close()
        if self._use is not None:
            self._use.close()
            self._use = None
        self._stop.set()
        if self._checkpointer is not None:
            self._checkpointer.join(timeout=5)
            self._checkpointer = None
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


def _queue_step(
    queue: WaiterQueue,
    req: AdmitRequest,
    values: Sequence[tuple[float, float, float]],
    verdict: Verdict,
) -> tuple[Verdict, bool, QueueFull | None]:
    """The queue's part of an admission of a ``hold`` pool, in its atomic step
    (:func:`fairgate.quota.queue.queued_admission`): the verdict, whether the request waits
    now, and whether it was refused at once for a full queue."""
    assert req.hold is not None
    pool, hold = req.pool_id, req.hold
    queue.purge(pool, req.now_ms)
    verdict, step, share = queued_admission(
        req.checks,
        [v[1] for v in values],
        verdict,
        hold,
        queue.list(pool),
        req.key_id,
        req.now_ms,
    )
    if step.join:
        queue.put(pool, step.waiter(req.key_id, share, hold))
    else:
        queue.remove(pool, hold.waiter_id)
    return verdict, step.join, step.full


def _check_key(key_id: str) -> None:
    # A client key spelled like the total row would read and write the pool total as its own.
    if key_id == TOTAL_KEY:
        msg = f"key id {TOTAL_KEY!r} is reserved for pool totals"
        raise ValueError(msg)


def _counts(
    rows: Sequence[Any], key_id: str, curr: int, anchor: Anchor | None = None
) -> tuple[Count, Count]:
    total_prev = total_curr = mine_prev = mine_curr = 0.0
    for rkey, bucket, value in rows:
        v = float(value)
        if rkey == key_id:
            if bucket == curr:
                mine_curr = v
            else:
                mine_prev = v
        elif bucket == curr:
            total_curr = v
        else:
            total_prev = v
    return Count(total_prev, total_curr, anchor), Count(mine_prev, mine_curr, anchor)


def _read_one(ops: _Ops, pool_id: str, key_id: str, ref: CounterRef, now_ms: int) -> Count:
    curr = bucket_index(now_ms, ref.window_ms, ref.anchor)
    return ops.counts(pool_id, key_id, ref.key, ref.window_ms, curr, False, ref.anchor)[1]


def _pool_counts(
    ops: _Ops, pool_id: str, key_ids: Sequence[str], counters: Sequence[CounterRef], now_ms: int
) -> PoolCounts:
    totals = {ref.key: _read_one(ops, pool_id, TOTAL_KEY, ref, now_ms) for ref in counters}
    per_key = {
        k: {ref.key: _read_one(ops, pool_id, k, ref, now_ms) for ref in counters} for k in key_ids
    }
    return PoolCounts(totals=totals, per_key=per_key)


def _drop(ops: _Ops, pool_id: str, reservation_id: str, now_ms: int) -> bool:
    taken = ops.take(reservation_id, pool_id)
    if taken is None:
        return False
    _undo(ops, pool_id, taken[0], taken[1], now_ms)
    return True


def _reclaim_all(ops: _Ops, now_ms: int, limit: int) -> int:
    """Undo up to ``limit`` expired reservations of any pool; how many were undone."""
    expired = ops.expired(None, now_ms, limit)
    for rid, pool, rkey, parts in expired:
        _undo(ops, pool, rkey, parts, now_ms)
        ops.drop(rid)
    return len(expired)


def _apply_delta(
    ops: _Ops,
    pool_id: str,
    key_id: str,
    delta: dict[tuple[str, int, int, str], float],
) -> None:
    for (counter, window_ms, bucket, scope), amount in delta.items():
        if amount > 0:
            ops.add(pool_id, key_id, (counter, window_ms, bucket, amount, scope))
        elif amount < 0:
            ops.sub(pool_id, key_id, (counter, window_ms, bucket, -amount, scope))


def _undo(ops: _Ops, pool_id: str, key_id: str, parts: Sequence[_Part], now_ms: int) -> None:
    """Take a reservation's amounts back out, but only from buckets that still count.

    A bucket older than the previous one no longer contributes to any value (and may already be
    collected), so there is nothing to take back from it.
    """
    for part in parts:
        _, window_ms, bucket, _, _ = part
        if bucket < bucket_index(now_ms, window_ms) - 1:
            continue
        ops.sub(pool_id, key_id, part)


def _apply_usage(
    ops: _Ops, pool_id: str, key_id: str, usage: Sequence[UsageItem], now_ms: int
) -> None:
    for item in usage:
        if item.amount == 0:
            continue
        part = (
            item.key,
            item.window_ms,
            bucket_index(now_ms, item.window_ms, item.anchor),
            float(item.amount),
            item.scope,
        )
        ops.add(pool_id, key_id, part)
        if item.scope == "pool":
            ops.cum_add(pool_id, item.key, float(item.amount))


def _settle_now(
    store: SqliteQuotaStore,
    mem: MemoryCounters,
    pool_id: str,
    key_id: str,
    reservation_id: str,
    usage: Sequence[UsageItem],
    now_ms: int,
) -> None:
    store._settle(mem, pool_id, key_id, reservation_id, usage, now_ms)


def _peek_now(
    _: SqliteQuotaStore,
    mem: MemoryCounters,
    pool_id: str,
    key_id: str,
    counters: Sequence[CounterRef],
    now_ms: int,
) -> dict[str, Count]:
    return {r.key: _read_one(mem, pool_id, key_id, r, now_ms) for r in counters}


#: (Owner) the forwarded calls answered at once from memory (under the counters' lock): each
#: what the method's own memory path does
_AT_ONCE: dict[str, Callable[..., Any]] = {
    "admit": lambda store, mem, req: store._admit(mem, req),
    "settle": _settle_now,
    "release": lambda _, mem, pool_id, rid, now_ms: _drop(mem, pool_id, rid, now_ms),
    "record": lambda _, mem, *args: _apply_usage(mem, *args),
    "peek": _peek_now,
    "pool_usage": lambda _, mem, *args: _pool_counts(mem, *args),
}
