"""The WAL switch every fairgate database makes on open (``fairgate.sqlite_journal``): SQLite
refuses it at once while it cannot have the file alone, so it is retried until a deadline.
Real SQLite files; the waits and the clock are injected."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fairgate.sqlite_journal import use_wal


def _held_by_a_reader(path: Path) -> sqlite3.Connection:
    """A connection holding a read snapshot of a fresh rollback-journal file (SQLite cannot
    switch it to WAL meanwhile)."""
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("CREATE TABLE t (x)")
    reader.execute("INSERT INTO t VALUES (1)")
    reader.execute("BEGIN")
    reader.execute("SELECT x FROM t").fetchall()
    return reader


def test_the_switch_is_retried_until_the_file_is_free(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    reader = _held_by_a_reader(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)  # no busy handler wait
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            conn.execute("PRAGMA journal_mode = WAL")  # the plain switch fails at once
        waits: list[float] = []

        def wait(seconds: float) -> None:
            waits.append(seconds)
            if len(waits) == 3:
                reader.execute("COMMIT")  # the other side lets go while we wait

        use_wal(conn, 5.0, sleep=wait)
        assert len(waits) == 3
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
        reader.close()


def test_a_file_never_free_fails_at_the_deadline_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    reader = _held_by_a_reader(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    now = [0.0]

    def wait(seconds: float) -> None:
        now[0] += seconds

    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            use_wal(conn, 2.0, name=str(path), sleep=wait, monotonic=lambda: now[0])
        assert 2.0 <= now[0] < 2.1  # it waited out the timeout, in its short steps
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # nothing changed
    finally:
        conn.close()
        reader.close()


def test_a_memory_database_is_left_as_it_is() -> None:
    conn = sqlite3.connect(":memory:")
    use_wal(conn, 1.0, sleep=lambda s: pytest.fail("no wait expected"))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "memory"
