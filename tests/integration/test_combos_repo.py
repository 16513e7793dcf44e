"""Combos on a real SQLite file: CRUD, refused writes that change nothing, idempotent seeding,
and the registry's user combos plus the qtSd/ combos it mints from the pools."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from db_support import BOX, assert_not_found, dump

from fairgate.clock import ManualClock
from fairgate.config import ComboSpec, parse_config
from fairgate.db.base import Database
from fairgate.db.repos import (
    ComboRepo,
    Conflict,
    ConnectionRepo,
    Invalid,
    PoolRecord,
    PoolRepo,
    load_registry,
    seed_from_config,
)
from fairgate.domain.connections import Connection
from fairgate.snapshot import Registry


def conn_(cid: str, provider: str = "mock", **kw: Any) -> Connection:
    return Connection(id=cid, provider=provider, base_url="http://up/v1", secret="s-" + cid, **kw)


def spec(name: str = "fast", **kw: Any) -> ComboSpec:
    data: dict[str, Any] = {
        "name": name,
        "strategy": "priority",
        "targets": [
            {"provider": "mock", "model": "a", "connection": "m1"},
            {"provider": "kimi", "model": "k2"},
        ],
    }
    data.update(kw)
    return ComboSpec.model_validate(data)


@pytest.fixture
def populated(db: Database) -> Database:
    conns = ConnectionRepo(db, box=BOX)
    conns.create(conn_("m1", models=("a", "b"), weight=2))
    conns.create(conn_("m2", models=("b", "c")))
    conns.create(conn_("m3", models=("*",)))  # serves any model
    conns.create(conn_("k1", "kimi", models=("k2",)))
    return db


# -- CRUD ---------------------------------------------------------------------------------------


def test_crud(populated: Database, clock: ManualClock) -> None:
    repo = ComboRepo(populated, clock)
    assert repo.all() == []
    created = repo.create(spec(config={"maxRetries": 2}))
    assert created.name == "fast"
    assert created.created_ms == created.updated_ms == clock.now_ms()
    got = repo.get("fast")
    assert got == created
    assert got.spec.config.max_retries == 2
    assert got.spec.config.timeout_ms is None  # not set: inherits
    combo = got.combo()
    assert [t.key for t in combo.targets] == ["mock/a@m1", "kimi/k2"]
    assert combo.config.max_retries == 2

    clock.advance(1_000)
    replaced = repo.replace(
        spec(strategy="round_robin", targets=[{"provider": "mock", "model": "b"}])
    )
    assert replaced.created_ms == created.created_ms
    assert replaced.updated_ms == created.updated_ms + 1_000
    again = repo.get("fast")
    assert again == replaced
    assert again.spec.strategy == "round-robin"
    assert again.spec.config.max_retries is None  # PUT replaces the whole combo
    assert [r.name for r in repo.all()] == ["fast"]

    repo.create(spec("alpha"))
    assert [r.name for r in repo.all()] == ["alpha", "fast"]  # by name
    repo.delete("fast")
    assert repo.find("fast") is None
    assert_not_found(
        lambda: repo.get("fast"),
        lambda: repo.delete("fast"),
        lambda: repo.replace(spec("fast")),
    )


def test_storage_keeps_only_what_the_combo_sets(populated: Database) -> None:
    ComboRepo(populated).create(spec(config={"timeoutMs": 5_000, "options": {"sticky": True}}))
    row = populated.execute("SELECT strategy, targets, config FROM combos").fetchone()
    assert row["strategy"] == "priority"
    assert orjson.loads(row["config"]) == {"timeoutMs": 5_000, "options": {"sticky": True}}
    targets = orjson.loads(row["targets"])
    assert targets[0] == {
        "provider": "mock",
        "model": "a",
        "connection": "m1",
        "weight": 1.0,
        "tier": 0,
        "tags": [],
    }


def test_refused_writes_change_nothing(populated: Database) -> None:
    repo = ComboRepo(populated)
    repo.create(spec())
    before = dump(populated)
    with pytest.raises(Conflict):
        repo.create(spec())
    bad_provider = spec(
        "other",
        targets=[
            {"provider": "openai", "model": "gpt"},
            {"provider": "mock", "model": "a", "connection": "nope"},
            {"provider": "mock", "model": "a", "connection": "k1"},
        ],
    )
    with pytest.raises(Invalid) as info:
        repo.create(bad_provider)
    assert [f for f, _ in info.value.problems] == [
        "targets.0.provider",
        "targets.1.connection",
        "targets.2.connection",
    ]
    assert "no connection of provider 'openai'" in str(info.value)
    with pytest.raises(Invalid) as info:
        repo.replace(spec(targets=[{"provider": "openai", "model": "gpt"}]))
    assert info.value.problems[0][0] == "targets.0.provider"
    routing = spec(
        "chain",
        strategy="pipeline",
        targets=[{"provider": "mock", "model": "a"}],
        config={"options": {"stepPrompts": ["x", "y"]}},
    )
    with pytest.raises(Invalid) as info:
        repo.create(routing)
    assert info.value.problems[0][0] == "config.options"
    assert dump(populated) == before


def test_wildcards_need_only_the_provider(populated: Database) -> None:
    rec = ComboRepo(populated).create(
        spec(
            targets=[
                {"provider": "mock", "model": "*"},
                {"provider": "kimi", "model": "k2", "connection": "*"},
            ]
        )
    )
    assert [t.key for t in rec.combo().targets] == ["mock/*", "kimi/k2@*"]


def test_an_unreadable_row_is_skipped_not_fatal(populated: Database) -> None:
    repo = ComboRepo(populated)
    repo.create(spec())
    populated.execute(
        "INSERT INTO combos (name, strategy, targets, config) VALUES ('old', 'gone', '[]', '{}')"
    )
    assert [r.name for r in repo.all()] == ["fast"]
    assert repo.find("old") is None
    assert set(load_registry(populated, box=BOX).combos) == {"fast"}
    with pytest.raises(Conflict):
        repo.create(spec("old"))
    repo.delete("old")  # still removable


# -- seeding ------------------------------------------------------------------------------------

CONFIG: dict[str, Any] = {
    "connections": [
        {"id": "m1", "provider": "mock", "base_url": "http://x/v1", "models": ["a"]},
        {"id": "k1", "provider": "kimi", "base_url": "http://x/v1", "models": ["*"]},
    ],
    "combos": [
        {
            "name": "fast",
            "strategy": "weighted",
            "targets": [{"provider": "mock", "model": "a"}, {"provider": "kimi", "model": "k2"}],
            "config": {"maxRetries": 0},
        },
        {
            "name": "cheap",
            "strategy": "cost-optimized",
            "targets": [{"provider": "kimi", "model": "*"}],
        },
    ],
}


def test_seed_is_idempotent_and_leaves_admin_combos_alone(db: Database, clock: ManualClock) -> None:
    cfg = parse_config(CONFIG, {})
    first = seed_from_config(db, cfg, clock, box=BOX)
    assert {"created combo fast", "created combo cheap"} <= set(first.changes)
    before = dump(db)
    second = seed_from_config(db, cfg, clock, box=BOX)
    assert second.changed == 0
    assert dump(db) == before

    ComboRepo(db, clock).create(spec("mine", targets=[{"provider": "kimi", "model": "k2"}]))
    edited = parse_config(
        {**CONFIG, "combos": [{**CONFIG["combos"][0], "strategy": "p2c"}, CONFIG["combos"][1]]}, {}
    )
    third = seed_from_config(db, edited, clock, box=BOX)
    assert third.changes == ["updated combo fast"]
    repo = ComboRepo(db)
    assert repo.get("fast").spec.strategy == "p2c"
    assert {r.name for r in repo.all()} == {"fast", "cheap", "mine"}
    reg = load_registry(db, box=BOX)
    assert set(reg.combos) == {"fast", "cheap", "mine"}
    assert reg.combos["fast"].config.max_retries == 0


# -- the registry -------------------------------------------------------------------------------


def test_registry_has_user_and_minted_combos(populated: Database) -> None:
    ComboRepo(populated).create(spec())
    PoolRepo(populated).create(PoolRecord(id="pm", name="Mock", connections=("m1", "m2", "m3")))
    reg = load_registry(populated, box=BOX)
    assert set(reg.combos) == {"fast"}
    fast = reg.combo("fast")
    assert fast is not None
    assert not fast.internal
    # one per model listed by a member: a, b (m1), c (m2); m3 serves any ("*")
    assert sorted(reg.internal_combos) == ["qtSd/pm/a", "qtSd/pm/b", "qtSd/pm/c"]
    b = reg.combo("qtSd/pm/b")
    assert b is not None
    assert b.internal
    assert b.strategy == "quota-share"
    assert [(t.connection_id, t.model, t.weight) for t in b.targets] == [
        ("m1", "b", 2.0),
        ("m2", "b", 1.0),
        ("m3", "b", 1.0),
    ]
    a = reg.internal_combos["qtSd/pm/a"]
    assert [t.connection_id for t in a.targets] == ["m1", "m3"]  # m2 does not serve a
    assert reg.combo("qtSd/pm/zzz") is None
    assert reg.combo("nope") is None


def test_minted_combos_follow_the_pools(populated: Database) -> None:
    pools, conns = PoolRepo(populated), ConnectionRepo(populated, box=BOX)
    pools.create(PoolRecord(id="pm", name="Mock", connections=("m1",)))
    reg = load_registry(populated, box=BOX)
    assert sorted(reg.internal_combos) == ["qtSd/pm/a", "qtSd/pm/b"]
    assert [t.connection_id for t in reg.internal_combos["qtSd/pm/b"].targets] == ["m1"]

    pools.update(PoolRecord(id="pm", name="Mock", connections=("m1", "m2")))
    reg = load_registry(populated, box=BOX)
    assert sorted(reg.internal_combos) == ["qtSd/pm/a", "qtSd/pm/b", "qtSd/pm/c"]
    assert [t.connection_id for t in reg.internal_combos["qtSd/pm/b"].targets] == ["m1", "m2"]

    pools.update(PoolRecord(id="pm", name="Mock", connections=("m2",)))
    reg = load_registry(populated, box=BOX)
    assert sorted(reg.internal_combos) == ["qtSd/pm/b", "qtSd/pm/c"]

    conns.update(replace(conns.get("m2"), models=("c", "d"), weight=5))
    reg = load_registry(populated, box=BOX)
    assert sorted(reg.internal_combos) == ["qtSd/pm/c", "qtSd/pm/d"]
    assert reg.internal_combos["qtSd/pm/d"].targets[0].weight == 5

    conns.update(replace(conns.get("m2"), enabled=False))  # a disabled member takes no traffic
    assert load_registry(populated, box=BOX).internal_combos == {}

    conns.update(replace(conns.get("m2"), enabled=True))
    pools.create(PoolRecord(id="pk", name="Kimi", connections=("k1",)))
    reg = load_registry(populated, box=BOX)
    assert sorted(reg.internal_combos) == ["qtSd/pk/k2", "qtSd/pm/c", "qtSd/pm/d"]
    pools.delete("pm")
    assert sorted(load_registry(populated, box=BOX).internal_combos) == ["qtSd/pk/k2"]


def test_registry_build_keeps_its_old_signature() -> None:
    reg = Registry.build([conn_("m1", models=("a",))], [], [])
    assert reg.combos == {}
    assert reg.internal_combos == {}
    assert reg.combo("a") is None
    assert Registry().combo("x") is None
