"""Repository of upstream connections (``registry.Connection``).

The upstream secret is stored sealed by the gateway's :class:`~fairgate.secretbox.SecretBox`
(Fernet: the gateway must send it upstream, so it is encrypted, not hashed) and opened only here,
into the domain object, whose ``repr`` hides it. ``db.sealing`` seals the rows written before.
"""

from __future__ import annotations

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database, Row
from fairgate.db.common import Conflict, dumps, found, strings_from_json, transaction, upsert
from fairgate.db.engine import schema_version
from fairgate.db.schema import BILLING_FIELDS_VERSION
from fairgate.domain.connections import AuthType, Connection, protocol_for
from fairgate.secretbox import SecretBox

_COLUMNS = (
    "id, provider, base_url, secret, protocol, auth_type, weight, max_concurrent, models, enabled, "
    "forward_headers, billing_fields"
)
#: What a DB before migration 9 holds (``fairgate config check`` reads one without migrating).
_COLUMNS_BEFORE_9 = _COLUMNS.removesuffix(", billing_fields")


def _row_to_connection(row: Row, box: SecretBox, billing: bool = True) -> Connection:
    return Connection(
        id=row["id"],
        provider=row["provider"],
        base_url=row["base_url"],
        secret=box.open(row["secret"]),
        protocol=protocol_for(row["provider"], row["protocol"]),
        auth_type=AuthType(row["auth_type"]),
        weight=float(row["weight"]),
        max_concurrent=None if row["max_concurrent"] is None else int(row["max_concurrent"]),
        models=strings_from_json(row["models"]),
        enabled=bool(row["enabled"]),
        forward_headers=strings_from_json(row["forward_headers"]),
        billing_fields=strings_from_json(row["billing_fields"]) if billing else (),
    )


def _values(c: Connection, box: SecretBox) -> tuple[object, ...]:
    return (
        c.provider,
        c.base_url,
        box.seal(c.secret),
        c.protocol.value,
        c.auth_type,
        c.weight,
        c.max_concurrent,
        dumps(list(c.models)),
        int(c.enabled),
        dumps(list(c.forward_headers)),
        dumps(list(c.billing_fields)),
    )


class ConnectionRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK, *, box: SecretBox) -> None:
        self._conn = conn
        self._clock = clock
        self._box = box
        self._billing: bool | None = None  # the DB has billing_fields (read once)

    def _read_columns(self) -> tuple[str, bool]:
        """The columns to read: a DB not migrated to 9 yet has no ``billing_fields`` (none
        allowed, as migration 9 would give it)."""
        if self._billing is None:
            self._billing = schema_version(self._conn) >= BILLING_FIELDS_VERSION
        return (_COLUMNS if self._billing else _COLUMNS_BEFORE_9), self._billing

    def all(self) -> list[Connection]:
        cols, billing = self._read_columns()
        rows = self._conn.execute(f"SELECT {cols} FROM connections ORDER BY id")
        return [_row_to_connection(r, self._box, billing) for r in rows]

    def find(self, connection_id: str) -> Connection | None:
        cols, billing = self._read_columns()
        row = self._conn.execute(
            f"SELECT {cols} FROM connections WHERE id = ?", (connection_id,)
        ).fetchone()
        return None if row is None else _row_to_connection(row, self._box, billing)

    def get(self, connection_id: str) -> Connection:
        return found(self.find(connection_id), f"connection '{connection_id}'")

    def pool_of(self, connection_id: str) -> str | None:
        row = self._conn.execute(
            "SELECT pool_id FROM pool_connections WHERE connection_id = ?", (connection_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def create(self, c: Connection) -> Connection:
        with transaction(self._conn):
            if self.find(c.id) is not None:
                raise Conflict(f"connection '{c.id}' already exists")
            self._conn.execute(
                f"INSERT INTO connections ({_COLUMNS}, created_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.id, *_values(c, self._box), self._clock.now_ms()),
            )
        return c

    def update(self, c: Connection) -> Connection:
        """Replace every field. A pool member may not change provider: a pool shares one
        provider's quota, so that would silently merge two unrelated quotas."""
        with transaction(self._conn):
            old = self.get(c.id)
            pool_id = self.pool_of(c.id)
            if pool_id is not None and old.provider != c.provider:
                raise Conflict(
                    f"connection '{c.id}' belongs to pool '{pool_id}' of provider "
                    f"'{old.provider}'; remove it from the pool before changing its provider"
                )
            self._conn.execute(
                "UPDATE connections SET provider = ?, base_url = ?, secret = ?, protocol = ?, "
                "auth_type = ?, weight = ?, max_concurrent = ?, models = ?, enabled = ?, "
                "forward_headers = ?, billing_fields = ? WHERE id = ?",
                (*_values(c, self._box), c.id),
            )
        return c

    def upsert(self, c: Connection) -> str:
        """``created``, ``updated`` or ``unchanged`` (nothing written); the secret is compared
        too (it is a dataclass field)."""
        return upsert(
            self._conn,
            lambda: self.find(c.id),
            lambda: c,
            lambda: self.create(c),
            lambda: self.update(c),
        )

    def delete(self, connection_id: str) -> None:
        """Refused while the connection is a pool member (the pool would silently lose
        capacity); its plan override goes with it."""
        with transaction(self._conn):
            self.get(connection_id)
            pool_id = self.pool_of(connection_id)
            if pool_id is not None:
                raise Conflict(
                    f"connection '{connection_id}' belongs to pool '{pool_id}'; "
                    "remove it from the pool first"
                )
            self._conn.execute(
                "DELETE FROM provider_plans WHERE connection_id = ?", (connection_id,)
            )
            self._conn.execute("DELETE FROM connections WHERE id = ?", (connection_id,))
