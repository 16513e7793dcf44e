"""A client that disconnects mid-stream is charged for what was streamed and its reservation is
freed: nothing stays reserved, and in-flight returns to zero. The pool counts the request in
every window (hourly, 5-hour, daily, weekly), which the boundary guard runs across each kind of
bucket boundary."""

from __future__ import annotations

import time

import httpx
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    GatewayFactory,
    Proc,
    assert_window_count,
    gateway_config,
    new_secret,
)

WINDOWS = ("hourly", "5h", "daily", "weekly")


@pytest.mark.parametrize("driver", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_disconnect_mid_stream_settles_what_was_streamed(
    driver: str, mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    pools = (
        "pools:\n"
        "  - {id: s, name: S, connections: [mock-1, mock-2],\n"
        "     allocations: [{key: k, weight: 100}],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 100},\n"
        "                  {unit: requests, window: 5h, limit: 500},\n"
        "                  {unit: requests, window: daily, limit: 2400},\n"
        "                  {unit: requests, window: weekly, limit: 16800},\n"
        "                  {unit: tokens, window: hourly, limit: 100000}]}\n"
    )
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(gateway_config(mock_upstream.url, pools, {"k": secret}), driver=driver)
    httpx.post(
        mock_upstream.url + "/_mock/config",
        json={"stream_chunks": 40, "chunk_delay_ms": 50, "completion_tokens": 400},
    )
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        body = {
            "model": "gpt-4o-mini",
            "stream": True,
            "max_tokens": 2000,
            "messages": [{"role": "user", "content": "tell me a long story"}],
        }
        with (
            httpx.Client(timeout=10) as client,
            client.stream(
                "POST",
                gw.url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {secret}"},
            ) as resp,
        ):
            assert resp.status_code == 200
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 4:
                    break  # leaving the block closes the connection mid-stream
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = httpx.get(gw.url + "/health").json()
            if health["inflight"] == 0:
                break
            time.sleep(0.05)
        assert health["inflight"] == 0
        TEST_CLOCK.cross_boundary(gw)
        usage = httpx.get(gw.url + "/api/quota/pools/s/usage", headers=admin).json()
        dims = {d["key"]: d for d in usage["dimensions"]}
        for window in WINDOWS:
            assert_window_count(dims[f"requests/{window}"]["total"], 1, window, since)
        tokens = dims["tokens/hourly"]["total"]
        # charged for the prompt and the few chunks streamed: far below the 2000+ reserved,
        # and far below the 400 tokens the full answer would have had
        assert 0 < tokens < 200
    finally:
        httpx.post(
            mock_upstream.url + "/_mock/config",
            json={"stream_chunks": 4, "chunk_delay_ms": 0, "completion_tokens": 16},
        )
