"""Resilience state shared by two gateway processes through Redis. The rest of resilience
(cooldowns, fallback, the all-unavailable answer, persistence across a restart, admin clearing,
the settings API) runs in-process: ``tests/inproc/test_resilience_inproc.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_support import UPSTREAM_SECRET, GatewayFactory, Proc, new_secret, start_mock


@pytest.fixture
def mock_b(tmp_path: Path) -> Iterator[Proc]:
    """A second, healthy upstream (the module's ``mock_upstream`` plays the faulty one)."""
    p = start_mock(tmp_path / "mock-b.log")
    yield p
    p.stop()


def two_upstreams(a_url: str, b_url: str, secret: str) -> str:
    return (
        "connections:\n"
        f"  - {{id: conn-a, provider: mock, base_url: '{a_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini], weight: 2}\n"
        f"  - {{id: conn-b, provider: mock, base_url: '{b_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini], weight: 1}\n"
        f"keys:\n  - {{id: k, name: k, secret: '{secret}', allowed_providers: [mock]}}\n"
    )


def chat(gw: Proc, secret: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
        },
        timeout=10,
    )


def count(mock: Proc) -> int:
    return int(httpx.get(mock.url + "/_mock/stats").json()["requests"])


@pytest.fixture
def mock_a(mock_upstream: Proc) -> Iterator[Proc]:
    httpx.post(mock_upstream.url + "/_mock/reset")
    yield mock_upstream
    httpx.post(mock_upstream.url + "/_mock/reset")


@pytest.mark.redis
def test_two_replicas_sharing_redis_honour_each_others_cooldown(
    mock_a: Proc, mock_b: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    cfg = two_upstreams(mock_a.url, mock_b.url, secret)
    g1 = start_gateway(cfg, driver="redis")
    g2 = start_gateway(cfg, driver="redis")
    httpx.post(mock_a.url + "/_mock/schedule", json={"faults": ["429:5"]})
    assert chat(g1, secret).headers["x-fairgate-connection"] == "conn-b"
    assert count(mock_a) == 1
    time.sleep(0.2)
    r = chat(g2, secret)  # the other replica never tries A: it sees the cooldown in Redis
    assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "conn-b")
    assert count(mock_a) == 1
