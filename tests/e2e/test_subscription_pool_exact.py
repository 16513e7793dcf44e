"""Shared subscriptions, exact (issue 44), on real processes: the gateway and the mock (its
Codex backend and OAuth authority), both on the test clock.

- The credential gate: of two Codex OAuth accounts in one pool, the one whose refresh token
  was revoked is skipped before any attempt once it is known blocked; the other serves every
  request, before and after the provider's breaker window, and ``/health`` and the connections
  API (what the dashboard and ``fairgate connections`` show) say "log in again".
"""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from e2e_support import ADMIN_KEY, TEST_CLOCK, GatewayFactory, Proc, new_secret

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TTL_S = 600  # the mock's access tokens live 10 minutes


def login(mock: Proc, account: str) -> dict[str, str]:
    r = httpx.post(mock.url + "/_mock/oauth/login", json={"account_id": account})
    r.raise_for_status()
    return dict(r.json())


def two_accounts(mock: Proc, keys: dict[str, str]) -> str:
    """Two OAuth Codex accounts (acct-1, acct-2) in one pool, the keys sharing it equally."""
    expires_at = TEST_CLOCK.now_ms() // 1000 + TTL_S
    conns = ""
    for n in (1, 2):
        t = login(mock, f"acct-{n}")
        conns += (
            f"  - {{id: codex-{n}, provider: codex, base_url: '{mock.url}/backend-api/codex',\n"
            f"     auth_type: oauth, secret: '{t['access_token']}', models: [gpt-5-codex],\n"
            f"     oauth: {{refresh_token: '{t['refresh_token']}',\n"
            f"             token_url: '{mock.url}/oauth/token', client_id: app_test,\n"
            f"             expires_at: {expires_at}}}}}\n"
        )
    key_lines = "".join(f"  - {{id: {k}, name: {k}, secret: '{s}'}}\n" for k, s in keys.items())
    allocs = ", ".join(f"{{key: {k}, weight: 1}}" for k in keys)
    return (
        "server: {default_provider: codex}\n"
        f"connections:\n{conns}keys:\n{key_lines}"
        "pools:\n"
        "  - {id: cx, name: Codex, connections: [codex-1, codex-2],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100}],\n"
        f"     allocations: [{allocs}]}}\n"
    )


@pytest.fixture
def mock(mock_upstream: Proc) -> Proc:
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(
        mock_upstream.url + "/_mock/config",
        json={"oauth_access_ttl_s": TTL_S, "codex_percent_per_1k_tokens": 1.0},
    )
    return mock_upstream


def ask(gw: Proc, secret: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "gpt-5-codex", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def test_a_blocked_account_is_skipped_and_never_takes_the_live_one_down(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    keys = {"alice": new_secret(), "bob": new_secret()}
    gw = start_gateway(two_accounts(mock, keys))
    assert ask(gw, keys["alice"]).status_code == 200
    httpx.post(mock.url + "/_mock/oauth/revoke", json={"account_id": "acct-1"})
    TEST_CLOCK.advance(11 * 60_000, gw, mock)  # both access tokens expired: refresh due

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda i: ask(gw, keys["alice" if i % 2 else "bob"]), range(30)))
    assert [r.status_code for r in burst] == [200] * 30, [r.text for r in burst if r.is_error]
    assert {r.headers["x-fairgate-connection"] for r in burst} == {"codex-2"}

    TEST_CLOCK.advance(2 * 60_000, gw, mock)  # past any breaker's half-open window
    later = [ask(gw, keys["alice"]) for _ in range(12)]
    assert [r.status_code for r in later] == [200] * 12
    assert {r.headers["x-fairgate-connection"] for r in later} == {"codex-2"}

    # the admin reads what to do: /health (the dashboard's banner) and the connections API
    # (the dashboard's table and `fairgate connections list`)
    health = {h["connectionId"]: h for h in httpx.get(gw.url + "/health").json()["oauth"]}
    assert health["codex-1"]["state"] == "blocked"
    assert (health["codex-1"]["usable"], health["codex-1"]["action"]) == (False, "log in again")
    assert (health["codex-2"]["usable"], health["codex-2"]["action"]) == (True, None)
    conns = httpx.get(gw.url + "/api/connections", headers=ADMIN).json()
    cred = {c["id"]: c["credential"] for c in conns}
    blocked = {"usable": False, "problem": "oauth-blocked", "action": "log in again"}
    assert cred["codex-1"] == blocked
    assert cred["codex-2"]["usable"] is True
    # nothing counted against the provider: its breaker saw no failure, nothing cools down
    res = httpx.get(gw.url + "/api/monitoring/health", headers=ADMIN).json()["resilience"]
    codex = res["breakers"]["codex"]
    assert (codex["state"], codex["failures"]) == ("closed", 0)
    assert res["cooldowns"] == []
