"""Settings repository: string values by dotted key (``quotaStore.driver``)."""

from __future__ import annotations

import sqlite3
import time


class SettingsRepo:
    def __init__(self, conn: sqlite3.Connection) -> None:
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
