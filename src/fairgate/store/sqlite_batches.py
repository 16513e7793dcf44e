"""What the SQLite store's write-behind commits: a batch of rows taken from the in-memory
counters (:mod:`fairgate.store.sqlite_memory`), and the statements that write it into the quota
tables. Its own module so everything that writes a batch (the write-behind's commit, and any
process that folds one into the tables) writes it the same way, with nothing from the store.

Every row says where the state *is*, not how it moved, except two that are additions by nature:
counters are absolute values (only the file's owner writes them, so its value is the value),
reservations are put or deleted by id, an active mark keeps the later time, and the cumulative
totals are added. Writing batches in the order they were taken therefore always leaves the
tables at the state of the last one, and a batch must be written exactly once (the cumulative
totals would count twice)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

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
