"""``fairgate config check`` against the metadata DB (issue 49): the mode, and per object what
differs between the file and the database and what a start does about it; names only, never a
secret; read only (no data dir, key file, database or migration created), on both engines."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

from db_support import BEFORE_PROVENANCE, migrate_sqlite_to
from typer.testing import CliRunner, Result

from fairgate.cli import app
from fairgate.clock import ManualClock
from fairgate.config import load_config_text
from fairgate.db.keys import KeyRepo
from fairgate.db.pools import PoolRepo
from fairgate.db.schema import PROVENANCE_VERSION
from fairgate.process.state import Gateway
from fairgate.secretbox import ENV_VAR, KEY_FILE, SecretBox

UPSTREAM = "upstream-secret-for-the-check"
ALICE = "fg-alice-secret-for-the-check"
BOB = "fg-bob-secret-for-the-check"
CONFIG = f"""
connections:
  - {{id: m1, provider: mock, base_url: "http://up/v1", secret: "{UPSTREAM}", models: ["*"]}}
keys:
  - {{id: alice, name: Alice, secret: "{ALICE}"}}
  - {{id: bob, name: Bob, secret: "{BOB}"}}
pools:
  - id: shared
    connections: [m1]
    dimensions: [{{unit: requests, window: daily, limit: 100}}]
    allocations: [{{key: alice, weight: 50}}, {{key: bob, weight: 50}}]
"""
SHARED_KEY = SecretBox.generate_key().decode()
runner = CliRunner()


def _env(metadata_url: str | None) -> dict[str, str]:
    if metadata_url is None:
        return {}
    return {"FAIRGATE_DATABASE_URL": metadata_url, ENV_VAR: SHARED_KEY}


async def _seed_then_change(data: Path, env: dict[str, str], clock: ManualClock) -> None:
    """A start with the file, then what the admin API does: rotate alice, revoke bob, rename
    the pool (the repositories the admin API calls)."""
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env=env, clock=clock)
    await gw.start()
    try:
        KeyRepo(gw.db).rotate("alice")
        KeyRepo(gw.db).delete("bob")
        pools = PoolRepo(gw.db)
        pools.update(replace(pools.record("shared"), name="Renamed"))
    finally:
        await gw.stop()


def invoke(file: Path, data: Path, env: dict[str, str], *extra: str) -> Result:
    """``fairgate config check`` with ``env`` only (none of this process's FAIRGATE_*)."""
    unset = {k: None for k in os.environ if k.startswith("FAIRGATE_")}
    return runner.invoke(
        app,
        ["config", "check", str(file), "--data-dir", str(data), *extra],
        env={**unset, **env},
    )


def check(file: Path, data: Path, env: dict[str, str]) -> Any:
    res = invoke(file, data, env, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


async def test_config_check_says_the_mode_and_what_differs(
    tmp_path: Path, clock: ManualClock, metadata_url: str | None
) -> None:
    env, data = _env(metadata_url), tmp_path / "data"
    file = tmp_path / "fairgate.yaml"
    file.write_text(CONFIG)
    first = check(file, data, env)["database"]
    if metadata_url is None:
        assert not first["compared"]
        assert "no database yet" in first["note"]
        assert not data.exists()  # nothing created by the check
    await _seed_then_change(data, env, clock)
    got = check(file, data, env)
    assert got["mode"] == "seed"
    db = got["database"]
    assert db["compared"]
    by_label = {(d["kind"], d["id"]): d for d in db["differences"]}
    # the file's secret of alice was rotated away: never written again, in either mode
    assert by_label[("key", "alice")]["fields"] == ["secret"]
    assert "rotated away or revoked" in by_label[("key", "alice")]["message"]
    assert by_label[("key", "bob")]["action"] == "retired"  # revoked: never created again
    assert by_label[("pool", "shared")]["action"] == "kept"
    assert by_label[("pool", "shared")]["fields"] == ["name"]
    # bob's allocation went with his key, and the file's can only name the keys that exist
    assert ("allocations", "shared") not in by_label
    text = json.dumps(got)
    for secret in (UPSTREAM, ALICE, BOB):
        assert secret not in text

    # authoritative: the next start would overwrite, but never bring bob's secret back
    file.write_text(
        CONFIG.replace("connections:", "server: {config_mode: authoritative}\nconnections:", 1)
    )
    auth = {
        (d["kind"], d["id"]): d["action"] for d in check(file, data, env)["database"]["differences"]
    }
    assert auth[("key", "alice")] == "in_sync"  # but for the secret, which stays rotated
    assert auth[("key", "bob")] == "retired"
    assert auth[("pool", "shared")] == "overwrite"

    # people read the same
    res = invoke(file, data, env)
    assert res.exit_code == 0, res.output
    assert "mode: authoritative (server.config_mode)" in res.stdout
    assert (
        "pool shared (name): changed through the admin API; a start sets it to the file's"
        in res.stdout
    )


async def test_config_check_reads_only(tmp_path: Path, clock: ManualClock) -> None:
    """No key file made up (the DB's secrets would then be unreadable by the gateway), and a
    DB of an earlier version neither migrated nor compared."""
    data = tmp_path / "data"
    await _seed_then_change(data, {}, clock)
    file = tmp_path / "fairgate.yaml"
    file.write_text(CONFIG)
    (data / KEY_FILE).rename(tmp_path / "moved.key")
    db = check(file, data, {})["database"]
    assert not db["compared"]
    assert ENV_VAR in db["note"]
    assert not (data / KEY_FILE).exists()

    old = tmp_path / "old"
    old.mkdir()
    conn = sqlite3.connect(old / "fairgate.sqlite")
    conn.execute("PRAGMA journal_mode=WAL")  # as fairgate leaves its files
    migrate_sqlite_to(conn, PROVENANCE_VERSION - 3)
    conn.commit()
    conn.close()
    (old / KEY_FILE).write_text(SecretBox.generate_key().decode())
    before = (old / "fairgate.sqlite").read_bytes()
    db = check(file, old, {})["database"]
    assert not db["compared"]
    assert "older version" in db["note"]
    assert (old / "fairgate.sqlite").read_bytes() == before


async def test_config_check_of_a_database_of_the_previous_version(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Schema 7 (before the records): compared as the next start sees it, and not migrated."""
    data = tmp_path / "data"
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env={}, clock=clock)
    await gw.start()
    try:
        gw.db.execute("UPDATE pools SET name = 'Renamed by the API' WHERE id = 'shared'")
        for stmt in BEFORE_PROVENANCE:
            gw.db.execute(stmt)
    finally:
        await gw.stop()
    file = tmp_path / "fairgate.yaml"
    file.write_text(CONFIG)
    db = check(file, data, {})["database"]
    assert db["compared"]
    assert [(d["kind"], d["id"], d["action"], d["fields"]) for d in db["differences"]] == [
        ("pool", "shared", "kept", ["name"])
    ]
    tables = sqlite3.connect(data / "fairgate.sqlite").execute(
        "SELECT name FROM sqlite_master WHERE name = 'config_applied'"
    )
    assert tables.fetchone() is None  # not migrated by the check
