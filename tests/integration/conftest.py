"""The ``store`` fixture: every contract test runs once per driver on a real backend; the ``db``
fixture: every repository test runs once per metadata engine (a fresh SQLite file, a fresh
PostgreSQL schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from fairgate.db.base import Database
from fairgate.db.engine import open_database
from fairgate.quota.ports import QuotaStore
from fairgate.store.sqlite.store import SqliteQuotaStore


@pytest_asyncio.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("sqlite-memory", id="sqlite-memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QuotaStore]:
    """An open store on a fresh SQLite file (transactional, and in memory mode: the same
    contract, decisions included), or a unique prefix on Redis or on a real 3-master Redis
    Cluster (``redis+cluster://``, prepared as the gateway prepares it: discovered and its
    connections opened before the test's traffic).

    The Redis fixtures are requested only for their params, so SQLite runs never need a server.
    """
    s = await _open_store(request.param, request, tmp_path / "quota.sqlite")
    if request.param == "sqlite-memory":
        assert isinstance(s, SqliteQuotaStore)
        assert s.mode == "memory"  # alone on its file: it owns it
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def open_replica(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[], Awaitable[QuotaStore]]:
    """Opens another replica on the ``store`` fixture's backend: another gateway process (a
    transactional store on the same SQLite file, or another client of the same Redis or Redis
    Cluster under the same prefix). The test closes it."""
    kind: str = request.node.callspec.params["store"]
    replica_kind = "sqlite" if kind.startswith("sqlite") else kind

    async def open_() -> QuotaStore:
        return await _open_store(replica_kind, request, tmp_path / "quota.sqlite")

    return open_


async def _open_store(kind: str, request: pytest.FixtureRequest, path: Path) -> QuotaStore:
    """A store of one ``store`` param; the Redis fixtures are requested only here, so SQLite
    runs never need a server. A cluster client is prepared as the gateway prepares it
    (discovered and its connections opened before traffic)."""
    if kind == "sqlite":
        return SqliteQuotaStore(path, mode="transactional")
    if kind == "sqlite-memory":
        return SqliteQuotaStore(path, mode="memory")
    cluster = kind == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
    from fairgate.store.redis.store import RedisQuotaStore

    s = RedisQuotaStore(url, prefix=prefix)
    if cluster:
        await s.warm()
    return s


@pytest.fixture
def db(metadata_url: str | None, tmp_path: Path) -> Iterator[Database]:
    conn = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    yield conn
    conn.close()
