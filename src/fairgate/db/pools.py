"""Repository of pools: the ``pools`` row, its members (``pool_connections``) and its
allocations, read back as :class:`PoolRecord` (what is stored) or ``quota.model.Pool`` (what the
engine uses, dimensions resolved).

A pool's own ``dimensions`` are optional: empty means "the plan of the first member connection"
(its manual override, else the catalog), so a pool follows plan edits without being rewritten.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database, Row
from fairgate.db.common import (
    Conflict,
    Invalid,
    NotFound,
    caps_from_json,
    caps_to_json,
    dims_from_json,
    dims_to_json,
    found,
    transaction,
    upsert,
)
from fairgate.db.plans import PlanRepo
from fairgate.domain.units import Unit
from fairgate.quota.catalog import resolve_plan
from fairgate.quota.hold import NO_HOLD, HoldSettings
from fairgate.quota.model import (
    Allocation,
    Dimension,
    ModelCap,
    Policy,
    Pool,
    ShareMode,
    pool_limits,
)

DEFAULT_ACTIVE_WINDOW_MS = 15 * 60_000


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """A pool as stored. ``provider`` is derived from the members on write (callers may leave it
    empty); ``dimensions`` are the pool's explicit ones (empty = follow the first member's plan)."""

    id: str
    name: str
    connections: tuple[str, ...]
    dimensions: tuple[Dimension, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    share_mode: ShareMode = ShareMode.STATIC
    active_window_ms: int = DEFAULT_ACTIVE_WINDOW_MS
    provider: str = ""
    hold: HoldSettings = NO_HOLD


def resolve_pool(rec: PoolRecord, overrides: Mapping[str, tuple[Dimension, ...]]) -> Pool:
    """The engine's view: explicit dimensions, else the resolved plan of the first member,
    each as the pool enforces it (a plan's limit is one account's: × the members; a pool's own
    is the pool's, as written, except percent: ``quota.model.LimitBasis``)."""
    written = rec.dimensions
    from_plan = not written
    if from_plan and rec.connections:
        written = resolve_plan(rec.provider, overrides.get(rec.connections[0])).dimensions
    dims, per_connection = pool_limits(written, from_plan=from_plan, members=len(rec.connections))
    return Pool(
        id=rec.id,
        name=rec.name,
        provider=rec.provider,
        connections=rec.connections,
        dimensions=dims,
        allocations=rec.allocations,
        share_mode=rec.share_mode,
        active_window_ms=rec.active_window_ms,
        per_connection=per_connection,
        hold=rec.hold,
    )


def _columns(rec: PoolRecord) -> tuple[str, str, str, int, str, str]:
    """The pool row's own columns, in the order both the INSERT and the UPDATE name them
    (name, provider, share_mode, active_window_ms, dimensions, admission)."""
    return (
        rec.name,
        rec.provider,
        rec.share_mode.value,
        rec.active_window_ms,
        dims_to_json(rec.dimensions),
        json.dumps(rec.hold.as_json()),
    )


class PoolRepo:
    def __init__(self, conn: Database, clock: Clock = SYSTEM_CLOCK) -> None:
        self._conn = conn
        self._clock = clock

    # -- reads ----------------------------------------------------------------------------

    def records(self) -> list[PoolRecord]:
        rows = self._conn.execute("SELECT * FROM pools ORDER BY id").fetchall()
        members = self._members()
        allocs = self._allocations()
        return [self._record(r, members, allocs) for r in rows]

    def find_record(self, pool_id: str) -> PoolRecord | None:
        row = self._conn.execute("SELECT * FROM pools WHERE id = ?", (pool_id,)).fetchone()
        if row is None:
            return None
        return self._record(row, self._members(pool_id), self._allocations(pool_id))

    def record(self, pool_id: str) -> PoolRecord:
        return found(self.find_record(pool_id), f"pool '{pool_id}'")

    def all(self) -> list[Pool]:
        overrides = PlanRepo(self._conn).all()
        return [resolve_pool(r, overrides) for r in self.records()]

    def get(self, pool_id: str) -> Pool:
        return resolve_pool(self.record(pool_id), PlanRepo(self._conn).all())

    # -- writes ---------------------------------------------------------------------------

    def create(self, rec: PoolRecord) -> PoolRecord:
        with transaction(self._conn):
            if self.find_record(rec.id) is not None:
                raise Conflict(f"pool '{rec.id}' already exists")
            rec = self._checked(rec)
            now = self._clock.now_ms()
            self._conn.execute(
                "INSERT INTO pools (id, name, provider, share_mode, active_window_ms, "
                "dimensions, admission, created_ms, updated_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rec.id, *_columns(rec), now, now),
            )
            self._write_children(rec)
        return rec

    def update(self, rec: PoolRecord) -> PoolRecord:
        """Replace the pool: row, members and allocations."""
        with transaction(self._conn):
            self.record(rec.id)
            rec = self._checked(rec)
            self._conn.execute(
                "UPDATE pools SET name = ?, provider = ?, share_mode = ?, active_window_ms = ?, "
                "dimensions = ?, admission = ?, updated_ms = ? WHERE id = ?",
                (*_columns(rec), self._clock.now_ms(), rec.id),
            )
            self._conn.execute("DELETE FROM pool_connections WHERE pool_id = ?", (rec.id,))
            self._conn.execute("DELETE FROM allocations WHERE pool_id = ?", (rec.id,))
            self._write_children(rec)
        return rec

    def upsert(self, rec: PoolRecord) -> str:
        """``created``, ``updated`` or ``unchanged`` (nothing written)."""
        return upsert(
            self._conn,
            lambda: self.find_record(rec.id),
            lambda: self._checked(rec),
            lambda: self.create(rec),
            lambda: self.update(rec),
        )

    def validate(self, rec: PoolRecord) -> PoolRecord:
        """Check a record against the DB without writing (see :meth:`_checked`)."""
        return self._checked(rec)

    def upsert_many(self, recs: Sequence[PoolRecord]) -> list[str]:
        """Set each pool to exactly its record, in one transaction; outcome per record.

        The members of the pools being rewritten are released first, so an import may move a
        connection from one imported pool to another. Problems are reported as ``<index>.<field>``.
        """
        with transaction(self._conn):
            olds = [self.find_record(r.id) for r in recs]
            outcomes = [
                "created" if old is None else "unchanged" if self._same(old, r) else "updated"
                for r, old in zip(recs, olds, strict=True)
            ]
            self._conn.executemany(
                "DELETE FROM pool_connections WHERE pool_id = ?",
                [(r.id,) for r, o in zip(recs, outcomes, strict=True) if o == "updated"],
            )
            for i, (rec, outcome) in enumerate(zip(recs, outcomes, strict=True)):
                try:
                    if outcome == "created":
                        self.create(rec)
                    elif outcome == "updated":
                        self.update(rec)
                except Invalid as exc:
                    raise Invalid([(f"{i}.{f}", m) for f, m in exc.problems]) from None
            return outcomes

    @staticmethod
    def _same(old: PoolRecord, new: PoolRecord) -> bool:
        """Equal once canonical (the provider follows the members; allocations by key)."""
        allocs = tuple(sorted(new.allocations, key=lambda a: a.key_id))
        return old == replace(new, provider=old.provider, allocations=allocs)

    def delete(self, pool_id: str) -> None:
        with transaction(self._conn):
            self.record(pool_id)
            self._conn.execute("DELETE FROM pools WHERE id = ?", (pool_id,))

    def set_allocation(self, pool_id: str, alloc: Allocation) -> PoolRecord:
        """Give one key its allocation in the pool, or replace the one it has; the pool's other
        allocations stay as stored. Written inside one transaction, so two writers adding two
        keys cannot undo each other, as two full allocation lists sent at once would."""
        with transaction(self._conn):
            rec = self.record(pool_id)
            others = tuple(a for a in rec.allocations if a.key_id != alloc.key_id)
            return self.update(replace(rec, allocations=(*others, alloc)))

    def remove_allocation(self, pool_id: str, key_id: str) -> PoolRecord:
        """Take one key's allocation out of the pool (:class:`NotFound` when it has none)."""
        with transaction(self._conn):
            rec = self.record(pool_id)
            kept = tuple(a for a in rec.allocations if a.key_id != key_id)
            if len(kept) == len(rec.allocations):
                raise NotFound(f"key '{key_id}' has no allocation in pool '{pool_id}'")
            return self.update(replace(rec, allocations=kept))

    def set_model_caps(self, pool_id: str, key_id: str, caps: Iterable[ModelCap]) -> Allocation:
        with transaction(self._conn):
            rec = self.record(pool_id)
            alloc = next((a for a in rec.allocations if a.key_id == key_id), None)
            if alloc is None:
                raise NotFound(f"key '{key_id}' has no allocation in pool '{pool_id}'")
            alloc = replace(alloc, model_caps=tuple(caps))
            self._conn.execute(
                "UPDATE allocations SET model_caps = ? WHERE pool_id = ? AND key_id = ?",
                (caps_to_json(alloc.model_caps), pool_id, key_id),
            )
            self._touch(pool_id)
        return alloc

    # -- internals ------------------------------------------------------------------------

    def _checked(self, rec: PoolRecord) -> PoolRecord:
        """Validate the references and return the record with its provider derived.

        Unknown members or keys are :class:`Invalid` (the body is wrong); a member already in
        another pool is a :class:`Conflict` (the body is fine, the state disagrees).
        """
        problems: list[tuple[str, str]] = []
        providers: dict[str, str] = {}
        if not rec.connections:
            problems.append(("connections", "a pool needs at least one connection"))
        if len(set(rec.connections)) != len(rec.connections):
            problems.append(("connections", "duplicate connection"))
        for i, cid in enumerate(rec.connections):
            row = self._conn.execute(
                "SELECT provider FROM connections WHERE id = ?", (cid,)
            ).fetchone()
            if row is None:
                problems.append((f"connections.{i}", f"unknown connection '{cid}'"))
            else:
                providers[cid] = str(row[0])
        if len(set(providers.values())) > 1:
            problems.append(
                (
                    "connections",
                    "connections of a pool must share one provider "
                    f"(got {sorted(set(providers.values()))})",
                )
            )
        for i, alloc in enumerate(rec.allocations):
            row = self._conn.execute(
                "SELECT 1 FROM client_keys WHERE id = ?", (alloc.key_id,)
            ).fetchone()
            if row is None:
                problems.append((f"allocations.{i}.key", f"unknown key '{alloc.key_id}'"))
        if len({a.key_id for a in rec.allocations}) != len(rec.allocations):
            problems.append(("allocations", "duplicate allocation for a key"))
        if problems:
            raise Invalid(problems)
        for cid in rec.connections:
            row = self._conn.execute(
                "SELECT pool_id FROM pool_connections WHERE connection_id = ? AND pool_id != ?",
                (cid, rec.id),
            ).fetchone()
            if row is not None:
                raise Conflict(f"connection '{cid}' already belongs to pool '{row[0]}'")
        # canonical allocation order (by key), as read back: equal records compare equal
        allocs = tuple(sorted(rec.allocations, key=lambda a: a.key_id))
        return replace(rec, provider=providers[rec.connections[0]], allocations=allocs)

    def _write_children(self, rec: PoolRecord) -> None:
        self._conn.executemany(
            "INSERT INTO pool_connections (pool_id, connection_id, position) VALUES (?, ?, ?)",
            [(rec.id, cid, i) for i, cid in enumerate(rec.connections)],
        )
        self._conn.executemany(
            "INSERT INTO allocations (pool_id, key_id, weight, cap_value, cap_unit, policy, "
            "model_caps) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    rec.id,
                    a.key_id,
                    a.weight,
                    a.cap_value,
                    None if a.cap_unit is None else a.cap_unit.value,
                    a.policy.value,
                    caps_to_json(a.model_caps),
                )
                for a in rec.allocations
            ],
        )

    def _touch(self, pool_id: str) -> None:
        self._conn.execute(
            "UPDATE pools SET updated_ms = ? WHERE id = ?", (self._clock.now_ms(), pool_id)
        )

    def _pool_rows(self, select: str, pool_id: str | None, order: str) -> list[Row]:
        """A child table's rows of one pool, or of every pool (``pool_id`` None), in ``order``."""
        if pool_id is None:
            return self._conn.execute(f"{select} ORDER BY {order}").fetchall()
        return self._conn.execute(
            f"{select} WHERE pool_id = ? ORDER BY {order}", (pool_id,)
        ).fetchall()

    def _members(self, pool_id: str | None = None) -> dict[str, list[str]]:
        rows = self._pool_rows(
            "SELECT pool_id, connection_id FROM pool_connections",
            pool_id,
            "pool_id, position, connection_id",
        )
        out: dict[str, list[str]] = {}
        for pid, cid in rows:
            out.setdefault(str(pid), []).append(str(cid))
        return out

    def _allocations(self, pool_id: str | None = None) -> dict[str, list[Allocation]]:
        out: dict[str, list[Allocation]] = {}
        for r in self._pool_rows("SELECT * FROM allocations", pool_id, "pool_id, key_id"):
            out.setdefault(str(r["pool_id"]), []).append(
                Allocation(
                    key_id=r["key_id"],
                    weight=float(r["weight"]),
                    cap_value=None if r["cap_value"] is None else float(r["cap_value"]),
                    cap_unit=None if r["cap_unit"] is None else Unit(r["cap_unit"]),
                    policy=Policy.parse(r["policy"]),
                    model_caps=caps_from_json(r["model_caps"]),
                )
            )
        return out

    @staticmethod
    def _record(
        row: Row,
        members: Mapping[str, list[str]],
        allocs: Mapping[str, list[Allocation]],
    ) -> PoolRecord:
        pid = str(row["id"])
        return PoolRecord(
            id=pid,
            name=row["name"],
            connections=tuple(members.get(pid, ())),
            dimensions=dims_from_json(row["dimensions"]),
            allocations=tuple(allocs.get(pid, ())),
            share_mode=ShareMode(row["share_mode"]),
            active_window_ms=int(row["active_window_ms"]),
            provider=row["provider"],
            hold=_hold_from_row(row),
        )


def _hold_from_row(row: Row) -> HoldSettings:
    """The pool's admission setting as stored (``{}`` before it existed: refuse)."""
    try:
        data = json.loads(row["admission"] or "{}")
    except (KeyError, IndexError, ValueError):
        return HoldSettings()
    return HoldSettings.from_json(data) if isinstance(data, dict) else HoldSettings()
