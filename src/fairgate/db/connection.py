"""The metadata database: one SQLite file, WAL, migrations applied idempotently on open."""

from __future__ import annotations

import os
import sqlite3

from fairgate.db.common import transaction
from fairgate.db.schema import MIGRATIONS, statements
from fairgate.files import private_sqlite
from fairgate.sqlite_journal import use_wal


def open_db(path: str | os.PathLike[str], *, migrate_it: bool = True) -> sqlite3.Connection:
    """Open (creating it 0600 in a 0700 directory: it holds upstream credentials) and migrate
    (``migrate_it=False``: a further connection of a process that has migrated already)."""
    p = private_sqlite(path)
    conn = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout=5000")
    use_wal(conn, 5.0, name=str(p))  # replicas opening a fresh file together: retried
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    if migrate_it:
        migrate(conn)
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the migrations not applied yet, each in its own transaction; returns the version."""
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    current = int(row[0] or 0)
    for version, migration in enumerate(MIGRATIONS, start=1):
        if version <= current:
            continue
        with transaction(conn):  # BEGIN IMMEDIATE: the write lock, COMMIT or ROLLBACK
            # re-check under the write lock: another process may have migrated meanwhile
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            if int(row[0] or 0) >= version:
                continue
            for stmt in statements(migration, "sqlite"):
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_version(version) VALUES (?)", (version,))
        current = version
    return current
