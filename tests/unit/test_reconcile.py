"""The rule between the config file and the metadata DB (fairgate.db.reconcile, issue 49), on
domain objects: what a start creates, updates, keeps, overwrites or never brings back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fairgate.db.pools import PoolRecord
from fairgate.db.reconcile import (
    INFO,
    WARNING,
    Action,
    Mode,
    Objects,
    Stored,
    connection_form,
    key_form,
    reconcile,
    start_log,
)
from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey, hash_key
from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Allocation, Dimension

UPSTREAM = "upstream-secret-value"


def conn(cid: str = "m1", **kw: object) -> Connection:
    fields: dict[str, object] = {"provider": "mock", "base_url": "http://up/v1", "secret": UPSTREAM}
    return Connection(id=cid, **{**fields, **kw})  # type: ignore[arg-type]


def key(kid: str = "alice", secret: str = "fg-alice-secret", **kw: object) -> ClientKey:
    return ClientKey(id=kid, **{"name": kid, "key_hash": hash_key(secret), **kw})  # type: ignore[arg-type]


def pool(members: tuple[str, ...] = ("m1",), *allocations: Allocation) -> PoolRecord:
    dims = (Dimension(Unit.REQUESTS, Window.DAILY, 100),)
    return PoolRecord("p", "P", members, dims, allocations)


def applied_as(objects: Objects) -> Stored:
    """The DB right after the file wrote ``objects`` (nothing changed since)."""
    return Stored(objects, objects.forms())


FILE = Objects(
    connections={"m1": conn()},
    keys={"alice": key(), "bob": key("bob", "fg-bob-secret")},
    pools={"p": pool(("m1",), Allocation("alice", 50), Allocation("bob", 50))},
)


def actions(objects: Objects, stored: Stored, mode: Mode = "seed") -> dict[str, Action]:
    return {d.label: d.action for d in reconcile(objects, stored, mode).decisions}


def test_a_new_database_gets_everything_the_file_declares() -> None:
    result = reconcile(FILE, Stored(Objects()), "seed")
    assert set(actions(FILE, Stored(Objects())).values()) == {"create"}
    assert result.writes == FILE
    assert result.record == FILE.forms()
    assert all(result.creates(d.kind, d.id) for d in result.decisions)


def test_the_same_file_again_writes_nothing() -> None:
    result = reconcile(FILE, applied_as(FILE), "seed")
    assert set(actions(FILE, applied_as(FILE)).values()) == {"in_sync"}
    assert (result.writes, result.record, result.forget, result.differences) == (
        Objects(),
        {},
        (),
        (),
    )


def test_the_files_edit_is_applied_to_what_nobody_else_changed() -> None:
    edited = replace(FILE, connections={"m1": conn(weight=3.0)})
    result = reconcile(edited, applied_as(FILE), "seed")
    (d,) = result.differences
    assert (d.label, d.action, d.fields) == ("connection m1", "update", ("weight",))
    assert result.writes.connections == {"m1": conn(weight=3.0)}
    assert result.record == {("connection", "m1"): connection_form(conn(weight=3.0))}


@pytest.mark.parametrize(("mode", "expected"), [("seed", "kept"), ("authoritative", "overwrite")])
def test_what_the_api_changed_is_kept_unless_the_file_is_authoritative(
    mode: Mode, expected: Action
) -> None:
    api = Objects(
        FILE.connections,
        FILE.keys,
        pools={"p": pool(("m1",), Allocation("alice", 90), Allocation("bob", 10))},
    )
    stored = Stored(api, FILE.forms())  # the file wrote FILE; the API changed the allocations
    result = reconcile(FILE, stored, mode)
    (d,) = result.differences
    assert (d.label, d.action, d.fields) == ("allocations of pool p", expected, ("alice", "bob"))
    assert not d.file_changed  # the file still says what it wrote
    assert bool(result.writes.pools) == (mode == "authoritative")
    # the file edits the same allocations: still not applied in seed mode, and said so
    edited = replace(FILE, pools={"p": pool(("m1",), Allocation("alice", 60))})
    (d,) = (x for x in reconcile(edited, stored, mode).differences if x.kind == "allocations")
    assert d.action == expected
    assert d.file_changed == (mode == "seed")


@pytest.mark.parametrize(("mode", "expected"), [("seed", "deleted"), ("authoritative", "recreate")])
def test_what_the_api_deleted_stays_deleted_unless_the_file_is_authoritative(
    mode: Mode, expected: Action
) -> None:
    stored = Stored(replace(FILE, connections={}, pools={}), FILE.forms())
    got = actions(FILE, stored, mode)
    assert got["connection m1"] == got["pool p"] == got["allocations of pool p"] == expected
    writes = reconcile(FILE, stored, mode).writes
    assert bool(writes.connections) == bool(writes.pools) == (mode == "authoritative")


def test_what_the_api_created_is_kept_and_adopted_once_it_equals_the_file() -> None:
    """No record (created through the API, or by a version before records): kept while it
    differs; once equal, the file's again (recorded), so its later edits apply."""
    other = Objects(FILE.connections, FILE.keys, pools={"p": pool(("m1",), Allocation("alice"))})
    assert actions(FILE, Stored(other))["allocations of pool p"] == "kept"
    same = reconcile(FILE, Stored(FILE), "seed")
    assert not same.differences
    assert same.writes == Objects()
    assert same.record == FILE.forms()  # adopted: no object written, only the records


