"""The replica storms shared by the replica and stress tests: N gateway processes on one Redis,
a few hundred clients released at the same instant, and the pool usage once all have settled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN

REPLICAS = 4
CLIENTS = 400
KEYS = ("k1", "k2", "k3", "k4")


@dataclass
class Result:
    status: int
    retry_after: str | None
    reason: str | None
    tokens: int  # what the upstream reported (prompt + completion) for a 200
    limit: str | None = None  # x-ratelimit-limit-requests
    quota: str | None = None  # x-fairgate-quota ("unavailable" when the store was not read)


def pools(dimension: str) -> str:
    """One pool over both mock connections (whichever a request is routed to, it is governed);
    burst keys: only the pool's ceiling refuses, so the sum over keys is what is measured."""
    allocations = "".join(f"      - {{key: {k}, weight: 25, policy: burst}}\n" for k in KEYS)
    return (
        "pools:\n"
        "  - id: shared\n"
        "    name: Shared\n"
        "    connections: [mock-1, mock-2]\n"
        f"    dimensions: [{dimension}]\n"
        f"    allocations:\n{allocations}"
    )


def replicas(
    start: GatewayFactory,
    mock: Proc,
    pools: str,
    *,
    default_max_tokens: int | None = None,
    extra_env: dict[str, str] | None = None,
    own_redis: bool = False,
) -> tuple[list[Proc], dict[str, str]]:
    """REPLICAS gateways on one Redis: the suite's (own prefix), or with ``own_redis`` the one
    ``extra_env`` names (``QUOTA_STORE_REDIS_URL``, say a throwaway server)."""
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock.url, pools, keys)
    if default_max_tokens is not None:
        config = config.replace(
            "server: {default_provider: mock}",
            f"server: {{default_provider: mock, default_max_tokens: {default_max_tokens}}}",
        )
    env = dict(extra_env or {})
    if own_redis:
        env["QUOTA_STORE_DRIVER"] = "redis"
        return [start(config, extra_env=env) for _ in range(REPLICAS)], keys
    # the same Redis and prefix for all four (the start_gateway fixture gives them one prefix)
    return [start(config, driver="redis", extra_env=env) for _ in range(REPLICAS)], keys


async def storm(
    gws: list[Proc], keys: dict[str, str], body: dict[str, object], clients: int = CLIENTS
) -> list[Result]:
    """``clients`` requests released at the same instant, spread evenly over replicas and keys."""
    go = asyncio.Event()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    conns = [httpx.AsyncClient(base_url=g.url, timeout=120, limits=limits) for g in gws]

    async def one(i: int) -> Result:
        await go.wait()
        secret = keys[KEYS[i % len(KEYS)]]
        r = await conns[i % len(conns)].post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
        )
        if r.status_code == 200:
            u = r.json()["usage"]
            err = {}
            tokens = int(u["prompt_tokens"] + u["completion_tokens"])
        else:
            err = r.json().get("error", {})
            tokens = 0
        return Result(
            r.status_code,
            r.headers.get("retry-after"),
            None if r.status_code == 200 else err.get("reason"),
            tokens,
            r.headers.get("x-ratelimit-limit-requests"),
            r.headers.get("x-fairgate-quota"),
        )

    try:
        tasks = [asyncio.create_task(one(i)) for i in range(clients)]
        await asyncio.sleep(0.05)  # every client is waiting at the gate
        go.set()
        return await asyncio.gather(*tasks)
    finally:
        for c in conns:
            await c.aclose()


async def settled(gws: list[Proc], *, with_usage: bool = True) -> dict[str, object]:
    """Pool usage once every replica has settled what it served (settles run after answers),
    with each replica's fail-open count and store outages (``with_usage=False`` when the store
    is gone: the usage view needs it)."""
    async with httpx.AsyncClient(timeout=60) as c:
        # generous: on a host whose cores are busy the last settles may take a while
        for _ in range(1200):
            healths = [(await c.get(g.url + "/health")).json() for g in gws]
            if all(h["inflight"] == 0 for h in healths):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("requests still in flight")
        usage: dict[str, object] = {}
        if with_usage:
            usage = (
                await c.get(gws[0].url + "/api/quota/pools/shared/usage", headers=ADMIN)
            ).json()
        usage["failOpen"] = [h["failOpen"] for h in healths]
        usage["outages"] = [h["store"]["outage"]["outages"] for h in healths]
        usage["slowTimeouts"] = [h["store"]["outage"].get("slowTimeouts") for h in healths]
        return usage
