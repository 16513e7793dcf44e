"""Upstream secrets sealed in the metadata DB (issue 12): both engines, the start-up sealing of
an older DB's clear secrets, and the clear error of a missing or wrong key."""

from __future__ import annotations

import logging
import sqlite3
import stat
from pathlib import Path

import pytest
from db_support import BOX, migrate_sqlite_to

from fairgate.clock import ManualClock
from fairgate.config import ConfigError, load_config_text
from fairgate.db.base import Database
from fairgate.db.connections import ConnectionRepo
from fairgate.db.repos import load_registry
from fairgate.db.sealing import prepare_secrets
from fairgate.domain.connections import Connection
from fairgate.process.state import Gateway
from fairgate.secretbox import ENV_VAR, KEY_FILE, PREFIX, SecretBox, SecretKeyError

UPSTREAM = "sk-live-UPSTREAM-never-in-clear-0001"


def _conn(cid: str = "c1", secret: str = UPSTREAM) -> Connection:
    return Connection(id=cid, provider="mock", base_url="http://up/v1", secret=secret)


def _stored(db: Database, cid: str = "c1") -> str:
    return str(db.execute("SELECT secret FROM connections WHERE id = ?", (cid,)).fetchone()[0])


def test_the_repository_stores_sealed_and_reads_clear(db: Database) -> None:
    repo = ConnectionRepo(db, box=BOX)
    repo.create(_conn())
    assert _stored(db).startswith(PREFIX)
    assert UPSTREAM not in _stored(db)
    assert repo.get("c1").secret == UPSTREAM
    assert load_registry(db, box=BOX).connections["c1"].secret == UPSTREAM
    # an unchanged upsert writes nothing (compared opened, although Fernet is not deterministic)
    before = _stored(db)
    assert repo.upsert(_conn()) == "unchanged"
    assert _stored(db) == before
    assert repo.upsert(_conn(secret="sk-new")) == "updated"
    assert repo.get("c1").secret == "sk-new"
    assert "sk-new" not in _stored(db)
    # no secret: stays empty (nothing to seal)
    repo.create(_conn("c2", secret=""))
    assert _stored(db, "c2") == ""


def test_start_up_seals_an_older_dbs_clear_secrets_once(db: Database) -> None:
    for cid in ("old-1", "old-2"):
        db.execute(
            "INSERT INTO connections (id, provider, base_url, secret) VALUES (?, 'mock', 'u', ?)",
            (cid, UPSTREAM + cid),
        )
    assert prepare_secrets(db, BOX) == 2
    assert all(_stored(db, c).startswith(PREFIX) for c in ("old-1", "old-2"))
    assert ConnectionRepo(db, box=BOX).get("old-2").secret == UPSTREAM + "old-2"
    assert prepare_secrets(db, BOX) == 0  # idempotent: a second worker seals nothing


def test_a_wrong_key_is_refused_before_anything_is_read(db: Database) -> None:
    prepare_secrets(db, BOX)
    other = SecretBox([SecretBox.generate_key()])
    with pytest.raises(SecretKeyError) as err:
        prepare_secrets(db, other)
    assert ENV_VAR in str(err.value)
    # the old key after a new one (rotation) opens the DB
    rotating = SecretBox([SecretBox.generate_key(), *BOX._keys])
    assert prepare_secrets(db, rotating) == 0


def _old_sqlite_db(path: Path) -> None:
    """A data dir as the version before sealing left it: schema 6, a secret in clear."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    migrate_sqlite_to(db, 6)
    db.execute(
        "INSERT INTO connections (id, provider, base_url, secret, models) "
        "VALUES ('old-1', 'mock', 'http://x/v1', ?, '[\"*\"]')",
        (UPSTREAM,),
    )
    db.commit()
    db.close()


CONFIG = f"""
connections:
  - {{id: cfg-1, provider: mock, base_url: "http://up/v1", secret: "{UPSTREAM}-cfg",
      models: ["*"]}}