@pytest.mark.parametrize("mode", ["seed", "authoritative"])
def test_a_rotated_or_revoked_secret_in_the_file_is_never_written_again(mode: Mode) -> None:
    rotated = key(secret="fg-alice-new")
    old = hash_key("fg-alice-secret")
    # rotated through the API: the key keeps its new secret, in either mode
    stored = Stored(replace(FILE, keys={**FILE.keys, "alice": rotated}), FILE.forms(), {old})
    result = reconcile(FILE, stored, mode)
    (d,) = result.differences
    assert (d.label, d.retired_secret) == ("key alice", True)
    assert d.action == "in_sync"  # as the file says, but for the secret
    assert result.writes.keys == {}
    assert "rotated away or revoked" in d.message()
    # the file renames it meanwhile: the rotation was a change through the API, so seed mode
    # keeps the key as it is; an authoritative file renames it, and still keeps the secret
    renamed = replace(FILE, keys={**FILE.keys, "alice": key(name="Alice B.")})
    written = reconcile(renamed, stored, mode).writes.keys
    assert written == ({} if mode == "seed" else {"alice": replace(rotated, name="Alice B.")})
    # revoked: not created again, even by an authoritative file
    revoked = Stored(replace(FILE, keys={"bob": FILE.keys["bob"]}), FILE.forms(), {old})
    assert actions(FILE, revoked, mode)["key alice"] == "retired"
    assert "alice" not in reconcile(FILE, revoked, mode).writes.keys


def test_an_authoritative_file_may_give_a_revoked_key_a_new_secret() -> None:
    old = hash_key("fg-alice-secret")
    revoked = Stored(replace(FILE, keys={"bob": FILE.keys["bob"]}), FILE.forms(), {old})
    fresh = replace(FILE, keys={**FILE.keys, "alice": key(secret="fg-alice-fresh")})
    assert actions(fresh, revoked, "authoritative")["key alice"] == "recreate"
    assert actions(fresh, revoked, "seed")["key alice"] == "deleted"


def test_a_revoked_keys_allocation_goes_with_it() -> None:
    """The API revoked bob: his allocation went with the key (cascade). The file still lists
    both; the allocations it can write are alice's, which is what the DB holds: in sync."""
    api = Objects(
        FILE.connections, {"alice": key()}, {}, {"p": pool(("m1",), Allocation("alice", 50))}
    )
    stored = Stored(api, FILE.forms(), {hash_key("fg-bob-secret")})
    got = actions(FILE, stored)
    assert got["key bob"] == "retired"
    assert got["allocations of pool p"] == "in_sync"
    assert reconcile(FILE, stored, "seed").writes == Objects()


def test_a_pool_whose_connections_were_all_deleted_is_not_created() -> None:
    stored = Stored(Objects(keys=FILE.keys), {("connection", "m1"): connection_form(conn())})
    got = actions(FILE, stored)
    assert got["connection m1"] == "deleted"
    assert got["pool p"] == got["allocations of pool p"] == "skipped"


def test_records_of_what_the_file_no_longer_declares_are_forgotten() -> None:
    smaller = replace(FILE, pools={})
    result = reconcile(smaller, applied_as(FILE), "seed")
    assert set(result.forget) == {("pool", "p"), ("allocations", "p")}
    assert result.writes == Objects()  # nothing deleted: the pool stays, no longer the file's


def test_a_difference_names_fields_never_values() -> None:
    changed = Stored(
        replace(FILE, connections={"m1": conn(secret="rotated-upstream")}), FILE.forms()
    )
    (d,) = reconcile(FILE, changed, "seed").differences
    assert d.fields == ("secret",)
    text = str(d.as_json()) + d.message()
    for secret in (UPSTREAM, "rotated-upstream", hash_key("fg-alice-secret")):
        assert secret not in text
    assert key_form(key()).fields["secret"] == hash_key("fg-alice-secret")  # a hash, never clear


def test_the_start_log_says_the_mode_each_overwrite_and_each_edit_not_applied() -> None:
    api = Objects(
        FILE.connections, FILE.keys, {}, {"p": pool(("m1", "m2"), *FILE.pools["p"].allocations)}
    )
    stored = Stored(api, FILE.forms())
    edited = replace(FILE, keys={**FILE.keys, "bob": key("bob", "fg-bob-secret", enabled=False)})
    seed = start_log(reconcile(edited, stored, "seed"))
    assert seed[0] == (INFO, "seeded from config: updated key bob")
    assert [lvl for lvl, _ in seed] == [INFO, INFO]
    assert "pool p (connections)" in seed[1][1]
    edited_pool = replace(edited, pools={"p": replace(FILE.pools["p"], name="Q")})
    [(_, warning)] = [x for x in start_log(reconcile(edited_pool, stored, "seed")) if x[0] > INFO]
    assert "pool p (connections, name): the file's edit is not applied" in warning
    authoritative = start_log(reconcile(edited, stored, "authoritative"))
    assert authoritative[0][0] == WARNING
    assert "authoritative" in authoritative[0][1]
    assert (
        WARNING,
        "config file (authoritative): overwriting pool p (connections), changed through the "
        "admin API",
    ) in authoritative
