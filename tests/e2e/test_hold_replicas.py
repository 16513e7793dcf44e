"""``admission: hold`` across two gateway processes on one Redis (issue 45, item 1): a request
held on one replica is served by the room that requests on the other replica give back.

The pool meters tokens; two requests of k1 on replica A reserve most of it (their estimates)
and hang upstream for a while, so k2's request on replica B does not fit and waits instead of
a 429. When k1's answers come, their settlements give back what they reserved beyond what they
used; replica B sees that room at its waiter's next ask (within ``HOLD_POLL_MS``: no event
crosses processes, the queue and the counters in Redis do). That a newcomer may not take room
owed to a waiter on another replica is pinned by the store contract
(``tests/integration/test_store_hold.py``) on the same Lua script."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from outage_support import ADMIN

KEYS = ("k1", "k2")
POOL = (
    "pools:\n"
    "  - id: shared\n"
    "    connections: [mock-1, mock-2]\n"
    "    dimensions: [{unit: tokens, window: monthly, limit: 500}]\n"
    "    admission: hold\n"
    "    max_wait_ms: 30000\n"
    "    allocations:\n"
    "      - {key: k1, weight: 50, policy: burst}\n"
    "      - {key: k2, weight: 50, policy: burst}\n"
)


async def _post(
    c: httpx.AsyncClient, url: str, secret: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    return await c.post(
        url + "/v1/chat/completions",
        json={
            "model": "mock/gpt-4o-mini",
            "max_tokens": 200,
            "messages": [{"role": "user", "content": "x"}],
        },
        headers={"authorization": f"Bearer {secret}", **(headers or {})},
    )


@pytest.mark.slow
@pytest.mark.redis
async def test_a_request_held_on_one_replica_gets_the_room_freed_on_the_other(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    keys = {k: new_secret() for k in KEYS}
    config = gateway_config(mock_upstream.url, POOL, keys)
    a, b = (start_gateway(config, driver="redis") for _ in range(2))
    async with httpx.AsyncClient(timeout=60) as c:
        slow = {"x-mock-fault": "latency:4000"}
        first = [asyncio.create_task(_post(c, a.url, keys["k1"], slow)) for _ in range(2)]
        await asyncio.sleep(1.0)  # both admitted: 2 × (prompt + 200) reserved of 500
        held = asyncio.create_task(_post(c, b.url, keys["k2"]))
        await asyncio.sleep(1.0)
        assert not held.done()  # waiting on replica B, not refused
        # a newcomer that may not wait is refused at once with a Retry-After
        now = await _post(c, b.url, keys["k2"], {"x-fairgate-max-wait-ms": "0"})
        assert now.status_code == 429, now.text
        assert int(now.headers["retry-after"]) >= 1
        assert [(await t).status_code for t in first] == [200, 200]
        got = await held  # k1's settlements on A gave room back: B's waiter takes it
        assert got.status_code == 200, got.text
        used = sum(
            int(r["usage"]["total_tokens"])
            for r in [*(t.result().json() for t in first), got.json()]
        )
        healths: list[dict[str, object]] = []
        for _ in range(200):
            healths = [(await c.get(g.url + "/health")).json() for g in (a, b)]
            if all(h["inflight"] == 0 for h in healths):
                break
            await asyncio.sleep(0.05)
        usage = (await c.get(a.url + "/api/quota/pools/shared/usage", headers=ADMIN)).json()
        (dim,) = usage["dimensions"]
        assert dim["total"] == pytest.approx(used)  # what was used, nothing reserved left over
        assert dim["total"] <= 500
        assert [h["failOpen"] for h in healths] == [0, 0]
