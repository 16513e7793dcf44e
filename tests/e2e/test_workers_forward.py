"""``serve --workers 2`` on the SQLite quota file (issue 48, item 1): one worker owns the file
and counts in memory, the other forwards its admissions and settles to it (``/health`` says
which is which and how many calls went over), and a pool's limit is still exact across both."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from e2e_support import ADMIN_KEY, GatewayFactory, Proc, gateway_config, new_secret
from test_shared_metadata import BODY, healths, start_two_workers

LIMIT = 40
REQUESTS = 100
POOLS = (
    "pools:\n"
    "  - id: both\n"
    "    name: Both\n"
    "    connections: [mock-1, mock-2]\n"
    f"    dimensions: [{{unit: requests, window: hourly, limit: {LIMIT}}}]\n"
    "    allocations:\n"
    "      - {key: a, weight: 100, policy: hard}\n"
)


async def _stores(url: str) -> dict[int, dict[str, object]]:
    """Each worker's ``/health`` store block, by pid."""
    out: dict[int, dict[str, object]] = {}
    for h in await healths(url):
        store = h["store"]
        assert isinstance(store, dict)
        out[int(str(h["pid"]))] = store
    return out


@pytest.mark.slow
async def test_two_workers_forward_to_the_owner_and_admit_exactly_the_limit(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    gw = await start_two_workers(
        start_gateway, gateway_config(mock_upstream.url, POOLS, {"a": secret})
    )
    modes = sorted(str(s["mode"]) for s in (await _stores(gw.url)).values())
    assert modes == ["forwarding", "memory"]  # the file was never handed over

    auth = {"Authorization": f"Bearer {secret}"}
    # a connection per request: the kernel hands them to both workers; 8 at a time
    sem = asyncio.Semaphore(8)

    async def one() -> int:
        async with sem, httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
            r = await c.post("/v1/chat/completions", json=BODY, headers=auth)
            return r.status_code

    statuses = await asyncio.gather(*(one() for _ in range(REQUESTS)))
    assert statuses.count(200) == LIMIT
    assert statuses.count(429) == REQUESTS - LIMIT

    stores = await _stores(gw.url)
    assert sorted(str(s["mode"]) for s in stores.values()) == ["forwarding", "memory"]
    (forwarder,) = [s for s in stores.values() if s["mode"] == "forwarding"]
    # its admissions and settles went to the owner (a /health ping is one call each too)
    assert int(str(forwarder["forwardedCalls"])) > 24

    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as api:
        r = await api.get(
            "/api/quota/pools/both/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
    (dim,) = r.json()["dimensions"]
    assert float(dim["total"]) == LIMIT  # settled: exactly the requests served, by both
