"""Schema migrations of the metadata DB, in order. Append only; never edit a shipped one."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: settings (DB settings win over env and config file)
    """
    CREATE TABLE IF NOT EXISTS settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE IF NOT EXISTS provider_plans (
        connection_id TEXT PRIMARY KEY,
        dimensions TEXT NOT NULL,
        updated_ms INTEGER NOT NULL DEFAULT 0
    )
    """,
)
