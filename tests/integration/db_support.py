"""What the repository contract suite needs on both metadata engines besides the ``db`` fixture
(tests/integration/conftest.py), and the connection records the integration tests' configs
hold."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from fairgate.db.base import Database
from fairgate.db.repos import NotFound
from fairgate.db.schema import MIGRATIONS, PROVENANCE_VERSION, REGISTRY_TABLES
from fairgate.secretbox import SecretBox

#: Every table a repository writes, so "nothing changed" covers all of them.
TABLES = (
    *REGISTRY_TABLES,
    "resilience_state",
    "meta_version",
    "config_applied",
    "retired_key_hashes",
)

#: What turns a database of this version back into one the version before config provenance
#: left: no record of what was applied or retired, and the columns and migrations since.
BEFORE_PROVENANCE = (
    "DROP TABLE config_applied",
    "DROP TABLE retired_key_hashes",
    "ALTER TABLE connections DROP COLUMN billing_fields",  # migration 9's
    "ALTER TABLE pools DROP COLUMN admission",  # migration 10's
    f"DELETE FROM schema_version WHERE version >= {PROVENANCE_VERSION}",
)


def migrate_sqlite_to(db: sqlite3.Connection, version: int) -> None:
    """Give a fresh SQLite file the schema an older fairgate left: the first ``version``
    migrations and their rows in ``schema_version`` (the upgrade tests start from it)."""
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for n, sql in enumerate(MIGRATIONS[:version], start=1):
        for stmt in (sql if isinstance(sql, str) else sql.sqlite).split(";\n"):
            if stmt.strip():
                db.execute(stmt)
        db.execute("INSERT INTO schema_version VALUES (?)", (n,))


def dump(db: Database) -> list[str]:
    """Every row of every table, in a stable order, on either engine (SQLite's ``iterdump`` is
    not portable)."""
    out: list[str] = []
    for table in TABLES:
        rows = [tuple(r) for r in db.execute(f"SELECT * FROM {table}").fetchall()]
        out.extend(f"{table} {row!r}" for row in sorted(rows, key=repr))
    return out


#: The key the repository tests seal connection secrets with (a fresh one per test run).
BOX = SecretBox([SecretBox.generate_key()])


def connection(
    cid: str, provider: str = "mock", base_url: str = "http://127.0.0.1:9/v1", **extra: Any
) -> dict[str, Any]:
    """A config file's connection ``cid`` serving any model (``models: ["*"]``), with ``extra``
    fields (a ``secret``, ``enabled`` ...); the default URL is a closed loopback port."""
    return {"id": cid, "provider": provider, "base_url": base_url, "models": ["*"], **extra}


def assert_not_found(*calls: Callable[[], object]) -> None:
    """Each of ``calls`` (a repository call on a missing record) raises ``NotFound``."""
    for call in calls:
        with pytest.raises(NotFound):
            call()
