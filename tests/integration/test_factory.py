"""Driver choice: DB setting > env > sqlite; Redis unusable at start → SQLite with a warning."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fairgate.db.connection import open_db
from fairgate.db.schema import MIGRATIONS
from fairgate.db.settings import SettingsRepo
from fairgate.process.settings import Settings
from fairgate.store.factory import create_store


def requested_driver(env: dict[str, str], db: dict[str, str]) -> str:
    """The driver the settings resolve from ``db`` > ``env`` > default."""
    return Settings.load(env, db=db).store.driver


def test_precedence() -> None:
    assert requested_driver({}, {}) == "sqlite"
    assert requested_driver({"QUOTA_STORE_DRIVER": "redis"}, {}) == "redis"
    assert requested_driver({"QUOTA_STORE_DRIVER": "redis"}, {"quotaStore.driver": "sqlite"}) == (
        "sqlite"
    )
    assert requested_driver({"QUOTA_STORE_DRIVER": "bogus"}, {}) == "sqlite"


def test_an_unknown_driver_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    assert requested_driver({"QUOTA_STORE_DRIVER": " Reddis "}, {}) == "sqlite"
    assert "QUOTA_STORE_DRIVER='Reddis' ignored (not a quota store driver" in caplog.text
    caplog.clear()
    assert requested_driver({"QUOTA_STORE_DRIVER": "REDIS"}, {}) == "redis"
    assert requested_driver({}, {}) == "sqlite"
    assert caplog.text == ""


async def test_default_is_sqlite(tmp_path: Path) -> None:
    store, choice = await create_store(tmp_path / "q.sqlite", Settings.load({}).store)
    assert (store.name, choice.driver, choice.fallback_reason) == ("sqlite", "sqlite", None)
    await store.close()


async def test_redis_without_url_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, choice = await create_store(
        tmp_path / "q.sqlite", Settings.load({"QUOTA_STORE_DRIVER": "redis"}).store
    )
    assert store.name == "sqlite"
    assert choice.requested == "redis"
    assert choice.fallback_reason is not None
    assert "QUOTA_STORE_REDIS_URL" in choice.fallback_reason
    assert any("falling back to sqlite" in r.getMessage() for r in caplog.records)
    await store.close()


async def test_unreachable_redis_falls_back_and_hides_the_password(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    env = {
        "QUOTA_STORE_DRIVER": "redis",
        "QUOTA_STORE_REDIS_URL": f"redis://:hunter2secret@127.0.0.1:{port}/0",
    }
    store, choice = await create_store(tmp_path / "q.sqlite", Settings.load(env).store)
    assert store.name == "sqlite"
    assert choice.fallback_reason is not None
    assert "hunter2secret" not in choice.fallback_reason
    await store.close()


async def test_db_setting_selects_redis(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    conn = open_db(tmp_path / "meta.sqlite")
    repo = SettingsRepo(conn)
    repo.set("quotaStore.driver", "redis")
    repo.set("quotaStore.redisUrl", redis_url)
    env = {"QUOTA_STORE_DRIVER": "sqlite", "QUOTA_STORE_REDIS_PREFIX": redis_prefix}
    store, choice = await create_store(
        tmp_path / "q.sqlite", Settings.load(env, db=repo.all()).store
    )
    assert (store.name, choice.driver) == ("redis", "redis")
    assert await store.ping()
    await store.close()
    conn.close()


def test_migrations_are_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "meta.sqlite"
    conn = open_db(path)
    SettingsRepo(conn).set("a", "1")
    conn.close()
    conn = open_db(path)  # second open applies nothing and keeps data
    assert SettingsRepo(conn).get("a") == "1"
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    repo = SettingsRepo(conn)
    repo.set("a", "2")
    assert repo.all() == {"a": "2"}
    repo.delete("a")
    assert repo.get("a") is None
    conn.close()


async def test_sqlite_synchronous_setting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, _ = await create_store(tmp_path / "a.sqlite", Settings.load({}).store)
    row = store._conn.execute("PRAGMA synchronous").fetchone()  # type: ignore[attr-defined]
    assert row[0] == 0  # OFF: no fsync on the event loop (counters survive process crashes)
    await store.close()
    store, _ = await create_store(
        tmp_path / "b.sqlite", Settings.load({"QUOTA_SQLITE_SYNCHRONOUS": "normal"}).store
    )
    row = store._conn.execute("PRAGMA synchronous").fetchone()  # type: ignore[attr-defined]
    assert row[0] == 1
    await store.close()
    store, _ = await create_store(
        tmp_path / "c.sqlite", Settings.load({"QUOTA_SQLITE_SYNCHRONOUS": "x"}).store
    )
    assert any("QUOTA_SQLITE_SYNCHRONOUS" in r.getMessage() for r in caplog.records)
    await store.close()


def test_sqlite_store_rejects_unknown_synchronous(tmp_path: Path) -> None:
    from fairgate.store.sqlite.store import SqliteQuotaStore

    with pytest.raises(ValueError, match="synchronous"):
        SqliteQuotaStore(tmp_path / "d.sqlite", synchronous="sometimes")
