"""OAuth subscription connections on real processes: the gateway refreshes the access token at
the mock's token endpoint ahead of its expiry (no client request fails, one refresh), keeps the
rotated tokens sealed under its data dir (no token in clear on disk or in its log), and a
revoked refresh token blocks the connection in /health instead of refreshing in a loop.

Token lifetimes run on the test clock: the tests move it instead of waiting."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2e_support import ADMIN_KEY, TEST_CLOCK, GatewayFactory, Proc, new_secret

TTL_S = 600


def login(mock: Proc, account: str) -> dict[str, str]:
    r = httpx.post(mock.url + "/_mock/oauth/login", json={"account_id": account})
    r.raise_for_status()
    return dict(r.json())


def config(mock_url: str, tokens: dict[str, str], key: str, expires_at: int) -> str:
    return (
        "server: {default_provider: codex}\n"
        "connections:\n"
        f"  - {{id: codex-1, provider: codex, base_url: '{mock_url}/backend-api/codex',\n"
        f"     auth_type: oauth, secret: '{tokens['access_token']}', models: ['*'],\n"
        f"     oauth: {{refresh_token: '{tokens['refresh_token']}',\n"
        f"             token_url: '{mock_url}/oauth/token', client_id: app_test,\n"
        f"             expires_at: {expires_at}}}}}\n"
        f"keys:\n  - {{id: k, name: k, secret: '{key}', allowed_providers: [codex]}}\n"
    )


def chat(gw: Proc, key: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "gpt-5-codex", "messages": [{"role": "user", "content": "hi"}]},
    )


def refreshes(mock: Proc) -> int:
    return int(httpx.get(mock.url + "/_mock/stats").json()["oauth_refreshes"])


def oauth_health(gw: Proc) -> list[dict[str, object]]:
    return list(httpx.get(gw.url + "/health").json()["oauth"])


def oauth_gateway(
    mock: Proc, start_gateway: GatewayFactory, account: str
) -> tuple[Proc, dict[str, str], str]:
    """A gateway whose Codex connection is ``account``'s fresh login (its access token expiring
    ``TTL_S`` from now on the test clock): the gateway, the login's tokens, a key's secret."""
    tokens = login(mock, account)
    key = new_secret()
    gw = start_gateway(config(mock.url, tokens, key, (TEST_CLOCK.now_ms() // 1000) + TTL_S))
    return gw, tokens, key


@pytest.fixture
def short_tokens(mock_upstream: Proc) -> Iterator[Proc]:
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(mock_upstream.url + "/_mock/config", json={"oauth_access_ttl_s": TTL_S})
    yield mock_upstream
    httpx.post(mock_upstream.url + "/_mock/config", json={"oauth_access_ttl_s": 3600})


def test_refresh_ahead_of_expiry_without_a_failed_request(
    short_tokens: Proc, start_gateway: GatewayFactory
) -> None:
    mock = short_tokens
    gw, tokens, key = oauth_gateway(mock, start_gateway, "acct-oauth")
    base = refreshes(mock)
    statuses = [chat(gw, key).status_code]
    TEST_CLOCK.advance(TTL_S * 1000, gw, mock)  # the first access token has expired now
    statuses += [chat(gw, key).status_code for _ in range(3)]
    assert statuses == [200, 200, 200, 200]  # no client saw the expiry
    assert refreshes(mock) - base == 1  # one refresh, however many requests
    (h,) = oauth_health(gw)
    assert (h["state"], h["refreshes"]) == ("ok", 1)
    # nothing of any token in clear: not in the sealed files, not in the log
    assert gw.data_dir is not None
    blobs = b"".join(p.read_bytes() for p in (gw.data_dir / "oauth").glob("*.json"))
    assert blobs
    log = gw.log.read_bytes()
    for secret in (tokens["access_token"], tokens["refresh_token"]):
        assert secret.encode() not in blobs
        assert secret.encode() not in log
    assert (
        tokens["refresh_token"].encode()
        not in httpx.get(
            gw.url + "/api/connections", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ).content
    )


def test_revoked_refresh_token_blocks_instead_of_looping(
    short_tokens: Proc, start_gateway: GatewayFactory
) -> None:
    mock = short_tokens
    gw, _, key = oauth_gateway(mock, start_gateway, "acct-revoked")
    assert chat(gw, key).status_code == 200
    httpx.post(mock.url + "/_mock/oauth/revoke", json={"account_id": "acct-revoked"})
    base = refreshes(mock)
    TEST_CLOCK.advance(TTL_S * 1000, gw, mock)
    codes = [chat(gw, key).status_code for _ in range(4)]
    assert all(c >= 500 for c in codes), codes  # no usable token: the target fails over/502s
    assert refreshes(mock) - base == 1  # asked once, then blocked: no loop
    (h,) = oauth_health(gw)
    assert h["state"] == "blocked"
    assert "invalid_grant" in str(h["reason"])
