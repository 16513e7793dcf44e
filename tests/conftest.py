"""Shared fixtures: an injected clock, a real SQLite file, a real Redis with a unique prefix,
a real PostgreSQL with a database of the run and a schema per test."""

from __future__ import annotations

import os
import socket
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest

from fairgate.clock import ManualClock

#: 2023-11-14T23:00:00Z: an hour-aligned instant keeps worked examples readable.
T0 = 1_700_002_800_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def _redis_reachable(url: str) -> bool:
    u = urllib.parse.urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_test_url() -> str:
    return os.environ.get("FAIRGATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A reachable Redis URL. Under CI an unreachable Redis fails the test; locally it skips."""
    url = redis_test_url()
    if not _redis_reachable(url):
        msg = f"Redis is not reachable at {url} (set FAIRGATE_TEST_REDIS_URL or run `make test`)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; afterwards only keys under it are deleted."""
    import redis

    prefix = f"fgtest:{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(batch), 500):
            client.delete(*batch[i : i + 500])
    finally:
        client.close()


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_test_url() -> str:
    """The server's maintenance database (the run creates its own database beside it)."""
    return (
        os.environ.get("FAIRGATE_TEST_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/postgres"
    )


def _postgres_reachable(url: str) -> bool:
    u = urllib.parse.urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 5432), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def postgres_db_url() -> Iterator[str]:
    """A database created for this test run (dropped at the end, with everything in it).

    Under CI an unreachable PostgreSQL fails the test (``.ci/run`` starts one); locally it skips."""
    import psycopg

    admin_url = postgres_test_url()
    if not _postgres_reachable(admin_url):
        msg = f"PostgreSQL is not reachable at {admin_url} (set FAIRGATE_TEST_POSTGRES_URL)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    name = f"fgtest_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    u = urllib.parse.urlparse(admin_url)
    try:
        yield urllib.parse.urlunparse(u._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_db_url: str) -> Iterator[str]:
    """A URL whose connections work in a fresh schema of their own (``search_path``): each test
    starts from an empty metadata DB without paying for a database per test."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_db_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{postgres_db_url}?options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_db_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]
)
def metadata_url(request: pytest.FixtureRequest) -> str | None:
    """``None`` (SQLite in the test's data dir) or a PostgreSQL URL: a test that takes it runs
    on both metadata engines. The PostgreSQL fixtures are requested only for that param."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    return url
