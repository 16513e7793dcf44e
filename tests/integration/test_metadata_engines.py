"""What differs between the metadata engines and must not show: migrations applied once when
replicas start together (and on a DB of an earlier version), the change counter every replica
polls, and the SQL translation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from db_support import BEFORE_PROVENANCE, BOX

from fairgate.config import parse_config
from fairgate.db.base import Database
from fairgate.db.common import MetadataUnavailable
from fairgate.db.connections import ConnectionRepo
from fairgate.db.engine import database_url, open_database
from fairgate.db.keys import KeyRepo
from fairgate.db.pools import PoolRepo
from fairgate.db.postgres import translate_ddl, translate_sql
from fairgate.db.repos import seed_from_config
from fairgate.db.schema import MIGRATIONS
from fairgate.db.settings import SettingsRepo
from fairgate.domain.connections import Connection
from fairgate.domain.keys import hash_key


def version(db: Database) -> int:
    return int(db.execute("SELECT version FROM meta_version").fetchone()[0])


def test_translation_of_the_portable_sql() -> None:
    assert translate_sql("SELECT a FROM t WHERE b = ? AND c = '?'") == (
        "SELECT a FROM t WHERE b = %s AND c = '?'"
    )
    assert translate_sql("SELECT 1 WHERE x LIKE 'a%' AND y = ?") == (
        "SELECT 1 WHERE x LIKE 'a%%' AND y = %s"
    )
    assert translate_sql("SELECT '%'", with_params=False) == "SELECT '%'"
    assert translate_sql("SET until_ms = MAX(r.until_ms, excluded.until_ms)") == (
        "SET until_ms = GREATEST(r.until_ms, excluded.until_ms)"
    )
    assert translate_sql("SELECT MAX(version) FROM v") == "SELECT MAX(version) FROM v"
    assert translate_sql("INSERT OR IGNORE INTO s (k) VALUES (?)") == (
        "INSERT INTO s (k) VALUES (%s) ON CONFLICT DO NOTHING"
    )
    assert translate_ddl("a INTEGER, b REAL, c TEXT, d INTEGERS") == (
        'a BIGINT, b DOUBLE PRECISION, c TEXT COLLATE "C", d INTEGERS'
    )


def test_database_url_must_name_postgresql() -> None:
    assert database_url(None) is None
    assert database_url(" ") is None
    assert database_url("postgresql://h/db") == "postgresql://h/db"
    with pytest.raises(ValueError, match="postgresql://"):
        database_url("mysql://h/db")


def test_replicas_starting_together_migrate_once(metadata_url: str | None, tmp_path: Path) -> None:
    """Eight processes' worth of connections open (and so migrate) the same DB at once."""
    opened: list[Database] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(8)

    def start() -> None:
        try:
            gate.wait()
            opened.append(open_database(metadata_url, tmp_path / "fairgate.sqlite"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        rows = opened[0].execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
        assert version(opened[0]) == 0
    finally:
        for db in opened:
            db.close()


def test_every_registry_write_bumps_the_counter_seen_by_other_connections(
    metadata_url: str | None, tmp_path: Path
) -> None:
    a = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    b = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    try:
        before = version(b)
        ConnectionRepo(a, box=BOX).create(
            Connection(id="m1", provider="mock", base_url="http://u/v1", secret="s")
        )
        after_create = version(b)
        assert after_create > before
        SettingsRepo(a).set("quota.x", "1")
        assert version(b) > after_create
        # resilience rows are not registry data: no reload for them
        steady = version(b)
        a.execute(
            "INSERT INTO resilience_state (scope, kind, until_ms) VALUES (?, ?, ?)",
            ("cd:m1", "cooldown", 1),
        )
        assert version(b) == steady
    finally:
        a.close()
        b.close()


def test_the_first_write_after_the_server_dropped_the_connection_reconnects(
    postgres_url: str, tmp_path: Path
) -> None:
    """PostgreSQL restarted (here: this connection's backend terminated): the next write opens
    a new connection and commits, the write is not mistaken for a nested one on the dead
    connection (a SAVEPOINT outside a transaction, an error 500 before the fix)."""
    import psycopg

    db = open_database(postgres_url, tmp_path / "unused.sqlite")
    try:
        pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(postgres_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(MetadataUnavailable):  # the statement that finds it dead fails
            db.execute("SELECT 1")
        assert not db.in_transaction
        SettingsRepo(db).set("quota.after", "1")  # a transaction on the new connection
        assert SettingsRepo(db).get("quota.after") == "1"
        assert db.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
    finally:
        db.close()


def test_seeding_twice_from_two_replicas_creates_once_and_bumps_nothing(
    metadata_url: str | None, tmp_path: Path
) -> None:
    cfg = parse_config(
        {
            "connections": [
                {"id": "m1", "provider": "mock", "base_url": "http://u/v1", "models": ["*"]}
            ],
            "keys": [{"id": "alice", "secret": "fg-alice-secret-value"}],
            "pools": [{"id": "p", "connections": ["m1"], "allocations": [{"key": "alice"}]}],
        },
        {},
    )
    a = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    b = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    try:
        first = seed_from_config(a, cfg, box=BOX)
        seeded = version(a)
        second = seed_from_config(b, cfg, box=BOX)
        assert (first.created, second.created, second.changed) == (4, 0, 0)
        assert version(b) == seeded  # nothing written, so no replica reloads for nothing
    finally:
        a.close()
        b.close()


def test_a_database_of_the_previous_version_keeps_what_the_api_changed(
    metadata_url: str | None, tmp_path: Path
) -> None:
    """Upgrading: a DB of the version before records (schema 7), seeded by it, then changed
    through its admin API (a rotated key, an allocation). The new version's first start
    migrates it, keeps both changes, writes no object, and adopts what equals the file, whose
    later edits then apply."""
    cfg = {
        "connections": [
            {"id": "m1", "provider": "mock", "base_url": "http://u/v1", "models": ["*"]}
        ],
        "keys": [
            {"id": "alice", "secret": "fg-alice-secret-value"},
            {"id": "bob", "secret": "fg-bob-secret-value"},
        ],
        "pools": [
            {
                "id": "p",
                "connections": ["m1"],
                "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
            }
        ],
    }
    path = tmp_path / "fairgate.sqlite"
    db = open_database(metadata_url, path)
    try:
        seed_from_config(db, parse_config(cfg, {}), box=BOX)
        # as the previous version left it: no records, and changes through its admin API
        for stmt in (
            *BEFORE_PROVENANCE,
            "UPDATE allocations SET weight = 90 WHERE key_id = 'alice'",
        ):
            db.execute(stmt)
        db.execute(
            "UPDATE client_keys SET key_hash = ? WHERE id = 'alice'",
            (hash_key("fg-alice-rotated-value"),),
        )
    finally:
        db.close()
    db = open_database(metadata_url, path)  # the new version: migrated at open
    try:
        before = version(db)
        result = seed_from_config(db, parse_config(cfg, {}), box=BOX)
        assert result.changes == []
        assert version(db) == before  # no object written: no replica reloads
        kept = {d.label: d.action for d in result.differences}
        assert kept == {"key alice": "kept", "allocations of pool p": "kept"}
        assert KeyRepo(db).get("alice").key_hash == hash_key("fg-alice-rotated-value")
        assert {a.key_id: a.weight for a in PoolRepo(db).record("p").allocations} == {
            "alice": 90,
            "bob": 50,
        }
        edited = {
            **cfg,
            "keys": [cfg["keys"][0], {**cfg["keys"][1], "name": "Robert"}],  # type: ignore[index]
            "pools": [{**cfg["pools"][0], "name": "Renamed"}],  # type: ignore[index]
        }
        again = seed_from_config(db, parse_config(edited, {}), box=BOX)
        assert sorted(again.changes) == ["updated key bob", "updated pool p"]
    finally:
        db.close()
