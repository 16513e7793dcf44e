"""PostgreSQL stopped under load: two replicas on a PostgreSQL of the test's own (the machine's
shared server is never stopped) and the suite's Redis, clients sending steadily to both.

While the metadata DB is down the replicas serve from their last registry snapshot (the request
path never reads it), admin writes answer 503 with a clear message, ``/health`` says
``metadata: down``; once it is back they converge, and nothing written before the outage is
lost. Deadlines only end a hopeless wait on a busy host; nothing asserts how long a step took.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN, Load, report
from private_postgres import PrivatePostgres, unavailable_reason
from replica_support import KEYS, pools

DEADLINE_S = 30.0


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    end = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < end, "not reached in time"
        await asyncio.sleep(0.05)


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running PostgreSQL of this test only (fails under CI when none can be started)."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.close()


async def _health(url: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.get("/health")
        assert r.status_code == 200, r.text  # degraded, never unhealthy: the LB keeps it
        body: dict[str, object] = r.json()
        return body


async def _key_works(url: str, secret: str) -> bool:
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
        return r.status_code == 200


async def _create_key(url: str, key_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=ADMIN, timeout=30) as c:
        return await c.post("/api/keys", json={"id": key_id, "name": key_id})


@pytest.mark.slow
@pytest.mark.redis
async def test_postgres_stopped_or_hung_under_load_serves_refuses_writes_and_converges(
    private_postgres: PrivatePostgres,
    mock_upstream: Proc,
    start_gateway: GatewayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two outages in a row: PostgreSQL stopped (connections cut, new ones refused), then hung
    (every server process stopped with SIGSTOP: connections accepted, nothing answers). In both
    the replicas keep serving, say ``metadata: down``, refuse admin writes with 503 (at once:
    an admin call must not hold the event loop on a server that does not answer, else the
    clients' requests would wait with it), and converge when it is back."""
    pg = private_postgres
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(
        mock_upstream.url, pools("{unit: requests, window: monthly, limit: 100000}"), keys
    )
    env = {"FAIRGATE_DATABASE_URL": pg.url, "FAIRGATE_METADATA_POLL_MS": "200"}
    a, b = (start_gateway(config, driver="redis", extra_env=env) for _ in range(2))

    # written before the outage, through A, and seen by B
    r = await _create_key(a.url, "before")
    assert r.status_code == 201, r.text
    before = r.json()["secret"]
    await eventually(lambda: _key_works(b.url, before))

    async def metadata_everywhere(state: str) -> bool:
        return [(await _health(g.url))["metadata"] for g in (a, b)] == [state, state]

    # at most 4 requests in flight with a pause after each: under 16 a second, well within the
    # mock account's 1,500 a minute (flat out, its headers soon say "0 remaining" and the
    # gateway rightly locks the model out until the reset, and nothing is served)
    loads = [Load(g.url, keys["k1"], workers=2, pause_s=0.25) for g in (a, b)]
    for load in loads:
        load.start()
    refused: dict[str, list[httpx.Response]] = {}
    early: dict[str, httpx.Response] = {}
    outage_health: dict[str, dict[str, object]] = {}
    written: list[str] = []
    try:
        await eventually(lambda: _served(loads, 10))
        for kind, (down, up) in {
            "stopped": (pg.stop, pg.start),
            "hung": (pg.freeze, pg.thaw),
        }.items():
            down()
            for load in loads:
                load.phase = kind
            # an admin write at once, before the watcher can have noticed: refused, not held
            # (on a hung server the statement is cut after its deadline; it used to wait for
            # the server to come back, holding A's event loop and every request on it)
            early[kind] = await _create_key(a.url, f"{kind}-early")
            await eventually(lambda: metadata_everywhere("down"))
            outage_health[kind] = await _health(a.url)
            refused[kind] = [await _create_key(g.url, f"{kind}-{i}") for i, g in enumerate((a, b))]
            await eventually(lambda k=kind: _served(loads, 10, phase=k))  # served while it is down

            up()
            for load in loads:
                load.phase = f"after {kind}"
            await eventually(lambda: metadata_everywhere("ok"))
            # a write after the recovery, through B, reaches A
            r = await _create_key(b.url, f"after-{kind}")
            assert r.status_code == 201, r.text
            written.append(f"after-{kind}")
            secret = r.json()["secret"]
            await eventually(lambda s=secret: _key_works(a.url, s))
            await eventually(lambda k=kind: _served(loads, 5, phase=f"after {k}"))
    finally:
        for load in loads:
            await load.stop()

    statuses: dict[int, int] = {}
    for load in loads:
        for status, n in load.statuses().items():
            statuses[status] = statuses.get(status, 0) + n
    versions = {(await _health(g.url))["metadataVersion"] for g in (a, b)}
    report(
        capsys,
        "2 replicas, PostgreSQL stopped, started, hung, resumed under load (4 clients)",
        {
            "answers by status": statuses,
            "answers while stopped / hung": [
                sum(ld.count(k) for ld in loads) for k in ("stopped", "hung")
            ],
            "client latency p50 / max, s, while hung": _latency(loads, "hung"),
            "client transport errors": sum(len(ld.errors) for ld in loads),
            "admin writes while down": {k: [x.status_code for x in v] for k, v in refused.items()},
            "admin write at the outage's start": {k: v.status_code for k, v in early.items()},
            "metadataVersion after recovery (A, B)": sorted(versions),
        },
    )
    assert statuses == {200: statuses.get(200, 0)}  # 0 failed client requests
    assert not any(ld.errors for ld in loads)
    for kind, answers in refused.items():
        assert outage_health[kind]["metadata"] == "down"
        assert outage_health[kind]["status"] == "degraded"
        for resp in answers:
            assert resp.status_code == 503
            assert resp.headers.get("retry-after") == "5"
            message = resp.json()["error"]["message"]
            assert "metadata database is unreachable" in message
            assert "nothing was changed" in message
    for kind, resp in early.items():
        assert resp.status_code == 503, (kind, resp.text)
        assert "metadata database is unreachable" in resp.json()["error"]["message"]
    assert set(early) == {"stopped", "hung"}
    assert len(versions) == 1  # both replicas rebuilt from the same counter
    # nothing written before an outage was lost; nothing refused during one was written
    for g in (a, b):
        assert await _key_works(g.url, before)
        async with httpx.AsyncClient(base_url=g.url, headers=ADMIN, timeout=10) as c:
            ids = {k["id"] for k in (await c.get("/api/keys")).json()}
        assert {"before", *written} <= ids
        assert not any(i.startswith(("stopped-", "hung-")) for i in ids)


