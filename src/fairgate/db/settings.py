"""Settings repository: string values by dotted key (``quotaStore.driver``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fairgate.db.base import Database

#: DB setting of ``server.require_allocation`` (``true``/``false``), set by ``PUT /api/settings``.
REQUIRE_ALLOCATION = "access.requireAllocation"
#: Set by migration 5 in a DB that held connections or keys before the setting existed.
LEGACY_OPEN = "access.legacyOpen"


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """``server.require_allocation`` in force and where it came from: ``db`` (admin API),
    ``config`` (the file), ``default`` (a new data dir: on) or ``legacy`` (a data dir from before
    the setting that has not chosen yet: off, and a warning at start)."""

    required: bool
    source: Literal["db", "config", "default", "legacy"]


def access_policy(settings: Mapping[str, str], configured: bool | None) -> AccessPolicy:
    """DB setting > config file > default, like every other setting."""
    raw = settings.get(REQUIRE_ALLOCATION, "").strip().lower()
    if raw in ("true", "false"):
        return AccessPolicy(raw == "true", "db")
    if configured is not None:
        return AccessPolicy(configured, "config")
    if settings.get(LEGACY_OPEN) == "1":
        return AccessPolicy(False, "legacy")
    return AccessPolicy(True, "default")


class SettingsRepo:
    def __init__(self, conn: Database) -> None:
        self._conn = conn

    def get(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT INTO settings(key, value, updated_ms) VALUES (?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
            "updated_ms = excluded.updated_ms",
            (key, value, time.time_ns() // 1_000_000),
        )

    def delete(self, key: str) -> None:
        self._conn.execute("DELETE FROM settings WHERE key = ?", (key,))

    def all(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._conn.execute("SELECT key, value FROM settings")}
