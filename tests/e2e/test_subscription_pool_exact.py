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


def walkthrough(mock: Proc, keys: dict[str, str], accounts: int) -> str:
    """The docs' walkthrough (codex.yaml) with ``accounts`` Codex accounts, ``models: ["*"]``."""
    conns = ""
    for n in range(1, accounts + 1):
        t = login(mock, f"acct-{n}")
        conns += (
            f"  - {{id: codex-{n}, provider: codex, base_url: '{mock.url}/backend-api/codex',\n"
            f"     auth_type: oauth, secret: '{t['access_token']}', models: ['*']}}\n"
        )
    key_lines = "".join(f"  - {{id: {k}, name: {k}, secret: '{s}'}}\n" for k, s in keys.items())
    members = ", ".join(f"codex-{n}" for n in range(1, accounts + 1))
    allocs = ", ".join(f"{{key: {k}, weight: 50}}" for k in keys)
    return (
        "server: {default_provider: codex}\n"
        f"connections:\n{conns}keys:\n{key_lines}"
        "pools:\n"
        f"  - {{id: codex, name: Codex Plus, connections: [{members}],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100},\n"
        "                  {unit: percent, window: weekly, limit: 100}],\n"
        f"     allocations: [{allocs}]}}\n"
    )


def say(gw: Proc, secret: str, text: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "gpt-5-codex", "messages": [{"role": "user", "content": text}]},
        timeout=30,
    )


def charged(gw: Proc) -> dict[str, float]:
    usage = httpx.get(gw.url + "/api/quota/pools/codex/usage", headers=ADMIN).json()
    (five,) = [d for d in usage["dimensions"] if d["key"] == "percent/5h"]
    return {k["keyId"]: round(k["consumed"], 4) for k in five["keys"]}


def test_the_two_account_walkthrough_charges_each_key_its_own_and_says_when(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    """Issue 44's walkthrough on two accounts (items 1, 3, 4, 5): alice "hi" ×2, bob "hi",
    alice a 3,766-token prompt, then ordinary requests of both keys: all served, shared by the
    two accounts, the preview agreeing; each key charged its own rises; then both accounts
    full: every refusal says the soonest stated reset, before and after the cooldowns."""
    httpx.post(mock.url + "/_mock/config", json={"oauth_access_ttl_s": 86_400.0})
    keys = {"alice": new_secret(), "bob": new_secret()}
    gw = start_gateway(walkthrough(mock, keys, 2))
    steps = [("alice", "hi"), ("alice", "hi"), ("bob", "hi"), ("alice", "y" * 15_064)]
    for who, text in steps:
        r = say(gw, keys[who], text)
        assert r.status_code == 200, r.text
        TEST_CLOCK.advance(1_200, gw, mock)
    served = []
    for i in range(12):  # ordinary requests, the default output budget
        r = say(gw, keys[("alice", "bob")[i % 2]], "hi")
        assert r.status_code == 200, r.text
        served.append(r.headers["x-fairgate-connection"])
        TEST_CLOCK.advance(1_200, gw, mock)
    assert set(served) == {"codex-1", "codex-2"}  # the wildcard pool shares its load
    preview = httpx.get(
        gw.url + "/api/quota/preview",
        params={"pool": "codex", "key": "alice", "tokens": 1_025},
        headers=ADMIN,
    ).json()
    assert preview["outcome"] == "allow"
    after_use = charged(gw)
    print("charged after the walkthrough (percent/5h):", after_use)
    assert after_use["alice"] > after_use["bob"] > 0  # the big prompt is alice's
    assert after_use["alice"] > 3.5  # its 3.8 % landed on her, not on bob

    # both accounts fill up (a steep rate: the next answer of each takes it to 100 %)
    httpx.post(mock.url + "/_mock/config", json={"codex_percent_per_1k_tokens": 10_000.0})
    for _ in range(4):
        say(gw, keys["bob"], "hi")
        TEST_CLOCK.advance(1_200, gw, mock)
    refusals = []
    for wait_ms in (0, 10_000, 30 * 60_000, 90 * 60_000):
        TEST_CLOCK.advance(wait_ms, gw, mock)
        r = say(gw, keys["alice"], "hi")
        refusals.append((r.status_code, r.headers.get("retry-after"), r.json()["error"]))
    print("refusals:", [(s, ra, e.get("code"), e.get("reason")) for s, ra, e in refusals])
    stated = [int(ra) for s, ra, _ in refusals if s == 429 and ra is not None]
    assert len(stated) == 4, refusals
    # every refusal names the reset, counting down with the clock (not 3,599 s, the cap)
    assert stated[0] > 3_600 * 4
    waits = (10_000, 30 * 60_000, 90 * 60_000)
    for a, b, w in zip(stated[:-1], stated[1:], waits, strict=True):
        assert abs((a - b) - w / 1000) <= 2, stated
