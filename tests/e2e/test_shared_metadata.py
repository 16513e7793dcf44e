"""Many processes, one gateway: three replicas on PostgreSQL + Redis, and ``serve --workers 2`` on
one SQLite data directory. A change made through one process's admin API is enforced by all of
them without a restart, and limits stay exact across the workers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import httpx
import pytest
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN, report
from replica_support import KEYS, pools, storm

#: A deadline for a busy machine, not a speed claim (benchmarks/replicas.py measures it).
DEADLINE_S = 20.0
BODY = {
    "model": "mock/gpt-4o-mini",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    end = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < end, "the change did not propagate in time"
        await asyncio.sleep(0.05)


async def healths(url: str, n: int = 24) -> list[dict[str, object]]:
    """``/health`` over ``n`` fresh connections: with several workers, the kernel hands them to
    different processes, so every worker answers some of them."""
    out = []
    for _ in range(n):
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            out.append((await c.get("/health")).json())
    return out


async def both_workers_up(url: str) -> None:
    """Wait until both workers of a ``--workers 2`` gateway answer ``/health``."""

    async def up() -> bool:
        try:
            return len({h["pid"] for h in await healths(url)}) == 2
        except httpx.TransportError:  # a worker still starting may reset a connection it took
            return False

    await eventually(up)


async def chat(url: str, secret: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        r = await c.post(
            "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"}
        )
        return r.status_code


async def models(url: str, secret: str) -> int:
    """``GET /v1/models`` with the key: 200 once the process knows it, 401 before."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        r = await c.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
        return r.status_code


def _one_pool(keys: dict[str, str]) -> str:
    del keys
    return pools("{unit: requests, window: monthly, limit: 100}")


@pytest.mark.slow
@pytest.mark.redis
async def test_three_replicas_on_postgres_follow_one_admin_write(
    mock_upstream: Proc, start_gateway: GatewayFactory, postgres_url: str
) -> None:
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock_upstream.url, _one_pool(keys), keys)
    env = {"FAIRGATE_DATABASE_URL": postgres_url}
    a, b, c = (start_gateway(config, driver="redis", extra_env=env) for _ in range(3))
    k1 = keys["k1"]

    # admitted under the old allocations, on every replica
    assert [await chat(g.url, k1) for g in (a, b, c)] == [200, 200, 200]

    # A caps k1 at the 3 requests it already made: B and C must refuse its next one
    allocations = [
        {"key": k, "weight": 25, "policy": "burst"}
        | ({"capValue": 3, "capUnit": "requests"} if k == "k1" else {})
        for k in KEYS
    ]
    async with httpx.AsyncClient(base_url=a.url, headers=ADMIN, timeout=10) as admin:
        r = await admin.patch("/api/quota/pools/shared", json={"allocations": allocations})
        assert r.status_code == 200, r.text

        async def refused_everywhere() -> bool:
            return [await chat(g.url, k1) for g in (b, c)] == [429, 429]

        await eventually(refused_everywhere)
        assert await chat(a.url, keys["k2"]) == 200  # the others are untouched

    # every replica's /log shows the same admissions (one shared log in Redis)
    logs: list[list[dict[str, object]]] = []

    async def same_log_everywhere() -> bool:
        logs.clear()
        for g in (a, b, c):
            async with httpx.AsyncClient(base_url=g.url, headers=ADMIN, timeout=10) as cl:
                r = await cl.get("/api/quota/pools/shared/log", params={"limit": 500})
                logs.append(r.json()["events"])
        return logs[0] == logs[1] == logs[2]

    await eventually(same_log_everywhere)
    outcomes = Counter((e["keyId"], e["outcome"]) for e in logs[0])
    assert outcomes[("k1", "allow")] == 3  # the three admitted before the cap
    assert outcomes[("k1", "block")] >= 2  # refused on B and C
    assert outcomes[("k2", "allow")] == 1

    async with httpx.AsyncClient(base_url=b.url, headers=ADMIN, timeout=10) as admin_b:
        # a key created on B works on C
        r = await admin_b.post("/api/keys", json={"id": "late", "name": "Late"})
        created = r.json()
        assert r.status_code == 201, r.text

        async def works_on_c() -> bool:
            return await models(c.url, created["secret"]) == 200

        await eventually(works_on_c)

        # a pool deleted on B stops being enforced everywhere: k1 is served again
        assert (await admin_b.delete("/api/quota/pools/shared")).status_code == 204

        async def served_everywhere() -> bool:
            return [await chat(g.url, k1) for g in (a, c)] == [200, 200]

        await eventually(served_everywhere)

    seen = [h for g in (a, b, c) for h in await healths(g.url, n=2)]
    assert len({h["metadataVersion"] for h in seen}) == 1  # one change counter everywhere
    assert {h["metadata"] for h in seen} == {"ok"}


async def start_two_workers(
    start_gateway: GatewayFactory, config_yaml: str, extra_env: dict[str, str] | None = None
) -> Proc:
    """``serve --workers 2`` of ``config_yaml`` on one data dir, once both workers answer."""
    gw = start_gateway(config_yaml, extra_args=("--workers", "2"), extra_env=extra_env)
    await both_workers_up(gw.url)
    return gw


async def two_workers(mock: Proc, start_gateway: GatewayFactory) -> tuple[Proc, dict[str, str]]:
    """Two workers whose keys share one pool."""
    keys = {k: new_secret() for k in KEYS}
    return await start_two_workers(
        start_gateway, gateway_config(mock.url, _one_pool(keys), keys)
    ), keys


@pytest.mark.slow
async def test_two_workers_share_the_port_and_follow_each_others_writes(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    gw, _ = await two_workers(mock_upstream, start_gateway)
    before = max(int(h["metadataVersion"]) for h in await healths(gw.url))  # type: ignore[call-overload]

    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=10) as admin:
        r = await admin.post("/api/keys", json={"id": "late", "name": "Late"})
        assert r.status_code == 201, r.text
        secret = r.json()["secret"]

    async def both_workers_moved_on() -> bool:
        hs = await healths(gw.url)
        pids = {h["pid"] for h in hs}
        return len(pids) == 2 and all(int(h["metadataVersion"]) > before for h in hs)  # type: ignore[call-overload]

    await eventually(both_workers_moved_on)
    # the key is known on every connection, whichever worker takes it
    assert [await models(gw.url, secret) for _ in range(16)] == [200] * 16


@pytest.mark.slow
async def test_two_workers_400_clients_request_limit_100_admit_exactly_100(
    mock_upstream: Proc, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    gw, keys = await two_workers(mock_upstream, start_gateway)
    results = await storm([gw], keys, BODY)

    async def settled() -> bool:
        return all(h["inflight"] == 0 for h in await healths(gw.url))

    await eventually(settled)
    async with httpx.AsyncClient(base_url=gw.url, headers=ADMIN, timeout=10) as admin:
        usage = (await admin.get("/api/quota/pools/shared/usage")).json()
    statuses = Counter(r.status for r in results)
    (dim,) = usage["dimensions"]
    report(
        capsys,
        "serve --workers 2 on one SQLite quota file, 400 concurrent clients, limit 100",
        {"answers by status": dict(statuses), "pool usage": dim["total"]},
    )
    assert statuses == {200: 100, 429: 300}
    assert dim["total"] == pytest.approx(100)
