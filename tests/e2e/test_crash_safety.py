"""Crash safety on the SQLite driver: ``kill -9`` a gateway under load, restart it on the same
data directory.

Promises: the counters hold every request the clients got a 200 for (a settled one by its
usage, one killed between its answer and its settle by its reservation); both SQLite files pass
``PRAGMA integrity_check``; and the reservations of the dead process expire with their lease
(the default 10 minutes: the test moves the test clock past it instead of waiting), after which
the counters hold exactly what was settled.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from e2e_support import TEST_CLOCK, GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN, Load, report, wait_for

from fairgate.store.sqlite.owner import shared_connection

#: the default reservation lease (quota.leaseMs)
LEASE_MS = 10 * 60_000
WORKERS = 8
POOLS = (
    "pools:\n"
    "  - id: crash\n"
    "    name: Crash\n"
    "    connections: [mock-1, mock-2]\n"
    "    dimensions: [{unit: requests, window: monthly, limit: 100000}]\n"
    "    allocations:\n"
    "      - {key: a, weight: 100, policy: hard}\n"
)
COUNTER = "requests/monthly"


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _quota_db(data_dir: Path) -> tuple[float, int]:
    """(everything ever settled for the pool, reservations still held), read from the file
    as one more process on it: a gateway that owns the file in memory mode (the default)
    commits and hands over first, so this reads the current state, not its last commit."""
    with shared_connection(data_dir / "quota.sqlite") as conn:
        row = conn.execute(
            "SELECT value FROM quota_cumulative WHERE pool_id = 'crash' AND counter = ?",
            (COUNTER,),
        ).fetchone()
        held = conn.execute(
            "SELECT count(*) FROM quota_reservation WHERE pool_id = 'crash'"
        ).fetchone()
        return (float(row[0]) if row else 0.0), int(held[0])


async def _pool_total(api: httpx.AsyncClient) -> float:
    (dim,) = (await api.get("/api/quota/pools/crash/usage", headers=ADMIN)).json()["dimensions"]
    return float(dim["total"])


@pytest.mark.slow
async def test_kill_9_under_load_keeps_counters_db_intact_and_leases_expire(
    mock_upstream: Proc, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = {"a": new_secret()}
    config = gateway_config(mock_upstream.url, POOLS, keys)
    gw = start_gateway(config, driver="sqlite")
    data_dir = gw.data_dir
    assert data_dir is not None
    # 200 ms upstream latency: with 8 clients, several requests are always in flight
    load = Load(gw.url, keys["a"], workers=WORKERS, extra_headers={"x-mock-fault": "latency:200"})
    load.start()
    await wait_for(lambda: _ok_at_least(load, 60), 30)

    gw.proc.kill()  # kill -9: no shutdown hook, no release of reservations
    gw.proc.wait(5)
    killed = time.monotonic()
    load.halt()
    await load.stop()
    ok = load.ok()
    statuses = load.statuses()

    integrity = {name: _integrity(data_dir / name) for name in ("fairgate.sqlite", "quota.sqlite")}
    settled_at_kill, held_at_kill = _quota_db(data_dir)

    again = start_gateway(config, driver="sqlite", data_dir=data_dir)
    restart_s = time.monotonic() - killed
    async with httpx.AsyncClient(base_url=again.url, timeout=10) as api:
        before_lease = await _pool_total(api)

        # after the lease, the next admission of the pool reclaims the dead process's
        # reservations (this request is itself settled)
        TEST_CLOCK.advance(LEASE_MS + 2_000, again, mock_upstream)

        async def reclaimed() -> bool:
            r = await api.post(
                "/v1/chat/completions",
                json={"model": "mock/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
                headers={"Authorization": f"Bearer {keys['a']}"},
            )
            assert r.status_code == 200
            await asyncio.sleep(0.1)  # its settle runs after the answer
            return _quota_db(data_dir)[1] == 0

        await wait_for(reclaimed, 10, interval=0.3)
        await wait_for(lambda: _inflight_zero(api), 10)
        after_lease = await _pool_total(api)
    settled, held = _quota_db(data_dir)
    assert again.proc.poll() is None

    report(
        capsys,
        "kill -9 of a SQLite gateway under load, restart on the same data dir",
        {
            "client answers before the kill": statuses,
            "requests cut by the kill (client errors)": len(load.errors),
            "integrity_check": integrity,
            "settled / reservations held in the file at the kill": (settled_at_kill, held_at_kill),
            "restart took": f"{restart_s:.2f} s",
            "pool usage after restart (within the lease)": before_lease,
            "pool usage after the lease (reservations reclaimed)": after_lease,
            "settled in total (incl. the probe requests after restart)": settled,
        },
    )
    assert statuses == {200: ok}
    assert integrity == {"fairgate.sqlite": "ok", "quota.sqlite": "ok"}
    # within the lease the counters hold every 200 the clients received, and at most the
    # requests in flight at the kill more (reserved, never answered)
    assert ok <= before_lease <= ok + WORKERS
    assert before_lease == pytest.approx(settled_at_kill + held_at_kill)
    # a request answered but killed before its settle is only its reservation: at most one per
    # client connection
    assert ok - WORKERS <= settled_at_kill <= ok
    # after the lease the reservations are gone and the counters are exactly the settled usage
    assert held == 0
    assert after_lease == pytest.approx(settled)


async def _ok_at_least(load: Load, n: int) -> bool:
    return load.ok() >= n


async def _inflight_zero(api: httpx.AsyncClient) -> bool:
    return bool((await api.get("/health")).json()["inflight"] == 0)
