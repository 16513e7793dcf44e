"""What providers report in their headers changes admission (SPEC §4–§5), end to end.

The gateway reads a connection's rate-limit headers at most once a second by its clock: the
tests move the test clock past that second instead of sleeping."""

from __future__ import annotations

import httpx
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    GatewayFactory,
    Proc,
    assert_window_count,
    gateway_config,
    new_secret,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def chat(gw: Proc, secret: str, model: str = "mock/gpt-4o-mini") -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
    )


def test_provider_saturation_makes_the_pool_strict(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """Our counters see 8 of 100 requests (generous), but the provider says its own limit is 60 %
    used (someone else shares the account): fair shares must be enforced now."""
    keys = {"big": new_secret(), "small": new_secret()}
    pools = (
        "pools:\n"
        "  - {id: sat, name: Sat, connections: [mock-1, mock-2],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 50}],\n"
        "     allocations: [{key: big, weight: 98}, {key: small, weight: 2}]}\n"
    )
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(mock_upstream.url + "/_mock/config", json={"requests_limit": 10})
    try:
        gw = start_gateway(gateway_config(mock_upstream.url, pools, keys))
        for _ in range(6):  # the mock now reports 6 of its 10 requests used: 60 %
            assert chat(gw, keys["big"]).status_code == 200
        TEST_CLOCK.advance(1_100, gw, mock_upstream)  # headers are read at most once a second
        assert chat(gw, keys["big"]).status_code == 200
        TEST_CLOCK.advance(1_100, gw, mock_upstream)
        # small's share is 2 % of 100 = 2 requests; it may use them, then it is held
        codes = [chat(gw, keys["small"]).status_code for _ in range(4)]
        assert codes[:2] == [200, 200]
        assert 429 in codes[2:]
        blocked = next(r for r in (chat(gw, keys["small"]),) if r.status_code == 429)
        assert blocked.json()["error"]["reason"] == "fair-share"
        usage = httpx.get(gw.url + "/api/quota/pools/sat/usage", headers=ADMIN).json()
        dim = usage["dimensions"][0]
        assert dim["total"] < 50  # by our own counters the pool is not even half used
        assert dim["strict"]  # ... but the provider's signal makes it strict
    finally:
        httpx.post(mock_upstream.url + "/_mock/config", json={"requests_limit": 1500})
        httpx.post(mock_upstream.url + "/_mock/reset")


def test_percent_plan_charged_by_token_share(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """A subscription connection reports one global percent; each rise is charged to the keys
    in proportion to the tokens they used since the previous reading."""
    keys = {"a": new_secret(), "b": new_secret()}
    pools = (
        "pools:\n"
        "  - {id: pct, name: Pct, connections: [claude-1],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100}],\n"
        "     allocations: [{key: a, weight: 50}, {key: b, weight: 50}]}\n"
    )
    httpx.post(mock_upstream.url + "/_mock/config", json={"unified_5h_utilization": 0.10})
    try:
        since = TEST_CLOCK.now_ms()
        gw = start_gateway(gateway_config(mock_upstream.url, pools, keys))
        # the first answer carries the baseline reading (10 %); its tokens were used after the
        # reading was taken, so they count in the next interval, with the two that follow
        assert chat(gw, keys["a"], "claude-sonnet-4").status_code == 200
        TEST_CLOCK.advance(1_100, gw, mock_upstream)
        for _ in range(2):  # a: 3 equal requests in the interval, b: 1
            assert chat(gw, keys["a"], "claude-sonnet-4").status_code == 200
        assert chat(gw, keys["b"], "claude-sonnet-4").status_code == 200
        httpx.post(mock_upstream.url + "/_mock/config", json={"unified_5h_utilization": 0.14})
        TEST_CLOCK.advance(1_100, gw, mock_upstream)
        assert chat(gw, keys["b"], "claude-sonnet-4").status_code == 200  # reads 14 %: +4
        usage = httpx.get(gw.url + "/api/quota/pools/pct/usage", headers=ADMIN).json()
        consumed = {k["keyId"]: k["consumed"] for k in usage["dimensions"][0]["keys"]}
        # the 4 points split 3:1 by tokens, exactly, unless a 5-hour boundary passed meanwhile
        assert_window_count(consumed["a"], 3.0, "5h", since)
        assert_window_count(consumed["b"], 1.0, "5h", since)
    finally:
        httpx.post(mock_upstream.url + "/_mock/config", json={"unified_5h_utilization": None})