"""


async def test_embedded_sqlite_generates_a_key_file_and_keeps_no_secret_in_clear(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    _old_sqlite_db(data / "fairgate.sqlite")
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env={}, clock=clock)
    with caplog.at_level(logging.INFO, logger="fairgate"):
        await gw.start()
    try:
        assert gw.registry.connections["old-1"].secret == UPSTREAM
        assert gw.registry.connections["cfg-1"].secret == UPSTREAM + "-cfg"
    finally:
        await gw.stop()
    key_file = data / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert any(str(key_file) in r.getMessage() for r in caplog.records)
    assert any("sealed 1 upstream secret" in r.getMessage() for r in caplog.records)
    for f in data.glob("fairgate.sqlite*"):  # the DB and its WAL, byte for byte
        assert UPSTREAM.encode() not in f.read_bytes(), f.name
    assert not any(UPSTREAM in r.getMessage() for r in caplog.records)

    # the same data dir under another key: refused at start, naming what to do
    wrong = {ENV_VAR: SecretBox.generate_key().decode()}
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env=wrong, clock=clock)
    with pytest.raises(ConfigError) as err:
        await gw.start()
    assert ENV_VAR in str(err.value)
    assert KEY_FILE in str(err.value)
    # the key file removed (lost): a new one is generated, and refused the same way
    key_file.unlink()
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env={}, clock=clock)
    with pytest.raises(ConfigError):
        await gw.start()


async def test_a_shared_postgres_db_requires_the_key(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    env = {"FAIRGATE_DATABASE_URL": postgres_url}
    gw = Gateway(
        data_dir=tmp_path / "r0", config=load_config_text(CONFIG, {}), env=env, clock=clock
    )
    with pytest.raises(ConfigError) as err:
        await gw.start()
    assert ENV_VAR in str(err.value)
    assert "PostgreSQL" in str(err.value)
    assert not (tmp_path / "r0" / KEY_FILE).exists()  # no per-replica key was made up

    key = SecretBox.generate_key().decode()
    replicas = []
    for i in range(2):  # two replicas, own data dirs, one key: both read the sealed secret
        gw = Gateway(
            data_dir=tmp_path / f"r{i}",
            config=load_config_text(CONFIG, {}),
            env={**env, ENV_VAR: key},
            clock=clock,
        )
        await gw.start()
        replicas.append(gw)
    try:
        assert all(g.registry.connections["cfg-1"].secret == UPSTREAM + "-cfg" for g in replicas)
        assert _stored(replicas[0].db, "cfg-1").startswith(PREFIX)
    finally:
        for g in replicas:
            await g.stop()


def test_the_cli_prints_a_usable_key() -> None:
    from typer.testing import CliRunner

    from fairgate.cli import app

    out = CliRunner().invoke(app, ["secret-key"])
    assert out.exit_code == 0
    box = SecretBox([out.stdout.strip().encode()])
    assert box.open(box.seal("x")) == "x"


async def test_rotation_reseals_everything_under_the_new_key(
    tmp_path: Path, clock: ManualClock
) -> None:
    from typer.testing import CliRunner

    from fairgate.cli import app
    from fairgate.db.oauth_tokens import FileTokenStore
    from fairgate.domain.tokens import TokenSet

    old, new = SecretBox.generate_key().decode(), SecretBox.generate_key().decode()
    data = tmp_path / "data"
    gw = Gateway(
        data_dir=data, config=load_config_text(CONFIG, {}), env={ENV_VAR: old}, clock=clock
    )
    await gw.start()
    await gw.stop()
    pair = TokenSet("access-SECRET", "refresh-SECRET", 5, "acct")
    await FileTokenStore(data / "oauth", SecretBox([old.encode()])).save("c", pair, replaces=None)

    runner = CliRunner()
    res = runner.invoke(app, ["reseal", "--data-dir", str(data)], env={ENV_VAR: ""})
    assert res.exit_code == 2
    assert "NEW,OLD" in res.output
    res = runner.invoke(app, ["reseal", "--data-dir", str(data)], env={ENV_VAR: f"{new},{old}"})
    assert res.exit_code == 0, res.output
    assert "resealed 1 connection secret(s) and 1 OAuth token file(s)" in res.output

    # the old key is gone: everything opens with the new one alone
    only_new = SecretBox([new.encode()])
    assert await FileTokenStore(data / "oauth", only_new).load("c") == pair
    gw = Gateway(
        data_dir=data, config=load_config_text(CONFIG, {}), env={ENV_VAR: new}, clock=clock
    )
    await gw.start()
    try:
        assert gw.registry.connections["cfg-1"].secret == UPSTREAM + "-cfg"
    finally:
        await gw.stop()


async def test_a_rotation_on_a_data_dir_with_a_key_file_rewrites_the_file(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Issue 44: after ``reseal`` with NEW,OLD on SQLite, ``secret.key`` still held the old
    key, so a start without the variable (the file's key) could open nothing it had resealed.
    The file now holds the new key, written whole and private."""
    from typer.testing import CliRunner

    from fairgate.cli import app

    data = tmp_path / "data"
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env={}, clock=clock)
    await gw.start()  # the key file is made at the first start
    await gw.stop()
    key_file = data / "secret.key"
    old = key_file.read_text().strip()
    new = SecretBox.generate_key().decode()
    res = CliRunner().invoke(
        app, ["reseal", "--data-dir", str(data)], env={ENV_VAR: f"{new},{old}"}
    )
    assert res.exit_code == 0, res.output
    assert "now holds the new key" in res.output
    assert key_file.read_text().strip() == new
    assert key_file.stat().st_mode & 0o777 == 0o600
    gw = Gateway(data_dir=data, config=load_config_text(CONFIG, {}), env={}, clock=clock)
    await gw.start()  # no variable: the file's key opens what was resealed
    try:
        assert gw.registry.connections["cfg-1"].secret == UPSTREAM + "-cfg"
    finally:
        await gw.stop()


def test_reseal_refusals_are_one_line_and_exit_2(tmp_path: Path) -> None:
    """Issue 44: the CLI's rule for bad input is one line and exit 2, never a traceback; a
    mistyped --data-dir once created an empty data dir and reported "resealed 0"."""
    from typer.testing import CliRunner

    from fairgate.cli import app

    key = SecretBox.generate_key().decode()
    runner = CliRunner()
    missing = tmp_path / "typo"
    res = runner.invoke(app, ["reseal", "--data-dir", str(missing)], env={ENV_VAR: key})
    assert res.exit_code == 2, res.output
    assert "holds no fairgate data" in res.output
    assert not missing.exists()
    env = {ENV_VAR: key, "FAIRGATE_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    res = runner.invoke(app, ["reseal", "--data-dir", str(tmp_path)], env=env)
    assert res.exit_code == 2, res.output
    assert "cannot open the metadata DB" in res.output
    assert "Traceback" not in res.output
