"""Three keys 50/30/20 share a pool of 100 requests/hour through the real gateway: a greedy key
is held to its share once the pool is strict, the others still get through, and the counts the
admin API shows are exact (on the test clock; should a bucket boundary pass during the test, the
window arithmetic says by how much they may have faded). On both quota store drivers."""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    GatewayFactory,
    Proc,
    assert_window_count,
    gateway_config,
    new_secret,
    window_count_range,
)


@pytest.mark.parametrize("driver", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_greedy_key_held_to_its_share_others_served(
    driver: str, mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    keys = {"a": new_secret(), "b": new_secret(), "c": new_secret()}
    pools = (
        "pools:\n"
        "  - id: shared\n"
        "    name: Shared\n"
        "    connections: [mock-1, mock-2]\n"  # 2 members × 50 per connection = 100
        "    dimensions: [{unit: requests, window: hourly, limit: 50}]\n"
        "    allocations:\n"
        "      - {key: a, weight: 50, policy: hard}\n"
        "      - {key: b, weight: 30, policy: hard}\n"
        "      - {key: c, weight: 20, policy: hard}\n"
    )
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(gateway_config(mock_upstream.url, pools, keys), driver=driver)

    def send(key: str, n: int) -> tuple[int, list[openai.RateLimitError]]:
        ok, errors = 0, []
        with openai.OpenAI(base_url=gw.url + "/v1", api_key=keys[key], max_retries=0) as c:
            for _ in range(n):
                try:
                    c.chat.completions.create(
                        model="mock/gpt-4o-mini",
                        messages=[{"role": "user", "content": "x"}],
                        max_tokens=2,
                    )
                    ok += 1
                except openai.RateLimitError as err:
                    errors.append(err)
        return ok, errors

    ok_a, blocked_a = send("a", 30)
    TEST_CLOCK.cross_boundary(gw)  # the boundary guard: the first 30 in the previous bucket
    more_ok, more_blocked = send("a", 30)
    ok_a, blocked_a = ok_a + more_ok, blocked_a + more_blocked
    # generous up to 50 % of the pool, then strict: a's share is exactly 50 within one bucket.
    # Should a boundary have passed, what faded lets a few more in (a key is held once its
    # count reaches its share, so any fade below it admits one more): at most ceil(faded)
    faded = 50 - window_count_range(50, "hourly", since, TEST_CLOCK.now_ms())[0]
    assert 50 <= ok_a <= 50 + math.ceil(faded)
    assert len(blocked_a) == 60 - ok_a
    err = blocked_a[0]
    assert int(err.response.headers["retry-after"]) >= 1
    body = err.response.json()["error"]
    assert body["reason"] == "fair-share"
    assert body["dimension"] == "requests/hourly"
    assert body["code"] == "rate_limit_exceeded"
    assert body["message"] == "Quota share limit reached for your API key on mock"

    ok_b, blocked_b = send("b", 10)
    ok_c, blocked_c = send("c", 10)
    assert (ok_b, ok_c, blocked_b, blocked_c) == (10, 10, [], [])

    usage = httpx.get(
        f"{gw.url}/api/quota/pools/shared/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()
    (dim,) = usage["dimensions"]
    assert dim["limit"] == pytest.approx(100)
    assert_window_count(dim["total"], ok_a + 20, "hourly", since)
    consumed = {k["keyId"]: k["consumed"] for k in dim["keys"]}
    for key, n in (("a", ok_a), ("b", 10), ("c", 10)):
        assert_window_count(consumed[key], n, "hourly", since)
    log = httpx.get(
        f"{gw.url}/api/quota/pools/shared/log?limit=500",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()
    entries = log if isinstance(log, list) else log.get("entries", log.get("events", []))
    assert sum(1 for e in entries if e["outcome"] == "block") == 60 - ok_a
