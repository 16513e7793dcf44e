"""Change propagation between gateways sharing one metadata DB, in process: workers on one SQLite
file, replicas on one PostgreSQL. A write through one gateway (or any other process) reaches the
others' registry snapshots without a restart; on PostgreSQL both the notification and the poll
safety net are shown to work on their own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import psycopg
import pytest_asyncio
from rich.console import Console
from tcp_cut import TcpCut

from fairgate.admin.api import create_admin_app
from fairgate.admin_cli.render import degraded_parts, health_view
from fairgate.clock import ManualClock
from fairgate.config import parse_config
from fairgate.db.keys import KeyRepo
from fairgate.db.pools import PoolRepo
from fairgate.db.settings import SettingsRepo
from fairgate.process.state import Gateway
from fairgate.server.app import create_app

#: one key for the replicas sharing a PostgreSQL DB (a valid Fernet key)
SHARED_SECRET_KEY = "dGVzdC1vbmx5LWtleS1mb3ItZmFpcmdhdGUtc3ViMTI="

CONFIG = {
    "connections": [
        {"id": "m1", "provider": "mock", "base_url": "http://127.0.0.1:9/v1", "models": ["*"]},
        {"id": "m2", "provider": "mock", "base_url": "http://127.0.0.1:9/v1", "models": ["*"]},
    ],
    "keys": [
        {"id": "alice", "secret": "fg-alice-secret-0123456789"},
        {"id": "bob", "secret": "fg-bob-secret-0123456789"},
    ],
    "pools": [
        {
            "id": "demo",
            "connections": ["m1"],
            "dimensions": [{"unit": "requests", "window": "hourly", "limit": 10}],
            "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
        }
    ],
}

ADMIN = "adm-test"
#: Generous: a deadline for a busy machine, not a speed claim (benchmarks/replicas.py
#: measures the delay).
DEADLINE_S = 15.0


async def eventually(check: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < end, "the change did not propagate"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture
async def gateways(
    metadata_url: str | None, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Callable[..., asyncio.Future[list[Gateway]]]]:
    """Start ``n`` gateways on the test's metadata DB: SQLite workers share one data dir,
    PostgreSQL replicas each have their own (only the database is shared)."""
    started: list[Gateway] = []

    async def start(n: int, poll_ms: int = 20) -> list[Gateway]:
        env = {"FAIRGATE_METADATA_POLL_MS": str(poll_ms)}
        if metadata_url is not None:
            env["FAIRGATE_DATABASE_URL"] = metadata_url
            env["FAIRGATE_SECRET_KEY"] = SHARED_SECRET_KEY
        for i in range(n):
            data = tmp_path if metadata_url is None else tmp_path / f"replica-{i}"
            gw = Gateway(data_dir=data, config=parse_config(CONFIG, {}), env=env, clock=clock)
            await gw.start()
            started.append(gw)
        return started[-n:]

    yield start  # type: ignore[misc]
    for gw in started:
        await gw.stop()


async def test_pool_key_and_delete_reach_every_gateway(
    gateways: Callable[..., asyncio.Future[list[Gateway]]],
) -> None:
    a, b, c = await gateways(3)
    assert b.registry.pools["demo"].allocation("alice").weight == 50  # type: ignore[union-attr]

    repo = PoolRepo(a.db)
    rec = repo.record("demo")
    new = tuple(replace(x, weight=90 if x.key_id == "alice" else 10) for x in rec.allocations)
    repo.update(replace(rec, allocations=new))
    a.reload()  # what the admin API does on the writing gateway

    def weights(gw: Gateway) -> dict[str, float]:
        return {x.key_id: x.weight for x in gw.registry.pools["demo"].allocations}

    await eventually(lambda: all(weights(g) == {"alice": 90, "bob": 10} for g in (b, c)))

    _, secret = KeyRepo(b.db).create("Carol", key_id="carol")
    await eventually(lambda: c.registry.authenticate(secret) is not None)

    PoolRepo(c.db).delete("demo")
    await eventually(lambda: all("demo" not in g.registry.pools for g in (a, b)))


async def test_settings_written_elsewhere_are_applied(
    gateways: Callable[..., asyncio.Future[list[Gateway]]],
) -> None:
    a, b = await gateways(2)
    before = b.quota_settings
    SettingsRepo(a.db).set("quota.saturationThreshold", "0.9")
    await eventually(lambda: b.quota_settings != before)
    assert b.engine.settings.saturation_threshold == 0.9


# -- PostgreSQL: each mechanism on its own ------------------------------------------------------


@asynccontextmanager
async def _replicas(
    url: str, tmp_path: Path, clock: ManualClock, poll_ms: int
) -> AsyncIterator[list[Gateway]]:
    """Two started replicas on the metadata DB at ``url``, stopped when the block ends."""
    env = {
        "FAIRGATE_DATABASE_URL": url,
        "FAIRGATE_METADATA_POLL_MS": str(poll_ms),
        "FAIRGATE_SECRET_KEY": SHARED_SECRET_KEY,
    }
    out = []
    for i in range(2):
        gw = Gateway(
            data_dir=tmp_path / f"r{i}",
            config=parse_config(CONFIG, {}),
            env=env,
            clock=clock,
            admin_key=ADMIN,
        )
        await gw.start()
        out.append(gw)
    try:
        yield out
    finally:
        for gw in out:
            await gw.stop()


def _admin(gw: Gateway) -> httpx.AsyncClient:
    """A client of ``gw``'s admin API in this process (no socket), with the admin key."""
    transport = httpx.ASGITransport(app=create_admin_app(gw))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    return httpx.AsyncClient(transport=transport, base_url="http://gw", headers=auth)


