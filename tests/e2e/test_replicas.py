"""Exact limits across replicas: four gateway processes share one Redis (a unique key prefix on
the suite's server) and 400 clients hit them at once.

Why it holds: admission reserves the estimate inside one Lua script (read every counter, decide,
reserve), so no two replicas can both see the same headroom. With a request limit that makes
the count exact; with a token limit only the estimate can be wrong, and the overshoot is at most
what the admitted requests used beyond their estimates.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN, report

REPLICAS = 4
CLIENTS = 400
KEYS = ("k1", "k2", "k3", "k4")


@dataclass
class Result:
    status: int
    retry_after: str | None
    reason: str | None
    tokens: int  # what the upstream reported (prompt + completion) for a 200


def _pools(dimension: str) -> str:
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


def _replicas(
    start: GatewayFactory, mock: Proc, pools: str, *, default_max_tokens: int | None = None
) -> tuple[list[Proc], dict[str, str]]:
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock.url, pools, keys)
    if default_max_tokens is not None:
        config = config.replace(
            "server: {default_provider: mock}",
            f"server: {{default_provider: mock, default_max_tokens: {default_max_tokens}}}",
        )
    # the same Redis and prefix for all four (the start_gateway fixture gives them one prefix)
    return [start(config, driver="redis") for _ in range(REPLICAS)], keys


async def _storm(gws: list[Proc], keys: dict[str, str], body: dict[str, object]) -> list[Result]:
    """CLIENTS requests released at the same instant, spread evenly over replicas and keys."""
    go = asyncio.Event()
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    clients = [httpx.AsyncClient(base_url=g.url, timeout=60, limits=limits) for g in gws]

    async def one(i: int) -> Result:
        await go.wait()
        secret = keys[KEYS[i % len(KEYS)]]
        r = await clients[i % len(clients)].post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
        )
        if r.status_code == 200:
            u = r.json()["usage"]
            return Result(200, None, None, int(u["prompt_tokens"] + u["completion_tokens"]))
        err = r.json().get("error", {})
        return Result(r.status_code, r.headers.get("retry-after"), err.get("reason"), 0)

    try:
        tasks = [asyncio.create_task(one(i)) for i in range(CLIENTS)]
        await asyncio.sleep(0.05)  # every client is waiting at the gate
        go.set()
        return await asyncio.gather(*tasks)
    finally:
        for c in clients:
            await c.aclose()


async def _settled(gws: list[Proc]) -> dict[str, object]:
    """Pool usage once every replica has settled what it served (settles run after answers)."""
    async with httpx.AsyncClient(timeout=10) as c:
        for _ in range(200):
            healths = [(await c.get(g.url + "/health")).json() for g in gws]
            if all(h["inflight"] == 0 for h in healths):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("requests still in flight")
        usage: dict[str, object] = (
            await c.get(gws[0].url + "/api/quota/pools/shared/usage", headers=ADMIN)
        ).json()
        usage["failOpen"] = [h["failOpen"] for h in healths]
        return usage


@pytest.mark.slow
@pytest.mark.redis
async def test_four_replicas_400_clients_request_limit_100_admit_exactly_100(
    mock_upstream: Proc, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 connections x 50 = 100 requests per month (a window that does not turn during the test)
    gws, keys = _replicas(
        start_gateway, mock_upstream, _pools("{unit: requests, window: monthly, limit: 50}")
    )
    body = {"model": "mock/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    results = await _storm(gws, keys, {**body, "max_tokens": 4})
    usage = await _settled(gws)

    statuses = Counter(r.status for r in results)
    refused = [r for r in results if r.status == 429]
    (dim,) = usage["dimensions"]  # type: ignore[misc]
    report(
        capsys,
        "4 replicas, 400 concurrent clients, pool limit 100 requests",
        {
            "answers by status": dict(statuses),
            "refusal reasons": dict(Counter(r.reason for r in refused)),
            "pool usage (all replicas agree through Redis)": dim["total"],
            "fail-open admissions per replica": usage["failOpen"],
        },
    )
    assert usage["failOpen"] == [0] * REPLICAS  # an exact count means nothing if some failed open
    assert statuses == {200: 100, 429: 300}
    assert all(r.retry_after is not None and int(r.retry_after) >= 1 for r in refused)
    assert {r.reason for r in refused} == {"global-saturated"}
    assert dim["total"] == pytest.approx(100)


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize(
    ("max_tokens", "per_request_error"),
    [
        pytest.param(16, 0, id="exact-estimate"),
        # no max_tokens: the gateway reserves prompt + default_max_tokens (4) while the mock
        # answers 16 tokens, so each admitted request uses 12 tokens more than was reserved
        pytest.param(None, 12, id="underestimate"),
    ],
)
async def test_four_replicas_token_limit_overshoot_bounded_by_the_estimate_error(
    max_tokens: int | None,
    per_request_error: int,
    mock_upstream: Proc,
    start_gateway: GatewayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit = 2 * 1_300  # 2 connections x 1,300 tokens per month
    gws, keys = _replicas(
        start_gateway,
        mock_upstream,
        _pools("{unit: tokens, window: monthly, limit: 1300}"),
        default_max_tokens=4,
    )
    # 40 characters: 10 prompt tokens, for the gateway's estimate and for the mock alike
    body: dict[str, object] = {
        "model": "mock/gpt-4o-mini",
        "messages": [{"role": "user", "content": "0123456789" * 4}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    estimate = 10 + (max_tokens or 4)
    results = await _storm(gws, keys, body)
    usage = await _settled(gws)

    ok = [r for r in results if r.status == 200]
    used = sum(r.tokens for r in ok)
    error = sum(max(0, r.tokens - estimate) for r in ok)
    (dim,) = usage["dimensions"]  # type: ignore[misc]
    overshoot = dim["total"] - limit
    report(
        capsys,
        f"4 replicas, 400 clients, token limit {limit}, max_tokens {max_tokens or 'unset'}",
        {
            "admitted / refused": (len(ok), len(results) - len(ok)),
            "estimate vs actual tokens per request": (estimate, sorted({r.tokens for r in ok})),
            "tokens used (clients' sum / pool counter)": (used, dim["total"]),
            "overshoot over the limit": overshoot,
            "bound (sum of actual - estimate over admitted)": error,
            "fail-open admissions per replica": usage["failOpen"],
        },
    )
    assert usage["failOpen"] == [0] * REPLICAS
    assert {r.status for r in results} <= {200, 429}
    assert all(r.tokens == estimate + per_request_error for r in ok)
    assert dim["total"] == pytest.approx(used)  # the counter holds exactly what was used
    assert error == per_request_error * len(ok)
    assert overshoot <= error
    if per_request_error == 0:
        # an exact estimate cannot overshoot, and 400 x 26 tokens are far more than the limit:
        # admissions stop only when not one more estimate fits
        assert dim["total"] <= limit
        assert dim["total"] > limit - estimate
        assert len(ok) == limit // estimate
