"""One client key must not be able to switch shared connections off (issue 19, item 1).

Real processes: a gateway and a mock upstream in echoing mode, which answers an unknown body
field with OpenAI's real 400 ("Unrecognized request argument supplied: X"). On the old
classifier a key that sent ``{"insufficient_quota": true}`` twice blocked both connections of
the pool for good (persisted across restarts), and every other key got 503.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import (
    ADMIN_KEY,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    free_port,
    new_secret,
    spawn,
    wait_ready,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
#: Field names an attacker picks so that the echo reads like a provider signal.
HOSTILE_FIELDS = [
    "insufficient_quota",
    "invalid_api_key",
    "rate_limit_exceeded",
    "credit balance is too low",
    "billing_hard_limit_reached",
    "model_not_found",
]


@pytest.fixture
def echoing(tmp_path: Path) -> Iterator[Proc]:
    """A mock upstream that refuses unknown fields in OpenAI's words, naming the field."""
    port = free_port()
    log = tmp_path / "echoing.log"
    p = Proc(
        spawn(["mock-upstream", "--port", str(port), "--secret", UPSTREAM_SECRET], log),
        f"http://127.0.0.1:{port}",
        log,
    )
    wait_ready(p, "/_mock/stats")
    r = httpx.post(p.url + "/_mock/config", json={"reject_unknown_fields": True})
    assert r.status_code == 200
    yield p
    p.stop()


def _pool(pool_id: str, members: str) -> str:
    return (
        f"  - id: {pool_id}\n"
        f"    name: {pool_id}\n"
        f"    connections: [{members}]\n"
        "    dimensions: [{unit: requests, window: hourly, limit: 100000}]\n"
        "    allocations:\n"
        "      - {key: attacker, weight: 50}\n"
        "      - {key: victim, weight: 50}\n"
    )


def config(url: str, attacker: str, victim: str) -> str:
    common = f"base_url: '{url}/v1', secret: '{UPSTREAM_SECRET}'"
    conn = f"provider: mock, {common}, models: [gpt-4o-mini]"
    claude = f"provider: anthropic, {common}, models: [claude-sonnet-4]"
    return (
        "connections:\n"
        f"  - {{id: conn-a, {conn}}}\n"
        f"  - {{id: conn-b, {conn}}}\n"
        f"  - {{id: claude-a, {claude}}}\n"
        f"  - {{id: claude-b, {claude}}}\n"
        "pools:\n"
        + _pool("shared", "conn-a, conn-b")
        + _pool("claude", "claude-a, claude-b")
        + "keys:\n"
        f"  - {{id: attacker, name: attacker, secret: '{attacker}'}}\n"
        f"  - {{id: victim, name: victim, secret: '{victim}'}}\n"
    )


def chat(gw: Proc, secret: str, **extra: object) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            **extra,
        },
        timeout=15,
    )


def message(gw: Proc, secret: str, **extra: object) -> httpx.Response:
    """Anthropic's wire: the upstream's echo is "X: Extra inputs are not permitted"."""
    return httpx.post(
        gw.url + "/v1/messages",
        headers={"x-api-key": secret, "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-sonnet-4",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "x"}],
            **extra,
        },
        timeout=15,
    )


def health(gw: Proc) -> dict[str, Any]:
    r = httpx.get(gw.url + "/api/monitoring/health", headers=ADMIN, timeout=10)
    assert r.status_code == 200
    resilience: dict[str, Any] = r.json()["resilience"]
    return resilience


def persisted_rows(data_dir: Path | None) -> list[tuple[Any, ...]]:
    assert data_dir is not None
    db = sqlite3.connect(data_dir / "fairgate.sqlite")
    try:
        return db.execute("SELECT scope, kind, reason FROM resilience_state").fetchall()
    finally:
        db.close()


def test_echoed_provider_words_block_no_connection(
    echoing: Proc, start_gateway: GatewayFactory
) -> None:
    attacker, victim = new_secret(), new_secret()
    cfg = config(echoing.url, attacker, victim)
    gw = start_gateway(cfg)
    for _ in range(3):
        for field in HOSTILE_FIELDS:
            r = chat(gw, attacker, **{field: True})
            assert r.status_code == 400, r.text  # the attacker's own request fails, nothing else
            assert "Unrecognized request argument supplied" in r.text
            r = message(gw, attacker, **{field: True})
            assert r.status_code == 400, r.text
            assert "Extra inputs are not permitted" in r.text
    state = health(gw)
    assert (state["cooldowns"], state["lockouts"], state["permanent"]) == ([], [], [])
    served = {chat(gw, victim).headers["x-fairgate-connection"] for _ in range(6)}
    assert served == {"conn-a", "conn-b"}  # both connections still serve the other key
    claude = {message(gw, victim).headers["x-fairgate-connection"] for _ in range(6)}
    assert claude == {"claude-a", "claude-b"}
    assert persisted_rows(gw.data_dir) == []
    gw.stop()
    again = start_gateway(cfg, data_dir=gw.data_dir)  # nothing comes back after a restart
    assert chat(again, victim).status_code == 200
    assert health(again)["permanent"] == []


def test_health_names_the_key_and_request_behind_a_real_block(
    echoing: Proc, start_gateway: GatewayFactory
) -> None:
    attacker, victim = new_secret(), new_secret()
    gw = start_gateway(config(echoing.url, attacker, victim))
    # a real account-level signal: OpenAI's 429 insufficient_quota, answered to the victim
    httpx.post(echoing.url + "/_mock/schedule", json={"faults": ["quota", "429:30"]})
    first = chat(gw, victim)
    assert first.status_code == 429  # both connections failed: one quota, one rate limit
    rid = first.headers["x-request-id"]
    state = health(gw)
    [perm] = state["permanent"]
    assert perm["caused_by"] == {"key_id": "victim", "request_id": rid}
    [cd] = state["cooldowns"]
    assert cd["caused_by"]["key_id"] == "victim"
    assert cd["caused_by"]["request_id"] == rid
    assert cd["connection_id"] != perm["scope"].removeprefix("conn:")
    text = httpx.get(gw.url + "/api/monitoring/health", headers=ADMIN).text
    assert victim not in text
    assert attacker not in text
    assert UPSTREAM_SECRET not in text
    log = gw.output()
    assert '"block":"permanent"' in log.replace(" ", "")
    assert rid in log
    [row] = [r for r in persisted_rows(gw.data_dir) if r[1] == "permanent"]
    assert str(row[0]).startswith("perm:conn:")
