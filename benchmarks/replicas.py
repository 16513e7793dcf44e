"""Many processes, one gateway: how fast a metadata change reaches another gateway, and what
``serve --workers N`` admits per second. Prints figures; asserts nothing.

- propagation delay (p50 / p95 / max over ``--writes`` writes): gateway A writes a registry table,
  the clock runs until gateway B has rebuilt its snapshot. Both gateways run in this process
  (a precise clock for both ends), each with its own connection and watcher, exactly as two
  replicas would: PostgreSQL (LISTEN/NOTIFY, poll 1 s as the safety net) and SQLite shared by
  workers (poll every 250 ms, so expect about half of that on average).
- admission throughput with 1, 2 and 4 workers: ``fairgate serve --workers N`` (SQLite quota and
  metadata files shared by the workers) in front of the mock upstream, ``--requests`` chat
  completions from 64 concurrent clients; requests per second and p50 latency.

Run: ``python benchmarks/replicas.py [--quick]``. PostgreSQL at ``FAIRGATE_TEST_POSTGRES_URL``
(else postgres@127.0.0.1:5432): a database is created for the run and dropped afterwards.
Absolute numbers are this machine's (2 shared cores: the load generator, the mock and the
workers compete for them); compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx
import psycopg

from fairgate.config import parse_config
from fairgate.db.settings import SettingsRepo
from fairgate.process.state import Gateway
from proxy_overhead import (
    ADMIN,
    CLIENT_KEY,
    bench_config,
    free_port,
    load,
    pct,
    post_json,
    stop,
    wait_http,
)

CONFIG = {
    "connections": [
        {"id": "m1", "provider": "mock", "base_url": "http://127.0.0.1:9/v1", "models": ["*"]}
    ]
}


# -- propagation ------------------------------------------------------------------------------


async def propagation(url: str | None, writes: int, tmp: Path) -> list[float]:
    """Milliseconds from A's commit to B's rebuilt snapshot, per write."""
    env = {"FAIRGATE_DATABASE_URL": url} if url else {}
    gws = []
    for name in ("a", "b"):
        data = tmp / (name if url else "shared")
        gw = Gateway(data_dir=data, config=parse_config(CONFIG, {}), env=env)
        await gw.start()
        gws.append(gw)
    a, b = gws
    assert b.watcher is not None
    try:
        while url and not b.watcher.listening:  # noqa: ASYNC110 (a flag, no event to await)
            await asyncio.sleep(0.01)
        delays = []
        for i in range(writes):
            before = b.watcher.reloads
            SettingsRepo(a.db).set("bench.tick", str(i))
            t0 = time.perf_counter()
            while b.watcher.reloads == before:  # noqa: ASYNC110 (the poll is the measurement)
                await asyncio.sleep(0.0005)
            delays.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.05 + (i % 7) * 0.013)  # writes land at varied poll phases
        return delays
    finally:
        for gw in gws:
            await gw.stop()


def postgres_database() -> tuple[str, str]:
    """(admin URL, URL of a database made for this run)."""
    default = "postgresql://postgres@127.0.0.1/postgres"
    admin = os.environ.get("FAIRGATE_TEST_POSTGRES_URL") or default
    name = f"fgbench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    u = urllib.parse.urlparse(admin)
    return admin, urllib.parse.urlunparse(u._replace(path=f"/{name}"))


def drop_database(admin: str, url: str) -> None:
    name = urllib.parse.urlparse(url).path.lstrip("/")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def summary(xs: list[float]) -> str:
    s = sorted(xs)
    return (
        f"p50 {statistics.median(s):7.1f} ms   p95 {pct(s, 0.95):7.1f} ms   "
        f"max {s[-1]:7.1f} ms   (n={len(s)})"
    )


# -- throughput -------------------------------------------------------------------------------


async def pids(url: str, n: int = 24) -> set[int]:
    out = set()
    for _ in range(n):
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            out.add(int((await c.get("/health")).json()["pid"]))
    return out


def spawn(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)


async def throughput(mock: str, workers: int, requests: int, tmp: Path) -> tuple[float, float]:
    port = free_port()
    cfg = tmp / f"w{workers}.yaml"
    cfg.write_text(bench_config(mock))
    cmd = [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg), "--port", str(port)]
    cmd += ["--data-dir", str(tmp / f"w{workers}-data"), "--workers", str(workers)]
    # the per-key rate guard off, as in proxy_overhead.py: one bench key sends everything
    proc = spawn(cmd, {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN, "FAIRGATE_KEY_RATE_PER_S": "0"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=180)
        deadline = time.monotonic() + 180
        while len(await pids(url)) < workers and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        rps, lat = await load(url, requests, 64, False, CLIENT_KEY)
        return rps, statistics.median(lat)
    finally:
        stop([proc])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer writes and requests")
    parser.add_argument("--writes", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None)
    args = parser.parse_args()
    writes = args.writes or (15 if args.quick else 60)
    requests = args.requests or (1000 if args.quick else 4000)
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-bench-replicas-"))

    print("propagation delay: a write on gateway A until gateway B rebuilt its snapshot")
    admin, url = postgres_database()
    try:
        print(f"  PostgreSQL (NOTIFY)  {summary(await propagation(url, writes, tmp / 'pg'))}")
    finally:
        drop_database(admin, url)
    print(f"  SQLite (poll 250 ms) {summary(await propagation(None, writes, tmp / 'sq'))}")

    mport = free_port()
    mock = f"http://127.0.0.1:{mport}"
    mock_proc = spawn([sys.executable, "-m", "fairgate", "mock-upstream", "--port", str(mport)])
    try:
        wait_http(mock + "/_mock/stats")
        post_json(mock + "/_mock/config", {"requests_limit": 10**12, "tokens_limit": 10**15})
        print(f"admission throughput: {requests} chat completions, 64 concurrent clients")
        for workers in (1, 2, 4):
            rps, p50 = await throughput(mock, workers, requests, tmp)
            print(f"  --workers {workers}: {rps:7.0f} req/s   p50 {p50:6.1f} ms")
    finally:
        stop([mock_proc])


if __name__ == "__main__":
    asyncio.run(main())
