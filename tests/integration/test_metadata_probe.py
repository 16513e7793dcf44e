"""An admin call to a PostgreSQL that has just hung does not hold the event loop (issue 48,
item 5).

A real PostgreSQL behind a loopback relay that stops forwarding (``TcpCut.freeze``: connections
stay open, nothing answers). The admin API's repositories use the synchronous connection on
the loop: the first statement after the hang, before the change watcher noticed, held the loop,
and every request of the replica, for the statement deadline (5.0 s seen). Now an admin call
first asks the server asynchronously (``MetadataProbe``): while it waits, the loop serves others
(asserted as an order of events: ``/health`` answers while the admin call is still pending),
then the call is a 503 and the connection refuses statements until the server answers again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from tcp_cut import TcpCut

from fairgate.config import parse_config
from fairgate.process.state import Gateway
from fairgate.server.app import create_app

ADMIN_KEY = "fg-admin-probe-key-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
SHARED_KEY = "dGVzdC1vbmx5LWtleS1mb3ItZmFpcmdhdGUtc3ViMTI="


async def test_an_admin_call_to_a_hung_server_leaves_the_loop_free(
    tmp_path: Path, postgres_url: str
) -> None:
    relay = TcpCut.for_url(postgres_url, 5432)
    env = {"FAIRGATE_DATABASE_URL": relay.url, "FAIRGATE_SECRET_KEY": SHARED_KEY}
    gw = Gateway(data_dir=tmp_path, config=parse_config({}, {}), env=env, admin_key=ADMIN_KEY)
    app = create_app(gw)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                key = {"id": "k1", "name": "K1"}
                assert (await client.post("/api/keys", json=key, headers=ADMIN)).status_code == 201
                relay.freeze()
                write = asyncio.create_task(
                    client.post("/api/keys", json={"id": "k2", "name": "K2"}, headers=ADMIN)
                )
                # the admin call is waiting on the server (it sent its statement: the probe's;
                # a statement on the loop's connection held the loop until its deadline, so the
                # call was over by the time this test ran again)
                for _ in range(4000):
                    if relay.held or write.done():
                        break
                    await asyncio.sleep(0.001)
                assert relay.held
                health = await client.get("/health")
                assert health.status_code == 200
                assert not write.done()  # the loop served /health while the call waited
                r = await write
                assert r.status_code == 503, r.text
                assert "unreachable" in r.json()["error"]["message"]
                relay.thaw()
                # back: the watcher reads from the server again and writes go through
                for _ in range(4000):
                    if gw.watcher is not None and gw.watcher.healthy and gw.db.reachable:  # type: ignore[attr-defined]
                        r = await client.post("/api/keys", json={"id": "k3"}, headers=ADMIN)
                        if r.status_code == 201:
                            break
                    await asyncio.sleep(0.01)
                assert r.status_code == 201, r.text
    finally:
        relay.close()
