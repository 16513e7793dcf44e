"""Resilience through the real gateway: cooldowns, fallback, shared state across replicas,
persistence across restarts, admin clearing, and the all-unavailable answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_support import (
    ADMIN_KEY,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    free_port,
    logged_diagnostics,
    new_secret,
    spawn,
    wait_ready,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def mock_b(tmp_path: Path) -> Iterator[Proc]:
    """A second, healthy upstream (the module's ``mock_upstream`` plays the faulty one)."""
    port = free_port()
    p = Proc(
        spawn(
            ["mock-upstream", "--port", str(port), "--secret", UPSTREAM_SECRET],
            tmp_path / "mock-b.log",
        ),
        f"http://127.0.0.1:{port}",
        tmp_path / "mock-b.log",
    )
    wait_ready(p, "/_mock/stats")
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


def test_429_puts_connection_in_cooldown_and_traffic_falls_over(
    mock_a: Proc, mock_b: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    gw = start_gateway(two_upstreams(mock_a.url, mock_b.url, secret))
    httpx.post(mock_a.url + "/_mock/schedule", json={"faults": ["429:2"]})
    first = chat(gw, secret)
    assert first.status_code == 200
    assert first.headers["x-fairgate-connection"] == "conn-b"  # fell over after A's 429
    assert count(mock_a) == 1
    for _ in range(5):  # A is cooling down: nothing reaches it until the deadline
        r = chat(gw, secret)
        assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "conn-b")
    assert count(mock_a) == 1
    health = httpx.get(gw.url + "/api/monitoring/health", headers=ADMIN).json()
    cooling = [
        c
        for c in health["resilience"]["cooldowns"]
        if c.get("connection_id") == "conn-a" or "conn-a" in str(c)
    ]
    assert cooling
    time.sleep(2.2)
    back = chat(gw, secret)
    assert (back.status_code, back.headers["x-fairgate-connection"]) == (200, "conn-a")
    assert count(mock_a) == 2


def test_all_cooling_down_is_429_with_earliest_retry_after_and_diagnostics(
    mock_a: Proc, mock_b: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    gw = start_gateway(two_upstreams(mock_a.url, mock_b.url, secret))
    httpx.post(mock_a.url + "/_mock/schedule", json={"faults": ["429:7"]})
    # both cool down for longer than the default maxWaitMs (5 s): no wait, 429 at once
    httpx.post(mock_b.url + "/_mock/schedule", json={"faults": ["429:6"]})
    first = chat(gw, secret)  # both answer 429 → the upstream's 429 comes back
    assert first.status_code == 429
    body = first.json()
    assert body["diagnostics"]["terminalReason"] == "upstream_failed"
    assert body["diagnostics"]["attempted"] == [
        {"target": "mock/gpt-4o-mini", "outcome": "failed"},
        {"target": "mock/gpt-4o-mini", "outcome": "failed"},
    ]
    assert [a["target"] for a in logged_diagnostics(gw)[-1]["attempted"]] == [
        "mock/gpt-4o-mini@conn-a",
        "mock/gpt-4o-mini@conn-b",
    ]
    second = chat(gw, secret)  # now both are cooling down: nothing is sent anywhere
    assert second.status_code == 429
    assert 1 <= int(second.headers["retry-after"]) <= 6  # the earliest to free (conn-b)
    diag = second.json()["diagnostics"]
    assert diag["terminalReason"] == "all_rate_limited"
    assert [e["reason"] for e in diag["excluded"]] == ["cooling_down", "cooling_down"]
    assert {(e["target"], e["reason"]) for e in logged_diagnostics(gw)[-1]["excluded"]} == {
        ("mock/gpt-4o-mini@conn-a", "cooldown"),
        ("mock/gpt-4o-mini@conn-b", "cooldown"),
    }
    assert diag["recoveryHint"]["retry_after_seconds"] >= 1
    assert second.headers["x-fairgate-combo-terminal"] == "all_rate_limited"
    assert "Traceback" not in second.text
    assert UPSTREAM_SECRET not in second.text
    assert (count(mock_a), count(mock_b)) == (1, 1)


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


def test_restart_keeps_cooldowns_and_permanent_blocks_until_an_admin_clears_them(
    mock_a: Proc, mock_b: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    cfg = two_upstreams(mock_a.url, mock_b.url, secret)
    gw = start_gateway(cfg)
    httpx.post(mock_a.url + "/_mock/schedule", json={"faults": ["quota"]})
    assert chat(gw, secret).headers["x-fairgate-connection"] == "conn-b"
    gw.stop()
    again = start_gateway(cfg, data_dir=gw.data_dir)
    for _ in range(3):
        assert chat(again, secret).headers["x-fairgate-connection"] == "conn-b"
    assert count(mock_a) == 1  # the permanent block survived the restart
    health = httpx.get(again.url + "/api/monitoring/health", headers=ADMIN).json()
    assert health["resilience"]["permanent"]
    r = httpx.delete(
        again.url + "/api/resilience/permanent", params={"connectionId": "conn-a"}, headers=ADMIN
    )
    assert r.status_code == 204
    assert chat(again, secret).headers["x-fairgate-connection"] == "conn-a"
    r = httpx.delete(
        again.url + "/api/resilience/permanent", params={"connectionId": "conn-a"}, headers=ADMIN
    )
    assert r.status_code == 404
    r = httpx.delete(again.url + "/api/resilience/lockout", headers=ADMIN)
    assert r.status_code == 422
    # a timed cooldown survives a restart too
    httpx.post(mock_a.url + "/_mock/schedule", json={"faults": ["429:30"]})
    assert chat(again, secret).headers["x-fairgate-connection"] == "conn-b"
    seen = count(mock_a)
    again.stop()
    third = start_gateway(cfg, data_dir=gw.data_dir)
    assert chat(third, secret).headers["x-fairgate-connection"] == "conn-b"
    assert count(mock_a) == seen


def test_resilience_settings_through_the_admin_api(
    mock_a: Proc, mock_b: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    gw = start_gateway(
        two_upstreams(mock_a.url, mock_b.url, secret),
        extra_env={"RESILIENCE_BREAKER_MIN_REQUESTS": "7"},
    )
    url = gw.url + "/api/resilience/settings"
    current = httpx.get(url, headers=ADMIN).json()["settings"]
    assert current["breaker_min_requests"] == 7  # from the environment
    r = httpx.put(
        url,
        headers=ADMIN,
        json={
            "settings": {"breakerMinRequests": 9},
            "providers": {"mock": {"apikeyBaseCooldownMs": 500}},
        },
    )
    assert r.status_code == 200
    assert r.json()["settings"]["breaker_min_requests"] == 9  # the DB setting wins over env
    assert r.json()["settings"]["providers"]["mock"]["apikey_base_cooldown_ms"] == 500
    bad = httpx.put(url, headers=ADMIN, json={"settings": {"breakerThreshold": 7, "noSuchKnob": 1}})
    assert bad.status_code == 422
    fields = {f["field"] for f in bad.json()["error"]["fields"]}
    assert fields == {"settings.breakerThreshold", "settings.noSuchKnob"}
    after = httpx.get(url, headers=ADMIN).json()["settings"]
    assert after["breaker_min_requests"] == 9  # the rejected request changed nothing
    assert httpx.put(url, json={"settings": {}}).status_code == 401
