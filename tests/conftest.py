"""Shared fixtures: an injected clock, a real SQLite file, a real Redis with a unique prefix."""

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