async def test_a_notification_alone_propagates(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """The poll is an hour apart: only LISTEN/NOTIFY can carry the change."""
    async with _replicas(postgres_url, tmp_path, clock, poll_ms=3_600_000) as (a, b):
        await eventually(lambda: b.watcher is not None and b.watcher.listening)
        PoolRepo(a.db).delete("demo")
        await eventually(lambda: "demo" not in b.registry.pools)


async def test_a_lost_notification_is_caught_by_the_poll(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """A write whose triggers did not fire (so no NOTIFY), followed by a bare counter bump: only
    the poll sees it."""
    async with _replicas(postgres_url, tmp_path, clock, poll_ms=50) as (a, b):
        with psycopg.connect(postgres_url, autocommit=True) as raw, raw.transaction():
            raw.execute("SET LOCAL session_replication_role = replica")  # no triggers
            raw.execute("DELETE FROM pools WHERE id = 'demo'")
            raw.execute("UPDATE meta_version SET version = version + 1")
        await eventually(lambda: all("demo" not in g.registry.pools for g in (a, b)))


# -- the metadata DB goes away ------------------------------------------------------------------


async def test_metadata_down_serves_the_snapshot_refuses_writes_and_converges(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """Both replicas reach PostgreSQL through a relay that is cut: they keep their snapshot, the
    watcher reports the DB down (``/health``: ``metadata: down``), an admin write answers 503 and
    changes nothing; a write made meanwhile by a replica that still reaches the DB is applied
    once the path is back."""
    relay = TcpCut.for_url(postgres_url, 5432)
    async with _replicas(relay.url, tmp_path, clock, poll_ms=50) as (a, b):
        try:
            await eventually(lambda: b.watcher is not None and b.watcher.listening)
            relay.cut()
            await eventually(lambda: a.watcher is not None and not a.watcher.healthy)
            assert "demo" in a.registry.pools  # still served
            assert "demo" in b.registry.pools

            async with _admin(a) as client:
                resp = await client.delete("/quota/pools/demo")
            assert resp.status_code == 503
            assert "metadata database is unreachable" in resp.json()["error"]["message"]
            assert "demo" in a.registry.pools
            with psycopg.connect(postgres_url) as direct:  # the pool is still stored
                assert direct.execute("SELECT 1 FROM pools WHERE id = 'demo'").fetchone()
                direct.execute("DELETE FROM allocations WHERE key_id = 'bob'")  # another replica

            relay.restore()
            await eventually(
                lambda: all(
                    g.watcher is not None
                    and g.watcher.healthy
                    and len(g.registry.pools["demo"].allocations) == 1
                    for g in (a, b)
                )
            )
        finally:
            relay.close()


async def test_a_hung_metadata_db_is_down_and_refuses_admin_writes_at_once(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """The path to PostgreSQL hangs (the relay holds every byte: connections stay open, nothing
    answers). The watcher's version read misses its deadline, so the replica reports the DB
    down, and an admin write answers 503 without sending anything: the repositories'
    connection is synchronous, and a statement on a hung server would hold this event loop
    (the test's too) until the server came back. A regression hangs here until the safety
    timer thaws the relay, then fails."""
    relay = TcpCut.for_url(postgres_url, 5432)
    safety = threading.Timer(60, relay.thaw)
    async with _replicas(relay.url, tmp_path, clock, poll_ms=50) as (a, _):
        try:
            await eventually(lambda: a.watcher is not None and a.watcher.listening)
            relay.freeze()
            safety.start()
            await eventually(lambda: a.watcher is not None and not a.watcher.healthy)
            async with _admin(a) as client:
                resp = await client.delete("/quota/pools/demo")
                assert resp.status_code == 503
                assert "metadata database is unreachable" in resp.json()["error"]["message"]
                assert relay_was_frozen(safety)  # answered while the path still hung

                relay.thaw()
                await eventually(lambda: a.watcher is not None and a.watcher.healthy)
                resp = await client.delete("/quota/pools/demo")  # reconnects, then writes
                assert resp.status_code == 204, resp.text
            await eventually(lambda: "demo" not in a.registry.pools)
        finally:
            safety.cancel()
            relay.close()


def relay_was_frozen(safety: threading.Timer) -> bool:
    """The safety timer (which thaws the relay) has not fired yet."""
    return not safety.finished.is_set()


async def test_fairgate_health_names_the_metadata_db_when_it_is_unreachable(
    postgres_url: str, tmp_path: Path, clock: ManualClock
) -> None:
    """Issue 48: during a PostgreSQL outage ``fairgate health`` said "degraded" over a table
    with nothing wrong in it. The real ``/health`` of a gateway whose path to PostgreSQL is
    cut, rendered as the CLI renders it, names the metadata DB."""
    relay = TcpCut.for_url(postgres_url, 5432)
    env = {
        "FAIRGATE_DATABASE_URL": relay.url,
        "FAIRGATE_METADATA_POLL_MS": "50",
        "FAIRGATE_SECRET_KEY": SHARED_SECRET_KEY,
    }
    gw = Gateway(data_dir=tmp_path, config=parse_config(CONFIG, {}), env=env, clock=clock)
    app = create_app(gw)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
        ):
            assert degraded_parts((await c.get("/health")).json()) == []
            relay.cut()
            await eventually(lambda: gw.watcher is not None and not gw.watcher.healthy)
            health = (await c.get("/health")).json()
            console = Console(record=True, width=200)
            console.print(health_view(health))
            text = console.export_text()
        assert health["status"] == "degraded"
        assert "Gateway: degraded (metadata DB unreachable)" in text
        assert [p.split(":", 1)[0] for p in degraded_parts(health)] == ["metadata DB unreachable"]
    finally:
        relay.close()


async def test_a_snapshot_read_before_a_local_write_does_not_undo_it(
    gateways: Callable[..., asyncio.Future[list[Gateway]]],
) -> None:
    """The watcher's thread may read a snapshot, then this process writes and reloads, then the
    loop applies the older read: it must be dropped (it undid an admin PATCH until the next
    change: ``test_pool_crud`` saw an allocation it had just removed), and read again."""
    (a,) = await gateways(1, poll_ms=60_000)  # no poll of its own during the test
    assert a.watcher is not None
    stale = a._read_snapshot()  # read before the write, applied after it
    repo = PoolRepo(a.db)
    rec = repo.record("demo")
    repo.update(replace(rec, allocations=tuple(x for x in rec.allocations if x.key_id != "bob")))
    a.reload()
    assert a._apply_snapshot(stale) is False
    assert "bob" not in {x.key_id for x in a.registry.pools["demo"].allocations}  # type: ignore[union-attr]
    # the watcher does not count the stale read as seen: its next check reads and applies anew
    seen = a.watcher.seen
    assert await a.watcher.check() is True
    assert a.watcher.seen > seen
    assert "bob" not in {x.key_id for x in a.registry.pools["demo"].allocations}  # type: ignore[union-attr]
