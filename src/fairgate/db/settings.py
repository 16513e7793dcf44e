"""Settings repository: string values by dotted key (``quotaStore.driver``)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from fairgate.db.base import Database
from fairgate.routing.aliases import ModelAlias, parse_aliases

log = logging.getLogger(__name__)

#: DB setting of ``server.require_allocation`` (``true``/``false``), set by ``PUT /api/settings``.
REQUIRE_ALLOCATION = "access.requireAllocation"
#: Set by migration 5 in a DB that held connections or keys before the setting existed.
LEGACY_OPEN = "access.legacyOpen"


#: DB setting of the model aliases (a JSON list of ``{"pattern", "target"}``), set by
#: ``PUT /api/model-aliases``; absent: the config file's ``model_aliases``.
MODEL_ALIASES = "models.aliases"


def model_aliases(
    settings: Mapping[str, str], configured: tuple[ModelAlias, ...]
) -> tuple[ModelAlias, ...]:
    """DB setting > config file, like every other setting. A stored value that no longer
    parses (the admin API validates before storing) falls back to the file, with a warning."""
    raw = settings.get(MODEL_ALIASES)
    if raw is None:
        return configured
    try:
        return parse_aliases(json.loads(raw))
    except ValueError as exc:
        log.warning("stored model aliases unusable (%s); using the config file's", exc)
        return configured


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
