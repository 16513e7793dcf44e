"""The ``store`` fixture: every contract test runs once per driver on a real backend; the ``db``
fixture: every repository test runs once per metadata engine (a fresh SQLite file, a fresh
PostgreSQL schema)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from fairgate.db.base import Database
from fairgate.db.engine import open_database
from fairgate.store.base import QuotaStore
from fairgate.store.sqlite import SqliteQuotaStore


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
    s: QuotaStore
    if request.param == "sqlite":
        s = SqliteQuotaStore(tmp_path / "quota.sqlite")
    elif request.param == "sqlite-memory":
        s = SqliteQuotaStore(tmp_path / "quota.sqlite", mode="memory")
        assert s.mode == "memory"  # alone on its file: it owns it
    else:
        cluster = request.param == "redis-cluster"
        url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
        prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
        from fairgate.store.redis import RedisQuotaStore

        s = RedisQuotaStore(url, prefix=prefix)
        if cluster:
            await s.warm()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def db(metadata_url: str | None, tmp_path: Path) -> Iterator[Database]:
    conn = open_database(metadata_url, tmp_path / "fairgate.sqlite")
    yield conn
    conn.close()
