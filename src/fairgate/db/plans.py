"""Repository of manual plan overrides per connection (the ``provider_plans`` table).

Resolution (override > catalog > empty) is :func:`fairgate.quota.catalog.resolve_plan`; this
module only stores the override. An empty override is never stored: "no override" is the
absence of a row, so deleting reverts to the catalog.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.db.common import Invalid, dims_from_json, dims_to_json, transaction
from fairgate.quota.model import Dimension


class PlanRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK) -> None:
        self._conn = conn
        self._clock = clock

    def get(self, connection_id: str) -> tuple[Dimension, ...] | None:
        row = self._conn.execute(
            "SELECT dimensions FROM provider_plans WHERE connection_id = ?", (connection_id,)
        ).fetchone()
        if row is None:
            return None
        return dims_from_json(row[0]) or None

    def all(self) -> dict[str, tuple[Dimension, ...]]:
        rows = self._conn.execute("SELECT connection_id, dimensions FROM provider_plans")
        out: dict[str, tuple[Dimension, ...]] = {}
        for cid, raw in rows:
            dims = dims_from_json(raw)
            if dims:
                out[str(cid)] = dims
        return out

    def set(self, connection_id: str, dims: Sequence[Dimension]) -> bool:
        """Store the override; False if it was already exactly this (nothing written)."""
        if not dims:
            raise Invalid([("dimensions", "a plan override needs at least one dimension")])
        with transaction(self._conn):
            if self.get(connection_id) == tuple(dims):
                return False
            self._conn.execute(
                "INSERT INTO provider_plans (connection_id, dimensions, updated_ms) "
                "VALUES (?, ?, ?) ON CONFLICT(connection_id) DO UPDATE SET "
                "dimensions = excluded.dimensions, updated_ms = excluded.updated_ms",
                (connection_id, dims_to_json(dims), self._clock.now_ms()),
            )
        return True

    def delete(self, connection_id: str) -> bool:
        """Revert to the catalog; True if there was an override."""
        with transaction(self._conn):
            cur = self._conn.execute(
                "DELETE FROM provider_plans WHERE connection_id = ?", (connection_id,)
            )
        return cur.rowcount > 0
