"""Repository of client keys (``registry.ClientKey``).

Only ``hash_key(secret)`` is stored, no character of the secret (a key is shown by its id): a
leaked database must not hand out working keys or narrow a guess. A generated secret is returned
once by :meth:`KeyRepo.create` and is unrecoverable afterwards.

A secret rotated away or revoked is retired for good: its hash goes to ``retired_key_hashes``
and no key may have it again (:class:`Conflict`). Why here, in the one place every key write
passes: a key rotated because it leaked must never answer again, whatever writes it next (a
restart with the old secret still in the config file, an import, a typo'd hash).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database, Row
from fairgate.db.common import Conflict, dumps, found, strings_from_json, transaction, upsert
from fairgate.domain.keys import ClientKey, hash_key

SECRET_PREFIX = "fg-"
_COLUMNS = "id, name, key_hash, enabled, allowed_models, allowed_connections, allowed_providers"
#: Why a hash was retired: the key got a new secret, or the key was deleted.
RetiredReason = Literal["rotated", "revoked"]


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _row_to_key(row: Row) -> ClientKey:
    return ClientKey(
        id=row["id"],
        name=row["name"],
        key_hash=row["key_hash"],
        enabled=bool(row["enabled"]),
        allowed_models=strings_from_json(row["allowed_models"]),
        allowed_connections=frozenset(strings_from_json(row["allowed_connections"])),
        allowed_providers=frozenset(strings_from_json(row["allowed_providers"])),
    )


def _values(key: ClientKey) -> tuple[object, ...]:
    return (
        key.name,
        key.key_hash,
        int(key.enabled),
        dumps(list(key.allowed_models)),
        dumps(sorted(key.allowed_connections)),
        dumps(sorted(key.allowed_providers)),
    )


class KeyRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK) -> None:
        self._conn = conn
        self._clock = clock

    def all(self) -> list[ClientKey]:
        rows = self._conn.execute(f"SELECT {_COLUMNS} FROM client_keys ORDER BY id")
        return [_row_to_key(r) for r in rows]

    def find(self, key_id: str) -> ClientKey | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM client_keys WHERE id = ?", (key_id,)
        ).fetchone()
        return None if row is None else _row_to_key(row)

    def get(self, key_id: str) -> ClientKey:
        return found(self.find(key_id), f"key '{key_id}'")

    def by_hash(self, key_hash: str) -> ClientKey | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM client_keys WHERE key_hash = ?", (key_hash,)
        ).fetchone()
        return None if row is None else _row_to_key(row)

    def create(
        self,
        name: str,
        allowed_models: Sequence[str] = (),
        *,
        key_id: str | None = None,
        enabled: bool = True,
        allowed_connections: Sequence[str] = (),
        allowed_providers: Sequence[str] = (),
    ) -> tuple[ClientKey, str]:
        """A new key with a generated secret; returns ``(key, secret)``, the only time the
        secret exists outside the client. Without ``key_id`` an id ``key-<8 hex>`` is chosen."""
        secret = new_secret()
        with transaction(self._conn):
            if key_id is None:
                key_id = self._free_id()
            key = ClientKey(
                id=key_id,
                name=name or key_id,
                key_hash=hash_key(secret),
                enabled=enabled,
                allowed_models=tuple(allowed_models),
                allowed_connections=frozenset(allowed_connections),
                allowed_providers=frozenset(allowed_providers),
            )
            self.insert(key)
        return key, secret

    def insert(self, key: ClientKey) -> ClientKey:
        """Store a key whose hash is already known (seeding, import)."""
        with transaction(self._conn):
            if self.find(key.id) is not None:
                raise Conflict(f"key '{key.id}' already exists")
            self._check_hash_free(key)
            self._conn.execute(
                f"INSERT INTO client_keys ({_COLUMNS}, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key.id, *_values(key), self._clock.now_ms()),
            )
        return key

    def update(self, key: ClientKey) -> ClientKey:
        """Replace every field; a new hash retires the old one (a rotation)."""
        with transaction(self._conn):
            old = self.get(key.id)
            self._check_hash_free(key)
            if old.key_hash != key.key_hash:
                self._retire(old, "rotated")
            self._conn.execute(
                "UPDATE client_keys SET name = ?, key_hash = ?, enabled = ?, allowed_models = ?, "
                "allowed_connections = ?, allowed_providers = ? WHERE id = ?",
                (*_values(key), key.id),
            )
        return key

    def rotate(self, key_id: str) -> tuple[ClientKey, str]:
        """Give the key a new generated secret; the old one stops working at once. Returns
        ``(key, secret)``: as at creation, the only time the new secret is ever shown. The id,
        name, allowed models and allocations stay, so the key keeps its share of every pool."""
        secret = new_secret()
        with transaction(self._conn):
            key = replace(self.get(key_id), key_hash=hash_key(secret))
            self.update(key)
        return key, secret

    def upsert(self, key: ClientKey) -> str:
        """``created``, ``updated`` or ``unchanged`` (nothing written)."""
        return upsert(
            self._conn,
            lambda: self.find(key.id),
            lambda: key,
            lambda: self.insert(key),
            lambda: self.update(key),
        )

    def delete(self, key_id: str) -> None:
        """Its allocations go with it (ON DELETE CASCADE): a deleted key holds no share."""
        with transaction(self._conn):
            self._retire(self.get(key_id), "revoked")
            self._conn.execute("DELETE FROM client_keys WHERE id = ?", (key_id,))

    def retired_hashes(self) -> frozenset[str]:
        """Every hash rotated away or revoked (never a key's again)."""
        rows = self._conn.execute("SELECT key_hash FROM retired_key_hashes")
        return frozenset(str(r[0]) for r in rows)

    def is_retired(self, key_hash: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM retired_key_hashes WHERE key_hash = ?", (key_hash,)
        ).fetchone()
        return row is not None

    def _retire(self, key: ClientKey, reason: RetiredReason) -> None:
        self._conn.execute(
            "INSERT INTO retired_key_hashes (key_hash, key_id, reason, retired_ms) "
            "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (key.key_hash, key.id, reason, self._clock.now_ms()),
        )

    def _check_hash_free(self, key: ClientKey) -> None:
        other = self.by_hash(key.key_hash)
        if other is not None and other.id != key.id:
            # never say which key: that would confirm a guessed secret
            raise Conflict(f"key '{key.id}': this secret is already used by another key")
        if other is None and self.is_retired(key.key_hash):
            raise Conflict(
                f"key '{key.id}': this secret was rotated away or revoked and is never used "
                "again; give the key a new one"
            )

    def _free_id(self) -> str:
        while True:
            candidate = f"key-{secrets.token_hex(4)}"
            if self.find(candidate) is None:
                return candidate
