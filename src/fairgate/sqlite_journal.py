"""Switching a SQLite file to WAL, which every fairgate database uses.

Why a helper: the switch needs an exclusive moment on the file, and SQLite answers ``database is
locked`` at once when it cannot have it, without consulting the busy handler. Processes (or
threads) that open the same fresh file together, a second replica starting beside a first, or a
reader holding a snapshot at that moment all make a plain ``PRAGMA journal_mode = WAL`` fail
under load; the switch is therefore retried until a deadline.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

#: How long a failed switch waits before the next try (seconds).
RETRY_S = 0.01


def use_wal(
    conn: sqlite3.Connection,
    timeout_s: float,
    *,
    name: str = "the database",
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Put ``conn``'s database (``name``, for the error) in WAL mode, retrying while the file
    is busy, for at least a second and up to ``timeout_s``; ``sqlite3.OperationalError`` after
    that. An in-memory database (``:memory:``) cannot be WAL and needs no sharing: left as it
    is."""
    deadline = monotonic() + max(timeout_s, 1.0)
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode is not None and str(mode[0]).lower() in ("wal", "memory"):
                return
        except sqlite3.OperationalError:
            if monotonic() >= deadline:
                raise
        if monotonic() >= deadline:
            raise sqlite3.OperationalError(f"could not switch {name} to WAL journal mode")
        sleep(RETRY_S)
