"""What the SQLite store's write-behind commits: a batch of rows taken from the in-memory
counters (:mod:`fairgate.store.sqlite.memory`), and the statements that write it into the quota
tables. Its own module so everything that writes a batch (the write-behind's commit, and any
process that folds one into the tables) writes it the same way, with nothing from the store.

Every row says where the state *is*, not how it moved, except two that are additions by nature:
counters are absolute values (only the file's owner writes them, so its value is the value),
reservations are put or deleted by id, an active mark keeps the later time, and the cumulative
totals are added. Writing batches in the order they were taken therefore always leaves the
tables at the state of the last one, and a batch must be written exactly once (the cumulative
totals would count twice)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import zlib
from dataclasses import dataclass, field

import orjson

SET_COUNTER = (
    "INSERT INTO quota_counter (pool_id, key_id, counter, bucket, window_ms, value)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (pool_id, key_id, counter, bucket) DO UPDATE SET value = excluded.value"
)
SET_RESERVATION = (
    "INSERT OR REPLACE INTO quota_reservation (id, pool_id, key_id, expires_ms, parts)"
    " VALUES (?, ?, ?, ?, ?)"
)
DELETE_RESERVATION = "DELETE FROM quota_reservation WHERE id = ?"
DELETE_RESERVATIONS = "DELETE FROM quota_reservation"
TOUCH = (
    "INSERT INTO quota_active (pool_id, key_id, last_ms) VALUES (?, ?, ?)"
    " ON CONFLICT (pool_id, key_id) DO UPDATE SET last_ms = MAX(last_ms, excluded.last_ms)"
)
CUMULATIVE_ADD = (
    "INSERT INTO quota_cumulative (pool_id, counter, value) VALUES (?, ?, ?)"
    " ON CONFLICT (pool_id, counter) DO UPDATE SET value = value + excluded.value"
)


@dataclass(slots=True)
class Batch:
    """Everything that changed between two snapshots, as rows to write."""

    counters: list[tuple[str, str, str, int, int, float]] = field(default_factory=list)
    res_put: list[tuple[str, str, str, int, str]] = field(default_factory=list)
    res_del: list[tuple[str]] = field(default_factory=list)
    res_resync: bool = False
    touches: list[tuple[str, str, int]] = field(default_factory=list)
    cumulative: list[tuple[str, str, float]] = field(default_factory=list)
    first_change: float = 0.0  # monotonic time of the oldest change in the batch
    seq: int = 0  # how many changes the state had seen when the batch was taken


def write_batch(c: sqlite3.Connection, b: Batch) -> None:
    """Write ``b``'s rows on ``c``, inside the caller's write transaction."""
    c.executemany(SET_COUNTER, b.counters)
    if b.res_resync:
        c.execute(DELETE_RESERVATIONS)
    c.executemany(DELETE_RESERVATION, b.res_del)
    c.executemany(SET_RESERVATION, b.res_put)
    c.executemany(TOUCH, b.touches)
    c.executemany(CUMULATIVE_ADD, b.cumulative)


# -- the journal ------------------------------------------------------------------------------
#
# A write-behind commit that wrote every changed row into the quota tables cost a SQLite
# transaction (its locks, its WAL frames, four tables' B-trees), cold between requests, on the
# event loop, many times a second under load. One in which the batch was a single row of a
# journal table cost about the same: the transaction is the cost, not the rows (the figures:
# docs/performance.md, "Figures behind the code"). So the write-behind appends each batch to a
# file beside the database instead (one ``write``: in the OS page cache at once, so it survives
# a ``kill -9`` as a committed transaction with ``synchronous = OFF`` does), and folds what it
# appended into the tables at most once a second, where a counter written at every commit is
# written once.
#
# The tables say which batches they hold: a fold records the last batch's sequence number in
# the same transaction as its rows, and only then empties the file. A crash between the two
# leaves batches in the file that the tables already hold, and the next fold skips them, so a
# batch is folded exactly once (the cumulative totals are additions). A batch the crash cut in
# half fails its checksum and ends the journal: it was never reported committed. Every process
# that opens the file folds the journal first (:func:`replay`), under the write lock, before it
# reads or writes anything; an owner is the only process that appends, and a sharer gets in
# only after the owner has folded everything and handed over.

FOLDED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS quota_folded (one INTEGER PRIMARY KEY CHECK (one = 1),"
    " seq INTEGER NOT NULL, salt INTEGER NOT NULL)"
)
# the salt seeds every record's checksum: a journal left beside a database it does not belong
# to (the database deleted and created again) fails it and is ignored, not folded in
_FOLDED_INIT = (
    "INSERT OR IGNORE INTO quota_folded (one, seq, salt) VALUES (1, 0, abs(random() % 4294967296))"
)
_FOLDED_GET = "SELECT seq, salt FROM quota_folded WHERE one = 1"
_FOLDED_SET = "UPDATE quota_folded SET seq = ? WHERE one = 1"
_HAS_FOLDED = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'quota_folded'"
#: a record's head: sequence number, payload length, CRC-32 of both and the payload
_HEAD = struct.Struct("<QII")


def _dump_batch(b: Batch) -> bytes:
    return orjson.dumps((b.counters, b.res_put, b.res_del, b.res_resync, b.touches, b.cumulative))


def _load_batch(raw: bytes) -> Batch:
    counters, res_put, res_del, resync, touches, cumulative = orjson.loads(raw)
    return Batch(
        counters=[
            (str(p), str(k), str(c), int(b), int(w), float(v)) for p, k, c, b, w, v in counters
        ],
        res_put=[(str(i), str(p), str(k), int(e), str(parts)) for i, p, k, e, parts in res_put],
        res_del=[(str(i),) for (i,) in res_del],
        res_resync=bool(resync),
        touches=[(str(p), str(k), int(t)) for p, k, t in touches],
        cumulative=[(str(p), str(c), float(v)) for p, c, v in cumulative],
    )


def _crc(salt: int, seq: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(seq.to_bytes(8, "little"), salt))


class BatchJournal:
    """The write-behind's journal: ``<database>.batches``, batches appended one record each
    (head :data:`_HEAD`, then the batch as JSON)."""

    def __init__(self, db_path: str, *, sync: bool = False) -> None:
        """``sync``: each append reaches the disk before it counts as committed (the store's
        ``synchronous = FULL``, which fsyncs every commit: the journal keeps that promise
        for the batches it holds instead of the tables)."""
        self.path = db_path + ".batches"
        self._sync = sync
        self._fd = -1
        #: the database's salt (:data:`_FOLDED_INIT`), set by :func:`replay`
        self.salt = 0

    def append(self, seq: int, b: Batch) -> None:
        """Append batch number ``seq`` (``OSError`` if the file cannot be written)."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        payload = _dump_batch(b)
        record = _HEAD.pack(seq, len(payload), _crc(self.salt, seq, payload)) + payload
        if os.write(self._fd, record) != len(record):
            raise OSError("short write to the quota journal")
        if self._sync:
            os.fdatasync(self._fd)

    def records(self) -> list[tuple[int, Batch]]:
        """Every whole record, oldest first, up to the first that is not (a torn tail)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        out: list[tuple[int, Batch]] = []
        at = 0
        while at + _HEAD.size <= len(data):
            seq, n, crc = _HEAD.unpack_from(data, at)
            payload = data[at + _HEAD.size : at + _HEAD.size + n]
            if len(payload) < n or _crc(self.salt, seq, payload) != crc:
                break
            out.append((seq, _load_batch(payload)))
            at += _HEAD.size + n
        return out

    def clear(self) -> None:
        """Empty the file (once the tables hold everything in it)."""
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            return
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.path, 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def mark_folded(c: sqlite3.Connection, seq: int) -> None:
    """Record, inside the transaction that writes its rows, that the tables hold batch
    ``seq`` and every one before it."""
    c.execute(_FOLDED_SET, (seq,))


def replay(c: sqlite3.Connection, journal: BatchJournal) -> int:
    """Fold the journal's batches the tables do not hold yet, inside the caller's write
    transaction (a crash folds all of them or none); the last batch's sequence number, which
    an owner's next batch must exceed. The caller empties the journal after the commit. A
    database that was never written by this version (no ``quota_folded``) has no journal."""
    if c.execute(_HAS_FOLDED).fetchone() is None:
        return 0
    c.execute(_FOLDED_INIT)
    row = c.execute(_FOLDED_GET).fetchone()
    last = newest = int(row[0])
    journal.salt = int(row[1])
    for seq, b in journal.records():
        if seq > last:
            write_batch(c, b)
            newest = max(newest, seq)
    if newest != last:
        mark_folded(c, newest)
    return newest


class Unfolded:
    """The journal's batches since the last fold, merged into the rows a fold writes (the
    owner keeps them in memory instead of reading its own journal back): a counter changed in
    every batch is one row, and a reservation put and deleted within the same second is
    none. Merging follows :func:`write_batch`'s rules, so writing :meth:`batch` leaves the
    tables as writing the journal's batches one by one would."""

    __slots__ = ("_counters", "_cum", "_res", "_resync", "_touches")

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str, str, int], tuple[int, float]] = {}
        self._res: dict[str, tuple[str, str, str, int, str] | None] = {}
        self._resync = False
        self._touches: dict[tuple[str, str], int] = {}
        self._cum: dict[tuple[str, str], float] = {}

    def __len__(self) -> int:
        """How many rows a fold would write."""
        return len(self._counters) + len(self._res) + len(self._touches) + len(self._cum)

    def add(self, b: Batch) -> None:
        counters = self._counters
        for p, k, c, bucket, w, v in b.counters:
            counters[(p, k, c, bucket)] = (w, v)
        res = self._res
        if b.res_resync:  # the tables' reservations are all deleted first: nothing to undo
            res.clear()
            self._resync = True
        for (rid,) in b.res_del:
            # put since the last fold (a new reservation, or rewritten after a resync that
            # deletes the tables' copy anyway): it never reaches the tables
            if res.get(rid) is not None:
                del res[rid]
            else:
                res[rid] = None
        for row in b.res_put:
            res[row[0]] = row
        touches = self._touches
        for p, k, t in b.touches:
            old = touches.get((p, k))
            touches[(p, k)] = t if old is None or t > old else old
        cum = self._cum
        for p, c, v in b.cumulative:
            cum[(p, c)] = cum.get((p, c), 0.0) + v

    def batch(self) -> Batch:
        """The merged rows, as one batch to write."""
        return Batch(
            counters=[(p, k, c, b, w, v) for (p, k, c, b), (w, v) in self._counters.items()],
            res_put=[row for row in self._res.values() if row is not None],
            res_del=[(rid,) for rid, row in self._res.items() if row is None],
            res_resync=self._resync,
            touches=[(p, k, t) for (p, k), t in self._touches.items()],
            cumulative=[(p, c, v) for (p, c), v in self._cum.items()],
        )
