"""The repository contract, on a real SQLite file and a real PostgreSQL schema: CRUD, hashing,
seeding idempotency, the registry build."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from db_support import BOX, assert_not_found, connection, dump

from fairgate.config import Config, parse_config
from fairgate.db.base import Database
from fairgate.db.repos import (
    Conflict,
    ConnectionRepo,
    Invalid,
    KeyRepo,
    NotFound,
    PlanRepo,
    PoolRecord,
    PoolRepo,
    load_registry,
    seed_from_config,
    transaction,
)
from fairgate.domain.connections import Connection, Protocol
from fairgate.domain.keys import ClientKey, hash_key
from fairgate.domain.units import Unit, Window
from fairgate.quota.catalog import CATALOG
from fairgate.quota.model import Allocation, Dimension, ModelCap, Policy, ShareMode

REQ_H = Dimension(Unit.REQUESTS, Window.HOURLY, 100)
TOK_D = Dimension(Unit.TOKENS, Window.DAILY, 1_000_000)


def conn_(cid: str, provider: str = "mock", **kw: Any) -> Connection:
    return Connection(id=cid, provider=provider, base_url="http://up/v1", secret="up-" + cid, **kw)


def key_(kid: str) -> ClientKey:
    return ClientKey(id=kid, name=kid.title(), key_hash=hash_key("fg-" + kid))


@pytest.fixture
def populated(db: Database) -> Database:
    conns = ConnectionRepo(db, box=BOX)
    for c in (conn_("m1"), conn_("m2"), conn_("m3"), conn_("k1", "kimi"), conn_("o1", "openai")):
        conns.create(c)
    for k in ("alice", "bob", "carol"):
        KeyRepo(db).insert(key_(k))
    return db


# -- connections ------------------------------------------------------------------------------


def test_connection_crud(db: Database) -> None:
    repo = ConnectionRepo(db, box=BOX)
    c = conn_("m1", models=("gpt-x",), max_concurrent=4, weight=2.5)
    repo.create(c)
    got = repo.get("m1")
    assert got == c
    assert got.secret == "up-m1"
    assert got.protocol is Protocol.OPENAI
    assert "up-m1" not in repr(got)
    with pytest.raises(Conflict):
        repo.create(c)
    repo.update(replace(c, secret="new", enabled=False))
    assert repo.get("m1").secret == "new"
    assert repo.upsert(repo.get("m1")) == "unchanged"
    assert repo.upsert(conn_("m1")) == "updated"
    assert repo.upsert(conn_("m9")) == "created"
    assert [x.id for x in repo.all()] == ["m1", "m9"]
    repo.delete("m9")
    assert_not_found(
        lambda: repo.get("m9"),
        lambda: repo.delete("m9"),
        lambda: repo.update(conn_("nope")),
    )


def test_anthropic_protocol_by_provider(db: Database) -> None:
    repo = ConnectionRepo(db, box=BOX)
    repo.create(conn_("a1", "anthropic", protocol=Protocol.ANTHROPIC))
    assert repo.get("a1").protocol is Protocol.ANTHROPIC


def test_connection_in_pool_cannot_be_deleted_or_change_provider(
    populated: Database,
) -> None:
    PoolRepo(populated).create(PoolRecord("p", "P", ("m1",)))
    repo = ConnectionRepo(populated, box=BOX)
    before = dump(populated)
    with pytest.raises(Conflict, match="belongs to pool 'p'"):
        repo.delete("m1")
    with pytest.raises(Conflict):
        repo.update(replace(repo.get("m1"), provider="kimi"))
    assert dump(populated) == before
    repo.update(replace(repo.get("m1"), base_url="http://other/v1"))  # other fields are fine


def test_deleting_a_connection_drops_its_plan(populated: Database) -> None:
    PlanRepo(populated).set("m2", [REQ_H])
    ConnectionRepo(populated, box=BOX).delete("m2")
    assert PlanRepo(populated).get("m2") is None


# -- keys -------------------------------------------------------------------------------------


def test_key_create_stores_only_the_hash(db: Database, tmp_path: Path) -> None:
    repo = KeyRepo(db)
    key, secret = repo.create("Alice", ["gpt-x"], key_id="alice")
    assert secret.startswith("fg-")
    assert len(secret) > 40
    assert key.key_hash == hash_key(secret)
    assert key.allowed_models == ("gpt-x",)
    assert repo.get("alice") == key
    assert secret not in "\n".join(dump(db))
    if isinstance(db, sqlite3.Connection):  # and not in the file's bytes either
        db.execute("PRAGMA wal_checkpoint(FULL)")
        raw = (tmp_path / "fairgate.sqlite").read_bytes()
        # not the secret, and no run of its characters either (the old 7-character display prefix)
        assert not any(secret[i : i + 8].encode() in raw for i in range(len(secret) - 7))


def test_key_generated_id_and_name(db: Database) -> None:
    key, _ = KeyRepo(db).create("")
    assert key.id.startswith("key-")
    assert key.name == key.id


def test_key_conflicts_and_not_found(db: Database) -> None:
    repo = KeyRepo(db)
    repo.create("A", key_id="alice")
    with pytest.raises(Conflict):
        repo.create("A again", key_id="alice")
    repo.insert(key_("bob"))
    with pytest.raises(Conflict, match="already used"):
        repo.insert(replace(key_("bob"), id="bob2"))
    assert_not_found(
        lambda: repo.get("zed"),
        lambda: repo.delete("zed"),
    )
    repo.update(replace(repo.get("bob"), enabled=False, name="Robert"))
    assert repo.get("bob").name == "Robert"
    assert repo.by_hash(hash_key("fg-bob")) == repo.get("bob")
    assert repo.retired_hashes() == frozenset()  # no secret changed: nothing retired


def test_a_rotated_or_revoked_secret_is_never_a_keys_again(db: Database) -> None:
    """Rotation and revocation retire the old hash for good: no write may bring it back, to
    the same key or another (issue 49: a restart gave a rotated key its leaked secret back)."""
    repo = KeyRepo(db)
    repo.insert(key_("alice"))
    repo.insert(key_("bob"))
    old = repo.get("alice").key_hash
    rotated, secret = repo.rotate("alice")
    assert rotated.key_hash == hash_key(secret) != old
    repo.delete("bob")
    assert repo.retired_hashes() == {old, hash_key("fg-bob")}
    before = dump(db)
    with pytest.raises(Conflict, match="rotated away or revoked"):
        repo.update(replace(rotated, key_hash=old))
    with pytest.raises(Conflict, match="rotated away or revoked"):
        repo.insert(key_("bob"))
    with pytest.raises(Conflict, match="rotated away or revoked"):
        repo.insert(replace(key_("carol"), key_hash=old))
    assert dump(db) == before
    assert "fg-bob" not in "\n".join(before)  # hashes only, never a secret
    repo.update(replace(rotated, name="Alice B."))  # same secret: still fine


# -- plans ------------------------------------------------------------------------------------


def test_plan_override_crud(populated: Database) -> None:
    plans = PlanRepo(populated)
    assert plans.get("m1") is None
    assert plans.set("m1", [REQ_H, TOK_D]) is True
    assert plans.set("m1", [REQ_H, TOK_D]) is False  # unchanged: nothing written
    assert plans.get("m1") == (REQ_H, TOK_D)
    assert plans.all() == {"m1": (REQ_H, TOK_D)}
    with pytest.raises(Invalid):
        plans.set("m1", [])
    assert plans.delete("m1") is True
    assert plans.delete("m1") is False
    assert plans.get("m1") is None


# -- pools ------------------------------------------------------------------------------------


def test_pool_crud_and_resolution(populated: Database) -> None:
    repo = PoolRepo(populated)
    alloc = Allocation(
        "alice",
        50,
        cap_value=10,
        cap_unit=Unit.REQUESTS,
        policy=Policy.SOFT,
        model_caps=(ModelCap("gpt-x", Unit.REQUESTS, 5),),
    )
    rec = PoolRecord("p", "Pool", ("m1", "m2"), allocations=(alloc,), share_mode=ShareMode.ACTIVE)
    created = repo.create(rec)
    assert created.provider == "mock"
    got = repo.record("p")
    assert got == created
    pool = repo.get("p")
    assert pool.dimensions == ()  # mock has no catalog plan and no override: empty
    assert pool.allocation("alice") == alloc
    assert pool.share_mode is ShareMode.ACTIVE
    PlanRepo(populated).set("m1", [REQ_H])
    # first member's override: one account's plan, enforced once per member (issue 48)
    two = (replace(REQ_H, limit=2 * REQ_H.limit),)
    assert repo.get("p").dimensions == two
    PlanRepo(populated).set("m2", [TOK_D])
    assert repo.get("p").dimensions == two  # only the first member counts
    repo.update(replace(rec, dimensions=(TOK_D,)))
    assert repo.get("p").dimensions == (TOK_D,)  # explicit wins, and is the pool's as written
    with pytest.raises(Conflict):
        repo.create(rec)
    repo.delete("p")
    with pytest.raises(NotFound):
        repo.get("p")
    assert populated.execute("SELECT COUNT(*) FROM allocations").fetchone()[0] == 0
    assert populated.execute("SELECT COUNT(*) FROM pool_connections").fetchone()[0] == 0


def test_pool_of_catalog_provider(populated: Database) -> None:
    PoolRepo(populated).create(PoolRecord("kp", "K", ("k1",)))
    assert PoolRepo(populated).get("kp").dimensions == CATALOG["kimi"]


def test_pool_member_order_is_kept(populated: Database) -> None:
    PoolRepo(populated).create(PoolRecord("p", "P", ("m3", "m1", "m2")))
    assert PoolRepo(populated).record("p").connections == ("m3", "m1", "m2")


def test_pool_validation_names_fields_and_writes_nothing(populated: Database) -> None:
    repo = PoolRepo(populated)
    before = dump(populated)
    bad = PoolRecord(
        "p",
        "P",
        ("m1", "nope"),
        allocations=(Allocation("alice"), Allocation("zed")),
    )
    with pytest.raises(Invalid) as info:
        repo.create(bad)
    fields = dict(info.value.problems)
    assert "connections.1" in fields
    assert "allocations.1.key" in fields
    with pytest.raises(Invalid) as info:
        repo.create(PoolRecord("p", "P", ("m1", "k1")))
    assert "connections" in dict(info.value.problems)
    assert dump(populated) == before


def test_a_connection_belongs_to_one_pool(populated: Database) -> None:
    repo = PoolRepo(populated)
    repo.create(PoolRecord("p1", "P1", ("m1",)))
    before = dump(populated)
    with pytest.raises(Conflict, match="already belongs to pool 'p1'"):
        repo.create(PoolRecord("p2", "P2", ("m2", "m1")))
    assert dump(populated) == before


def test_model_caps(populated: Database) -> None:
    repo = PoolRepo(populated)
    repo.create(PoolRecord("p", "P", ("m1",), allocations=(Allocation("alice", 10),)))
    caps = [ModelCap("gpt-x", Unit.TOKENS, 1000)]
    alloc = repo.set_model_caps("p", "alice", caps)
    assert alloc.model_caps == tuple(caps)
    assert repo.get("p").allocation("alice") == alloc
    assert_not_found(
        lambda: repo.set_model_caps("p", "bob", caps),
        lambda: repo.set_model_caps("zz", "alice", caps),
    )


def test_deleting_a_key_drops_its_allocations(populated: Database) -> None:
    repo = PoolRepo(populated)
    repo.create(
        PoolRecord("p", "P", ("m1",), allocations=(Allocation("alice", 10), Allocation("bob")))
    )
    KeyRepo(populated).delete("alice")
    assert [a.key_id for a in repo.get("p").allocations] == ["bob"]


def test_upsert_many_is_idempotent_and_can_move_members(populated: Database) -> None:
    repo = PoolRepo(populated)
    recs = [
        PoolRecord("a", "A", ("m1",), allocations=(Allocation("bob", 1), Allocation("alice", 2))),
        PoolRecord("b", "B", ("m2",)),
    ]
    assert repo.upsert_many(recs) == ["created", "created"]
    before = dump(populated)
    assert repo.upsert_many(recs) == ["unchanged", "unchanged"]
    assert dump(populated) == before
    moved = [replace(recs[0], connections=("m2",)), replace(recs[1], connections=("m1",))]
    assert repo.upsert_many(moved) == ["updated", "updated"]
    assert repo.record("a").connections == ("m2",)
    with pytest.raises(Invalid) as info:
        repo.upsert_many([replace(moved[1], name="B2"), PoolRecord("c", "C", ("zz",))])
    assert "1.connections.0" in dict(info.value.problems)
    assert repo.record("b").name == "B"  # all or nothing


def test_transaction_rolls_back_nested_work(populated: Database) -> None:
    before = dump(populated)

    def work() -> None:
        with transaction(populated):
            ConnectionRepo(populated, box=BOX).create(conn_("x1"))
            with transaction(populated):
                KeyRepo(populated).insert(key_("dave"))
            raise RuntimeError

    with pytest.raises(RuntimeError):
        work()
    assert dump(populated) == before


# -- seeding ----------------------------------------------------------------------------------

SEED = {
    "server": {"default_provider": "mock"},
    "connections": [
        connection("m1", "mock", "http://up/v1", secret="up-secret"),
        connection("m2", "mock", "http://up/v1"),
        connection("k1", "kimi", "http://kimi/v1"),
        {
            "id": "a1",
            "provider": "anthropic",
            "base_url": "http://anth/v1",
            "enabled": False,
            "models": ["*"],
        },
    ],
    "keys": [
        {"id": "alice", "name": "Alice", "secret": "fg-alice-secret-value"},
        {"id": "bob", "key_hash": hash_key("fg-bob-secret-value")},
    ],
    "plans": {"m1": [{"unit": "requests", "window": "hourly", "limit": 100}]},
    "pools": [
        {
            "id": "demo",
            "name": "Demo",
            "connections": ["m1", "m2"],
            "allocations": [
                {"key": "bob", "weight": 30, "policy": "soft"},
                {"key": "alice", "weight": 50},
            ],
        },
        {
            "id": "kp",
            "connections": ["k1"],
            "dimensions": [{"unit": "tokens", "window": "daily", "limit": 5}],
        },
    ],
}


def _config() -> Config:
    return parse_config(SEED, {})


def test_seed_is_idempotent(db: Database) -> None:
    first = seed_from_config(db, _config(), box=BOX)
    assert sorted(first.changes) == sorted(
        [
            *(f"created connection {c}" for c in ("m1", "m2", "k1", "a1")),
            "created key alice",
            "created key bob",
            "created plan of connection m1",
            *(
                f"created {what}"
                for p in ("demo", "kp")
                for what in (f"pool {p}", f"allocations of pool {p}")
            ),
        ]
    )
    assert (first.created, first.updated) == (11, 0)
    snapshot = dump(db)
    second = seed_from_config(db, _config(), box=BOX)
    assert second.changed == 0
    assert second.differences == ()
    assert dump(db) == snapshot


def test_seed_stores_only_the_key_hash(db: Database) -> None:
    seed_from_config(db, _config(), box=BOX)
    text = "\n".join(dump(db))
    assert "fg-alice-secret-value" not in text
    alice = KeyRepo(db).get("alice")
    assert alice.key_hash == hash_key("fg-alice-secret-value")
    assert "fg-alic" not in text
    assert "up-secret" not in text  # the connection's secret, recorded sealed as the file wrote it


def _edited(**pool: Any) -> Config:
    demo = {**SEED["pools"][0], **pool}  # type: ignore[dict-item]
    return parse_config({**SEED, "pools": [demo, SEED["pools"][1]]}, {})  # type: ignore[dict-item]


def test_seed_applies_the_files_edits_to_what_nobody_else_changed(db: Database) -> None:
    seed_from_config(db, _config(), box=BOX)
    edited = _edited(
        name="Renamed", allocations=[{"key": "alice", "weight": 70}, {"key": "bob", "weight": 30}]
    )
    report = seed_from_config(db, edited, box=BOX)
    assert report.changes == ["updated pool demo", "updated allocations of pool demo"]
    rec = PoolRepo(db).record("demo")
    assert rec.name == "Renamed"
    assert {a.key_id: a.weight for a in rec.allocations} == {"alice": 70, "bob": 30}
    assert seed_from_config(db, edited, box=BOX).changed == 0


def test_seed_keeps_what_the_admin_api_changed_and_says_what_differs(db: Database) -> None:
    """Seed mode: the API's members and allocations stay, and so does the rest of the pool
    (one object); the file's edit of it is reported, not applied. The allocations and the
    keys the API did not touch still follow the file."""
    seed_from_config(db, _config(), box=BOX)
    KeyRepo(db).insert(key_("carol"))
    ConnectionRepo(db, box=BOX).create(conn_("m3"))
    repo = PoolRepo(db)
    rec = repo.record("demo")
    repo.update(
        replace(
            rec,
            connections=(*rec.connections, "m3"),
            allocations=(*rec.allocations, Allocation("carol", 5)),
        )
    )
    before = dump(db)
    report = seed_from_config(db, _edited(name="Renamed"), box=BOX)
    assert report.changes == []
    assert dump(db) == before
    by_label = {d.label: d for d in report.differences}
    assert set(by_label) == {"pool demo", "allocations of pool demo"}
    pool, allocations = by_label["pool demo"], by_label["allocations of pool demo"]
    assert (pool.action, pool.fields, pool.file_changed) == ("kept", ("connections", "name"), True)
    assert (allocations.action, allocations.fields) == ("kept", ("carol",))
    assert not allocations.file_changed  # the file did not change the allocations
    rec = repo.record("demo")
    assert (rec.name, rec.connections) == ("Demo", ("m1", "m2", "m3"))
    assert [a.key_id for a in rec.allocations] == ["alice", "bob", "carol"]


def test_seed_conflict_leaves_db_unchanged(db: Database) -> None:
    seed_from_config(db, _config(), box=BOX)
    repo = PoolRepo(db)
    rec = repo.record("demo")
    repo.update(replace(rec, connections=("m1",)))
    repo.create(PoolRecord("other", "O", ("m2",)))
    before = dump(db)
    # seed mode: the API moved m2 out of demo, so demo keeps the API's members; no conflict
    assert seed_from_config(db, _config(), box=BOX).changes == []
    with pytest.raises(Conflict):
        # authoritative: the file wants m2 back in demo; the DB has it in another pool
        seed_from_config(db, _config(), box=BOX, mode="authoritative")
    assert dump(db) == before


# -- registry ---------------------------------------------------------------------------------


def test_load_registry(db: Database) -> None:
    seed_from_config(db, _config(), box=BOX)
    reg = load_registry(db, "mock", version=7, box=BOX)
    assert reg.version == 7
    assert reg.default_provider == "mock"
    assert set(reg.connections) == {"m1", "m2", "k1", "a1"}
    assert reg.connections["a1"].protocol is Protocol.ANTHROPIC
    assert "anthropic" not in reg.by_provider  # disabled connections are not routable
    assert [c.id for c in reg.by_provider["mock"]] == ["m1", "m2"]
    demo = reg.pools["demo"]
    # the override of its first member: one account's plan, so the pool of two enforces it twice
    assert demo.dimensions == (Dimension(Unit.REQUESTS, Window.HOURLY, 200),)
    assert demo.written_limit(demo.dimensions[0]) == REQ_H.limit
    assert demo.weight_of("alice") == 50
    assert demo.allocation("bob") is not None
    assert reg.pools["kp"].dimensions == (Dimension(Unit.TOKENS, Window.DAILY, 5),)
    assert reg.pool_by_connection["m2"] is demo
    assert reg.pool_by_connection["k1"].id == "kp"
    assert "a1" not in reg.pool_by_connection
    alice = reg.authenticate("fg-alice-secret-value")
    assert alice is not None
    assert alice.id == "alice"
    assert reg.authenticate("fg-bob-secret-value") is not None
    assert reg.authenticate("fg-wrong") is None
