"""The request path never waits on the metadata database (issue 48, item 5).

A real PostgreSQL that answers the change watcher's version read and then hangs on the tables a
rebuild reads (another session holds ``LOCK TABLE pools``): the rebuild ran on the event loop,
so one replica's requests froze for the connection's statement deadline (5.0 s seen). Now the
rebuild runs on the watcher's thread: requests go on being answered from the last snapshot
while it hangs (asserted as an order of events: answered while the rebuild is still waiting on
the lock, not as a duration), ``/health`` turns degraded once the rebuild overran its timeout,
and the snapshot is applied when the lock goes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
from inproc_support import MockUpstream, base_config, conn, gateway

from fairgate.timers import ManualTimer

SHARED_KEY = "dGVzdC1vbmx5LWtleS1mb3ItZmFpcmdhdGUtc3ViMTI="
POOL = {
    "id": "shared",
    "connections": ["m1"],
    "dimensions": [{"unit": "requests", "window": "daily", "limit": 1000}],
    "allocations": [{"key": "alice", "weight": 100}],
}
CONFIG = base_config([conn("m1")], pools=[POOL])


async def _until(condition: object, what: str, tries: int = 6000) -> None:
    """Yield to the loop until ``condition()`` holds (bounded: a hang fails the test)."""
    for _ in range(tries):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def test_requests_are_served_while_a_rebuild_hangs_on_postgres(
    tmp_path: Path, postgres_url: str
) -> None:
    env = {
        "FAIRGATE_DATABASE_URL": postgres_url,
        "FAIRGATE_SECRET_KEY": SHARED_KEY,
        "FAIRGATE_METADATA_POLL_MS": "20",
    }
    async with gateway(tmp_path, CONFIG, ManualTimer(), MockUpstream(), env=env) as h:
        watcher = h.gw.watcher
        assert watcher is not None
        watcher.rebuild_timeout_s = 0.2  # the DB counts as down soon after a rebuild hangs
        assert (await h.chat("m")).status_code == 200
        version = h.gw.registry.version
        locker = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
        writer = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
        try:
            await locker.execute("BEGIN")
            await locker.execute("LOCK TABLE pools IN ACCESS EXCLUSIVE MODE")
            # another replica's write elsewhere: the counter moves, the rebuild reads pools
            await writer.execute("UPDATE client_keys SET name = 'Alice B' WHERE id = 'alice'")
            await _until(lambda: watcher.rebuilding, "the rebuild started")

            codes = [(await h.chat("m")).status_code for _ in range(5)]
            assert codes == [200] * 5
            assert watcher.rebuilding  # still waiting on the lock: no request waited for it
            assert h.gw.registry.version == version  # served from the last snapshot

            await _until(lambda: not watcher.healthy, "the hung rebuild marked the DB down")
            health = (await h.client.get("/health")).json()
            assert (health["status"], health["metadata"]) == ("degraded", "down")
            assert (await h.chat("m")).status_code == 200
        finally:
            await locker.execute("ROLLBACK")
            await locker.close()
            await writer.close()
        await _until(lambda: watcher.healthy, "the rebuild ended and the DB is up again")
        await _until(lambda: h.gw.registry.version > version, "the new snapshot was applied")
        assert {k.name for k in h.gw.registry.keys_by_hash.values()} == {"Alice B", "Bob"}
        health = (await h.client.get("/health")).json()
        assert (health["status"], health["metadata"]) == ("ok", "ok")
