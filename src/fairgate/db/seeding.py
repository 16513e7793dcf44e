"""Seeding the metadata DB from the config file: the file's objects as domain objects, the
start's one transaction that applies the file, and the same comparison without writing.

The rule (what the file creates, updates, keeps or overwrites; seed and authoritative modes) and
the comparison are pure, in ``fairgate.db.reconcile``; this module reads the DB and writes the
outcome. An unchanged file writes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.config import (
    AllocationConfig,
    Config,
    ConnectionFields,
    DimensionConfig,
    KeyConfig,
    PoolConfig,
)
from fairgate.db.applied import AppliedRepo, has_provenance
from fairgate.db.base import Database
from fairgate.db.combos import ComboRepo
from fairgate.db.common import transaction
from fairgate.db.connections import ConnectionRepo
from fairgate.db.keys import KeyRepo
from fairgate.db.plans import PlanRepo
from fairgate.db.pools import PoolRecord, PoolRepo, resolve_pool
from fairgate.db.reconcile import Mode, Objects, Reconciliation, Stored, reconcile
from fairgate.domain.connections import AuthType, Connection, protocol_for
from fairgate.domain.keys import ClientKey, hash_key
from fairgate.quota.hold import HoldSettings
from fairgate.quota.model import Allocation, Dimension, ModelCap, Pool
from fairgate.secretbox import SecretBox

__all__ = [
    "allocation_from_config",
    "compare_with_config",
    "connection_from_config",
    "declared_objects",
    "dimension_from_config",
    "key_from_config",
    "pool_record_from_config",
    "pools_of",
    "read_stored",
    "seed_from_config",
]


# -- config → domain --------------------------------------------------------------------------


def dimension_from_config(d: DimensionConfig) -> Dimension:
    return Dimension(d.unit, d.window, d.limit, d.window_anchor)


def connection_from_config(c: ConnectionFields) -> Connection:
    """The domain connection of a declared one: the file's or the admin API's (both declare
    the same fields, so they become a connection in this one place)."""
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
        billing_fields=tuple(c.billing_fields),
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
        hold=HoldSettings(p.admission, p.max_wait_ms, p.queue_per_key, p.queue_per_pool),
    )


# -- seeding ----------------------------------------------------------------------------------


def declared_objects(config: Config) -> Objects:
    """The objects the file declares, as domain objects (an empty plan declares nothing)."""
    return Objects(
        connections={c.id: connection_from_config(c) for c in config.connections},
        keys={k.id: key_from_config(k) for k in config.keys},
        plans={
            cid: tuple(dimension_from_config(d) for d in dims)
            for cid, dims in config.plans.items()
            if dims
        },
        pools={p.id: pool_record_from_config(p) for p in config.pools},
        combos={spec.name: spec for spec in config.combos},
    )


def pools_of(objects: Objects) -> list[Pool]:
    """The engine's view of ``objects``' pools (dimensions resolved as the registry resolves
    them; a record not written yet takes its provider from its first connection)."""
    out: list[Pool] = []
    for rec in objects.pools.values():
        first = objects.connections.get(rec.connections[0]) if rec.connections else None
        provider = first.provider if first is not None else rec.provider
        out.append(resolve_pool(replace(rec, provider=provider), objects.plans))
    return out


def read_stored(conn: Database, declared: Objects, *, box: SecretBox) -> Stored:
    """What the DB holds of the kinds the file seeds, with the records of what the file wrote
    and the retired key hashes (none in a DB of an earlier version not migrated yet). Of the
    keys, only those the file declares are read: the DB may hold very many more."""
    repo = KeyRepo(conn)
    provenance = has_provenance(conn)
    keys = {i: k for i in declared.keys if (k := repo.find(i)) is not None}
    retired = (
        frozenset(k.key_hash for k in declared.keys.values() if repo.is_retired(k.key_hash))
        if provenance
        else frozenset()
    )
    return Stored(
        Objects(
            connections={c.id: c for c in ConnectionRepo(conn, box=box).all()},
            keys=keys,
            plans=PlanRepo(conn).all(),
            pools={r.id: r for r in PoolRepo(conn).records()},
            combos={r.name: r.spec for r in ComboRepo(conn).all()},
        ),
        applied=AppliedRepo(conn, box=box).all() if provenance else {},
        retired=retired,
    )


def compare_with_config(
    conn: Database, config: Config, *, box: SecretBox, mode: Mode | None = None
) -> Reconciliation:
    """What a start with ``config`` would do, and what differs, without writing anything
    (``fairgate config check``, ``/health``). ``mode``: the file's ``server.config_mode``."""
    mode = mode or config.server.config_mode
    declared = declared_objects(config)
    return reconcile(declared, read_stored(conn, declared, box=box), mode)


def seed_from_config(
    conn: Database,
    config: Config,
    clock: Clock = SYSTEM_CLOCK,
    *,
    box: SecretBox,
    mode: Mode | None = None,
) -> Reconciliation:
    """Compare the file with the DB and apply the result, in one transaction (all or nothing;
    the write lock is taken before reading, so replicas starting together apply it once).
    Nothing is written when the file holds nothing new."""
    with transaction(conn):
        result = compare_with_config(conn, config, box=box, mode=mode)
        _apply(conn, result, clock, box)
    return result


def _apply(conn: Database, result: Reconciliation, clock: Clock, box: SecretBox) -> None:
    """Write what :func:`fairgate.db.reconcile.reconcile` decided, in dependency order
    (connections and keys before the pools naming them), then its records."""
    writes = result.writes
    conns = ConnectionRepo(conn, clock, box=box)
    for c in writes.connections.values():
        (conns.create if result.creates("connection", c.id) else conns.update)(c)
    keys = KeyRepo(conn, clock)
    for k in writes.keys.values():
        (keys.insert if result.creates("key", k.id) else keys.update)(k)
    plans = PlanRepo(conn, clock)
    for cid, dims in writes.plans.items():
        plans.set(cid, dims)
    if writes.pools:
        # all at once: a member the file moves between two of its pools is released first
        PoolRepo(conn, clock).upsert_many(list(writes.pools.values()))
    combos = ComboRepo(conn, clock)
    for spec in writes.combos.values():
        (combos.create if result.creates("combo", spec.name) else combos.replace)(spec)
    applied = AppliedRepo(conn, clock, box=box)
    for ref, form in result.record.items():
        applied.set(ref, form)
    for ref in result.forget:
        applied.forget(ref)
