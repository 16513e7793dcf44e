"""Repository of user combos (SPEC §8): named virtual models routed over several targets.

A combo is stored as its :class:`~fairgate.config.ComboSpec` — the same model the config file and
the admin API validate — with ``targets`` and ``config`` as JSON columns. ``config`` holds only
the settings the combo sets itself (its layer of the config cascade), so a setting it leaves out
keeps following the defaults instead of being frozen at the value it had when the combo was
written.

Every write is checked in its transaction, before anything is written: the routing layer must
accept the combo (strategy, targets, options) and each target must name a provider that has a
connection (and, if it names one, a connection of that provider). A refused write raises
:class:`Invalid` naming the field (``strategy``, ``targets.1.provider``), so the admin API turns
it into a 422 and the DB is left exactly as it was.

The ``qtSd/<pool>/<model>`` quota-share combos are not stored here: the registry mints them from
the pools on every reload, so they can never drift out of sync with pool membership.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.config import ComboSpec, InvalidCombo
from fairgate.db.base import Database, Row
from fairgate.db.common import Conflict, Invalid, NotFound, dumps, found, transaction, upsert
from fairgate.routing.combo import Combo

__all__ = ["ComboRecord", "ComboRepo", "combo_fields"]

log = logging.getLogger("fairgate.db")


@dataclass(frozen=True, slots=True)
class ComboRecord:
    """A stored combo: its spec (as the admin API shows it) and when it was written."""

    spec: ComboSpec
    created_ms: int = 0
    updated_ms: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def combo(self, *layers: Mapping[str, object]) -> Combo:
        """The routing layer's combo; ``layers`` are the config layers below the combo's own."""
        return self.spec.to_combo(*layers)


def combo_fields(spec: ComboSpec) -> dict[str, Any]:
    """What a combo is, as JSON values: its strategy, targets and own config layer (what is
    stored, and what "unchanged" compares; the name is the combo's id)."""
    targets = [t.model_dump(mode="json", exclude_none=True) for t in spec.targets]
    return {"strategy": spec.strategy, "targets": targets, "config": spec.config.layer()}


def _columns(spec: ComboSpec) -> tuple[str, str, str]:
    """(strategy, targets JSON, config JSON): the stored columns of :func:`combo_fields`."""
    fields = combo_fields(spec)
    return fields["strategy"], dumps(fields["targets"]), dumps(fields["config"])


class ComboRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK) -> None:
        self._conn = conn
        self._clock = clock

    # -- reads ----------------------------------------------------------------------------

    def all(self) -> list[ComboRecord]:
        """Every readable combo, by name. A row that no longer validates (written by another
        version) is skipped and logged rather than taking the whole list down."""
        rows = self._conn.execute("SELECT * FROM combos ORDER BY name").fetchall()
        return [rec for rec in map(self._record, rows) if rec is not None]

    def find(self, name: str) -> ComboRecord | None:
        row = self._conn.execute("SELECT * FROM combos WHERE name = ?", (name,)).fetchone()
        return None if row is None else self._record(row)

    def get(self, name: str) -> ComboRecord:
        return found(self.find(name), f"combo '{name}'")

    def combos(
        self,
        global_layer: Mapping[str, object] | None = None,
        provider_layers: Mapping[str, Mapping[str, object]] | None = None,
    ) -> list[Combo]:
        """The registry's view: each stored combo built by the routing layer over the config
        cascade (built-in defaults → ``global_layer`` → the layer of its first target's
        provider → its own config). One that the routing layer now refuses is skipped and
        logged, so a reload never fails on it."""
        out: list[Combo] = []
        for rec in self.all():
            provider = rec.spec.targets[0].provider if rec.spec.targets else ""
            layers = [global_layer or {}, (provider_layers or {}).get(provider, {})]
            try:
                out.append(rec.combo(*layers))
            except InvalidCombo as exc:
                log.warning("combo %r skipped: %s", rec.name, exc)
        return out

    # -- writes ---------------------------------------------------------------------------

    def validate(self, spec: ComboSpec) -> Combo:
        """Check ``spec`` against the routing layer and the connections, without writing.
        Raises :class:`Invalid` with every problem, each naming its field."""
        problems: list[tuple[str, str]] = []
        combo: Combo | None = None
        try:
            combo = spec.to_combo()
        except InvalidCombo as exc:
            problems.extend(exc.problems)
        providers = {
            str(cid): str(provider)
            for cid, provider in self._conn.execute("SELECT id, provider FROM connections")
        }
        problems.extend(spec.reference_problems(providers))
        if problems or combo is None:
            raise Invalid(problems)
        return combo

    def create(self, spec: ComboSpec) -> ComboRecord:
        """Conflict if the name is taken; Invalid if the combo is refused."""
        with transaction(self._conn):
            if self._exists(spec.name):
                raise Conflict(f"combo '{spec.name}' already exists")
            self.validate(spec)
            now = self._clock.now_ms()
            self._conn.execute(
                "INSERT INTO combos (name, strategy, targets, config, created_ms, updated_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (spec.name, *_columns(spec), now, now),
            )
        return ComboRecord(spec, now, now)

    def replace(self, spec: ComboSpec) -> ComboRecord:
        """Replace strategy, targets and config of an existing combo (NotFound otherwise)."""
        with transaction(self._conn):
            row = self._conn.execute(
                "SELECT created_ms FROM combos WHERE name = ?", (spec.name,)
            ).fetchone()
            if row is None:
                raise NotFound(f"combo '{spec.name}' not found")
            self.validate(spec)
            now = self._clock.now_ms()
            self._conn.execute(
                "UPDATE combos SET strategy = ?, targets = ?, config = ?, updated_ms = ? "
                "WHERE name = ?",
                (*_columns(spec), now, spec.name),
            )
        return ComboRecord(spec, int(row[0]), now)

    def upsert(self, spec: ComboSpec) -> str:
        """``created``, ``updated`` or ``unchanged`` (nothing written): seeding is idempotent."""

        def stored() -> tuple[str, str, str] | None:
            row = self._conn.execute(
                "SELECT strategy, targets, config FROM combos WHERE name = ?", (spec.name,)
            ).fetchone()
            return None if row is None else self._stored(row)

        return upsert(
            self._conn,
            stored,
            lambda: _columns(spec),
            lambda: self.create(spec),
            lambda: self.replace(spec),
        )

    def delete(self, name: str) -> None:
        with transaction(self._conn):
            if not self._exists(name):
                raise NotFound(f"combo '{name}' not found")
            self._conn.execute("DELETE FROM combos WHERE name = ?", (name,))

    # -- internals ------------------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        row = self._conn.execute("SELECT 1 FROM combos WHERE name = ?", (name,)).fetchone()
        return row is not None

    @staticmethod
    def _stored(row: Row) -> tuple[str, str, str]:
        """The stored columns, re-serialised the way :func:`_columns` writes them (so a row
        written by hand with other spacing still compares equal)."""
        return (
            str(row["strategy"]),
            dumps(orjson.loads(str(row["targets"]))),
            dumps(orjson.loads(str(row["config"]))),
        )

    @staticmethod
    def _record(row: Row) -> ComboRecord | None:
        name = str(row["name"])
        try:
            spec = ComboSpec.model_validate(
                {
                    "name": name,
                    "strategy": row["strategy"],
                    "targets": orjson.loads(str(row["targets"])),
                    "config": orjson.loads(str(row["config"] or "{}")),
                }
            )
        except (ValidationError, orjson.JSONDecodeError) as exc:
            log.warning("combo %r in the database is unreadable: %s", name, exc)
            return None
        return ComboRecord(spec, int(row["created_ms"]), int(row["updated_ms"]))
