"""Shared fixtures: an injected clock, a real SQLite file, a real Redis with a unique prefix,
a real PostgreSQL with a database of the run and a schema per test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from fairgate.clock import ManualClock

# Hypothesis' default 200 ms deadline per example and its "too slow" health check measure the
# host, not the code: on a busy 2-core machine an example that takes 20 ms quiet takes 300 ms and
# the property test fails with DeadlineExceeded/Flaky. Properties are about results; speed has its
# benchmarks. One profile for the whole suite (a test's own @settings still refines it).
settings.register_profile("fairgate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fairgate")

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


def _unavailable(msg: str) -> None:
    """A service the test needs is not there: under CI (which starts them all) the test fails,
    locally it skips."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def redis_test_url() -> str:
    return os.environ.get("FAIRGATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A reachable Redis URL. Under CI an unreachable Redis fails the test; locally it skips."""
    url = redis_test_url()
    if not _redis_reachable(url):
        _unavailable(
            f"Redis is not reachable at {url} (set FAIRGATE_TEST_REDIS_URL or run `make test`)"
        )
    return url


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; afterwards only keys under it are deleted."""
    import redis

    prefix = f"fgtest:{uuid.uuid4().hex[:12]}"
    yield prefix
    with redis.Redis.from_url(redis_url) as client:  # closed on leaving
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])


# -- Redis Cluster ------------------------------------------------------------------------------

#: Masters of the test cluster (the smallest cluster ``redis-cli --cluster create`` accepts).
CLUSTER_MASTERS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"CLUSTER INFO\r\n")
            return b"cluster_state:ok" in s.recv(4096)
    except OSError:
        return False


def _wait(what: str, check: Callable[[], bool], seconds: float = 60.0) -> None:
    """Poll ``check()`` until it is true; the limit only ends a hopeless wait (no assertion on
    how long it took)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis cluster: {what} not ready after {seconds:.0f} s")
        time.sleep(0.05)


def _start_cluster(workdir: Path, procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Three ``redis-server --cluster-enabled yes`` on free loopback ports, joined by
    ``redis-cli --cluster create`` with no replicas, in ``workdir``; each process is added to
    ``procs`` as soon as it starts (the caller stops them, whatever happens here). The cluster
    bus port is chosen free too (by default it is port + 10000, which may be taken or beyond
    65535)."""
    ports: list[int] = []
    for _ in range(CLUSTER_MASTERS):
        port, bus = _free_port(), _free_port()
        node_dir = workdir / str(port)
        node_dir.mkdir()
        procs.append(
            subprocess.Popen(
                [
                    "redis-server",
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes",
                    "--cluster-port", str(bus),
                    "--cluster-config-file", str(node_dir / "nodes.conf"),
                    "--dir", str(node_dir),
                    "--save", "",
                    "--appendonly", "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        ports.append(port)
    for port in ports:
        _wait(f"node {port}", lambda p=port: _redis_reachable(f"redis://127.0.0.1:{p}"))
    subprocess.run(
        [
            "redis-cli",
            "--cluster",
            "create",
            *(f"127.0.0.1:{p}" for p in ports),
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for port in ports:
        _wait(f"cluster_state on {port}", lambda p=port: _cluster_ok(p))
    return ports


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A ``redis+cluster://`` URL of a real 3-master Redis Cluster started for this run on free
    loopback ports (``FAIRGATE_TEST_REDIS_CLUSTER_URL`` names an existing one instead), torn
    down at the end. Under CI a missing ``redis-server`` fails the test; locally it skips."""
    given = os.environ.get("FAIRGATE_TEST_REDIS_CLUSTER_URL")
    if given:
        yield given
        return
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        _unavailable("redis-server/redis-cli are not installed: no Redis Cluster can be started")
    with tempfile.TemporaryDirectory(prefix="fg-redis-cluster-") as tmp:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ports = _start_cluster(Path(tmp), procs)
            yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def redis_cluster_prefix(redis_cluster_url: str) -> Iterator[str]:
    """A unique key prefix on the cluster; afterwards only keys under it are deleted (each
    master scanned on its own: a SCAN sees one node's keys)."""
    import redis

    prefix = f"fgtest:{uuid.uuid4().hex[:12]}"
    yield prefix
    parts = urllib.parse.urlsplit(redis_cluster_url)
    for node in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = node.partition(":")
        client = redis.Redis(host=host, port=int(port or 6379))
        try:
            for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
                client.delete(key)  # one key per DEL: keys of a node may sit in many slots
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
        _unavailable(f"PostgreSQL is not reachable at {admin_url} (set FAIRGATE_TEST_POSTGRES_URL)")
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
