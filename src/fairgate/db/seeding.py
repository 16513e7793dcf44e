"""Seeding the metadata DB from the config file: the file's objects as domain objects, and the
start's one transaction that writes them.

Seeding rule: every object the config file names is upserted to what the file says, so editing
the file and restarting applies the edit; objects created through the admin API are left alone,
and so are the members and allocations the admin API added to a config pool (the file is merged
into the DB, not mirrored). Unchanged objects are not written: seeding twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.config import (
    AllocationConfig,
    Config,
    ConnectionConfig,
    DimensionConfig,
    KeyConfig,
    PoolConfig,
)
from fairgate.db.base import Database
from fairgate.db.combos import ComboRepo
from fairgate.db.common import transaction
from fairgate.db.connections import ConnectionRepo
from fairgate.db.keys import KeyRepo
from fairgate.db.plans import PlanRepo
from fairgate.db.pools import PoolRecord, PoolRepo
from fairgate.quota.model import Allocation, Dimension, ModelCap
from fairgate.registry import AuthType, ClientKey, Connection, hash_key, protocol_for
from fairgate.secretbox import SecretBox

__all__ = [
    "SeedReport",
    "allocation_from_config",
    "connection_from_config",
    "dimension_from_config",
    "key_from_config",
    "pool_record_from_config",
    "seed_from_config",
]


# -- config → domain --------------------------------------------------------------------------


def dimension_from_config(d: DimensionConfig) -> Dimension:
    return Dimension(d.unit, d.window, d.limit, d.window_anchor)


def connection_from_config(c: ConnectionConfig) -> Connection:
    return Connection(
        id=c.id,
        provider=c.provider,
        base_url=c.base_url,
        secret=c.secret,
        protocol=protocol_for(c.provider, c.protocol),
        auth_type=AuthType(c.auth_type),
        weight=c.weight,
        max_concurrent=c.max_concurrent,
        models=tuple(c.models or ()),
        enabled=c.enabled,
        forward_headers=tuple(c.forward_headers),
    )


def key_from_config(k: KeyConfig) -> ClientKey:
    """A key given by secret keeps only its hash (no character of the secret)."""
    digest = hash_key(k.secret) if k.secret is not None else k.key_hash or ""
    return ClientKey(
        id=k.id,
        name=k.name or k.id,
        key_hash=digest,
        enabled=k.enabled,
        allowed_models=tuple(k.allowed_models),
        allowed_connections=frozenset(k.allowed_connections),
        allowed_providers=frozenset(k.allowed_providers),
    )


def allocation_from_config(a: AllocationConfig) -> Allocation:
    return Allocation(
        key_id=a.key,
        weight=a.weight,
        cap_value=a.cap_value,
        cap_unit=a.cap_unit,
        policy=a.policy,
        model_caps=tuple(ModelCap(c.model, c.unit, c.limit) for c in a.model_caps),
    )


def pool_record_from_config(p: PoolConfig) -> PoolRecord:
    return PoolRecord(
        id=p.id,
        name=p.name or p.id,
        connections=tuple(p.connections),
        dimensions=tuple(dimension_from_config(d) for d in p.dimensions),
        allocations=tuple(allocation_from_config(a) for a in p.allocations),
        share_mode=p.share_mode,
        active_window_ms=round(p.active_window_s * 1000),
    )


# -- seeding ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SeedReport:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return self.created + self.updated

    def count(self, what: str, outcome: str) -> None:
        if outcome == "created":
            self.created += 1
        elif outcome == "updated":
            self.updated += 1
        else:
            self.unchanged += 1
            return
        self.changes.append(f"{outcome} {what}")


def seed_from_config(
    conn: Database, config: Config, clock: Clock = SYSTEM_CLOCK, *, box: SecretBox
) -> SeedReport:
    """Upsert the config file into the DB in one transaction (all or nothing)."""
    report = SeedReport()
    conns, keys = ConnectionRepo(conn, clock, box=box), KeyRepo(conn, clock)
    plans, pools = PlanRepo(conn, clock), PoolRepo(conn, clock)
    with transaction(conn):
        for c in config.connections:
            report.count(f"connection {c.id}", conns.upsert(connection_from_config(c)))
        for k in config.keys:
            report.count(f"key {k.id}", keys.upsert(key_from_config(k)))
        for cid, dims in config.plans.items():
            if dims:
                changed = plans.set(cid, [dimension_from_config(d) for d in dims])
                report.count(f"plan {cid}", "updated" if changed else "unchanged")
        for p in config.pools:
            rec = pool_record_from_config(p)
            old = pools.find_record(p.id)
            if old is not None:
                rec = _merged(rec, old)
            report.count(f"pool {p.id}", pools.upsert(rec))
        combos = ComboRepo(conn, clock)
        for spec in config.combos:
            report.count(f"combo {spec.name}", combos.upsert(spec))
    return report


def _merged(rec: PoolRecord, old: PoolRecord) -> PoolRecord:
    """The config's pool plus the members and allocations the DB has beyond it."""
    members = rec.connections + tuple(c for c in old.connections if c not in rec.connections)
    named = {a.key_id for a in rec.allocations}
    allocs = rec.allocations + tuple(a for a in old.allocations if a.key_id not in named)
    return PoolRecord(
        id=rec.id,
        name=rec.name,
        connections=members,
        dimensions=rec.dimensions,
        allocations=allocs,
        share_mode=rec.share_mode,
        active_window_ms=rec.active_window_ms,
    )
