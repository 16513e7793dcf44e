"""What the repository contract suite needs on both metadata engines besides the ``db`` fixture
(tests/integration/conftest.py)."""

from __future__ import annotations

from fairgate.db.base import Database
from fairgate.db.schema import REGISTRY_TABLES
from fairgate.secretbox import SecretBox

#: Every table a repository writes, so "nothing changed" covers all of them.
TABLES = (
    *REGISTRY_TABLES,
    "resilience_state",
    "meta_version",
    "config_applied",
    "retired_key_hashes",
)


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
