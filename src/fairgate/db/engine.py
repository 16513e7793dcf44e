"""Which metadata DB to open: ``FAIRGATE_DATABASE_URL=postgresql://…`` (the settings'
``database_url``) selects PostgreSQL
(shared by every replica); unset, the metadata lives in ``fairgate.sqlite`` in the data
directory (shared by the workers of one machine).
"""

from __future__ import annotations

import os
from pathlib import Path

from fairgate.db.base import Database
from fairgate.db.connection import open_db
from fairgate.db.postgres import PgDatabase

#: Environment variable naming the metadata database (``postgresql://…``); unset → SQLite.
DATABASE_URL_ENV = "FAIRGATE_DATABASE_URL"


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def database_url(url: str | None) -> str | None:
    """``url`` checked (the settings' ``database_url``): a PostgreSQL URL, or None for the
    embedded SQLite file.

    A value that is neither empty nor a PostgreSQL URL is a configuration error (raised, so the
    CLI can print it) rather than a silent fallback to a per-replica SQLite file."""
    url = (url or "").strip()
    if not url:
        return None
    if not is_postgres_url(url):
        raise ValueError(
            f"{DATABASE_URL_ENV} must be a postgresql:// URL (unset it to use SQLite in the "
            "data directory)"
        )
    return url


def open_database(
    url: str | None,
    sqlite_path: str | os.PathLike[str],
    *,
    statement_deadline_s: float | None = None,
    migrate: bool = True,
) -> Database:
    """Open and migrate the metadata DB: PostgreSQL when ``url`` is set, else the SQLite file.
    ``statement_deadline_s``: on PostgreSQL, how long a statement may wait for the server
    before the connection is cut (for a connection used on the event loop; see
    ``fairgate.db.postgres``); SQLite is a local file and takes none. ``migrate=False``: a
    further connection of a process that opened (and so migrated) the DB already."""
    if url is not None:
        return PgDatabase.connect(url, migrate=migrate, statement_deadline_s=statement_deadline_s)
    return open_db(Path(sqlite_path), migrate_it=migrate)


def schema_version(db: Database) -> int:
    """The last migration applied to ``db`` (0: none, not even the version table), read
    without migrating: what a reader that must change nothing needs to know."""
    probe = (
        "SELECT 1 WHERE to_regclass('schema_version') IS NOT NULL"
        if isinstance(db, PgDatabase)
        else "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    )
    if db.execute(probe).fetchone() is None:
        return 0
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)
