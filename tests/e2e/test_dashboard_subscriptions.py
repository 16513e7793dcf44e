"""The dashboard over a Codex subscription connection, in Chromium against real processes: the
pool page says when each dimension's window resets and whose clock that is (the provider's
reading anchors ``percent/5h``; ``requests/daily`` turns with fairgate's epoch-aligned bucket),
and a revoked refresh token puts a warning above every page that names the connection and the
reason, never a token, where there was none while the credential was fine.

Token lifetimes run on the test clock (as in ``test_oauth_connections``): the test moves it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser_support import browser, collect_problems
from e2e_support import TEST_CLOCK, GatewayFactory, Proc, new_secret
from test_dashboard import admin, expect, shot, sign_in
from test_oauth_connections import TTL_S, chat, login, refreshes
from test_oauth_connections import config as oauth_config

__all__ = ["browser"]

#: a moment as the dashboard shows it in the browser's locale ("Wed, Jun 24 03:30 PM", "15:30")
TIME = r".*\d:\d\d(\s?[AP]M)?"


def config(mock_url: str, tokens: dict[str, str], key: str, expires_at: int) -> str:
    """The OAuth test's Codex connection and key, with a pool of a percent and a daily window."""
    return oauth_config(mock_url, tokens, key, expires_at) + (
        "pools:\n"
        "  - {id: cx, name: Codex, connections: [codex-1],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100},\n"
        "                  {unit: requests, window: daily, limit: 1000}],\n"
        "     allocations: [{key: k, weight: 100}]}\n"
    )


@pytest.fixture
def page(browser: Any, mock_upstream: Proc) -> Iterator[Any]:
    """A fresh context; console and page errors fail the test (expected failed loads aside)."""
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(mock_upstream.url + "/_mock/config", json={"oauth_access_ttl_s": TTL_S})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    pg = collect_problems(context.new_page(), problems, 15_000)
    yield pg
    context.close()
    httpx.post(mock_upstream.url + "/_mock/config", json={"oauth_access_ttl_s": 3600})
    assert problems == []


def test_provider_reset_on_the_pool_page_and_a_blocked_credential_warning(
    page: Any, mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    mock = mock_upstream
    tokens = login(mock, "acct-dash")
    key = new_secret()
    gw = start_gateway(config(mock.url, tokens, key, (TEST_CLOCK.now_ms() // 1000) + TTL_S))
    assert chat(gw, key).status_code == 200  # the Codex reading anchors percent/5h
    with admin(gw) as api:
        dims = {d["key"]: d for d in api.get("/quota/pools/cx/usage").json()["dimensions"]}
    assert dims["percent/5h"]["anchorSource"] == "codex-1"
    assert dims["requests/daily"]["anchorSource"] is None

    sign_in(page, gw)
    five_h = page.locator('[data-reset="percent/5h"]')
    expect(five_h).to_have_text(re.compile(rf"^resets {TIME} \(provider: codex-1\)$"))
    expect(five_h).to_have_attribute("data-resets-at", str(dims["percent/5h"]["resetsAtMs"]))
    daily = page.locator('[data-reset="requests/daily"]')
    expect(daily).to_have_text(re.compile(rf"^resets {TIME} \(epoch-aligned window\)$"))
    expect(daily).to_have_attribute("data-resets-at", str(dims["requests/daily"]["resetsAtMs"]))
    banner = page.locator("#oauth-warning")
    expect(page.locator("#updated")).to_contain_text("Updated")  # the banner's load is done
    expect(banner).to_be_hidden()  # the credential is fine: no warning
    shot(page, "dashboard-provider-reset")

    # the refresh token is revoked at the provider; once the access token expires the one
    # refresh is rejected and the connection is blocked
    httpx.post(mock.url + "/_mock/oauth/revoke", json={"account_id": "acct-dash"})
    base = refreshes(mock)
    TEST_CLOCK.advance(TTL_S * 1000, gw, mock)
    assert chat(gw, key).status_code >= 500
    assert refreshes(mock) - base == 1
    page.get_by_role("button", name="Refresh").click()
    expect(banner).to_be_visible()
    entry = banner.locator('[data-oauth="codex-1"]')
    expect(entry).to_contain_text("codex-1: blocked (auth)")
    expect(entry).to_contain_text("invalid_grant")
    expect(entry).to_contain_text("Log in again")  # the credential gate's action (issue 44)
    page.get_by_role("link", name="Health").click()  # above every page, not only the pools'
    expect(page.locator("#store-status")).to_have_text("reachable")
    expect(entry).to_be_visible()
    html = page.content()
    for secret in (tokens["access_token"], tokens["refresh_token"]):
        assert secret not in html
    shot(page, "dashboard-oauth-warning")