def _latency(loads: list[Load], phase: str) -> list[float]:
    values = sorted(a.latency_s for ld in loads for a in ld.answers if a.phase == phase)
    if not values:
        return []
    return [round(values[len(values) // 2], 3), round(values[-1], 3)]


async def _served(loads: list[Load], n: int, phase: str | None = None) -> bool:
    """Every load has had ``n`` answers (in ``phase``) since it started."""
    return all(ld.ok(phase) >= n for ld in loads)


@pytest.mark.slow
def test_a_statement_to_a_hung_server_gives_up_at_its_deadline(
    private_postgres: PrivatePostgres,
) -> None:
    """The connection used on the event loop (``statement_deadline_s``): a statement to a frozen
    server fails as unreachable instead of waiting for it, later ones are refused at once, and
    once the server answers again (the watcher sets ``reachable``) the next statement reconnects."""
    from fairgate.db.common import MetadataUnavailable
    from fairgate.db.postgres import PgDatabase

    pg = private_postgres
    db = PgDatabase.connect(pg.url, statement_deadline_s=0.5)
    try:
        assert db.execute("SELECT 1").fetchone()[0] == 1
        pg.freeze()
        try:
            with pytest.raises(MetadataUnavailable, match=r"did not answer within 0\.5 s"):
                db.execute("SELECT 2")
            assert not db.reachable
            with pytest.raises(MetadataUnavailable, match="does not answer the change watcher"):
                db.execute("SELECT 3")
        finally:
            pg.thaw()
        db.set_reachable(True)
        assert db.execute("SELECT 4").fetchone()[0] == 4
    finally:
        db.close()
