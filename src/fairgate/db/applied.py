"""Repository of ``config_applied``: per object, the form the config file last wrote.

The record is how a start tells an object the file wrote and nobody changed since (its form
still equals the record) from one changed, created or deleted through the admin API
(``fairgate.db.reconcile``). A connection's upstream secret is part of its form; it is stored
sealed like the connection's own (``fairgate.secretbox``), never in clear.
"""

from __future__ import annotations

import orjson

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.db.engine import schema_version
from fairgate.db.reconcile import KINDS, Form, Ref
from fairgate.db.schema import PROVENANCE_VERSION
from fairgate.secretbox import SecretBox


def has_provenance(conn: Database) -> bool:
    """Whether the DB's schema has the records (a DB of an earlier version read without
    migrating it, by ``fairgate config check``, has none yet)."""
    return schema_version(conn) >= PROVENANCE_VERSION


class AppliedRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK, *, box: SecretBox) -> None:
        self._conn = conn
        self._clock = clock
        self._box = box

    def all(self) -> dict[Ref, Form]:
        out: dict[Ref, Form] = {}
        for kind, ident, applied, secret in self._conn.execute(
            "SELECT kind, id, applied, secret FROM config_applied"
        ):
            kind_ = next((k for k in KINDS if k == kind), None)
            if kind_ is not None:  # a kind of a later version: not ours to judge
                out[kind_, str(ident)] = Form(orjson.loads(str(applied)), self._box.open(secret))
        return out

    def set(self, ref: Ref, form: Form) -> None:
        self._conn.execute(
            "INSERT INTO config_applied (kind, id, applied, secret, applied_ms) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, id) DO UPDATE SET "
            "applied = excluded.applied, secret = excluded.secret, "
            "applied_ms = excluded.applied_ms",
            (*ref, form.fields_json(), self._box.seal(form.secret), self._clock.now_ms()),
        )

    def forget(self, ref: Ref) -> None:
        self._conn.execute("DELETE FROM config_applied WHERE kind = ? AND id = ?", ref)
