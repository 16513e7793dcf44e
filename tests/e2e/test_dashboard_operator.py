"""The operator pages of the dashboard in Chromium against a real gateway process: Keys (create
with the secret shown once, edit, rotate, revoke, last used), Combos (per-target success, p50/p95,
cooldown state) and the quota-store switch on Settings (the Redis URL never echoed, the active
driver and the fallback reason). Screenshots at 1280 px and 390 px wide land in
``test-artifacts/`` and must not be blank; the values on them are checked through the DOM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from browser_support import assert_not_blank, browser, collect_problems
from e2e_support import UPSTREAM_SECRET, Proc, mock_upstream, module_gateway, new_secret
from test_dashboard import admin, expect, shot, sign_in
from test_observability import scrape

from metrics_support import val

__all__ = ["browser", "mock_upstream"]

ALICE = new_secret()


def _config(mock_url: str) -> str:
    conn = f"base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini]"
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: mock-a, provider: mock, {conn}}}\n"
        f"  - {{id: mock-b, provider: mock, {conn}}}\n"
        f"keys:\n  - {{id: alice, name: Alice, secret: '{ALICE}', allowed_providers: [mock]}}\n"
        "combos:\n"
        "  - {name: fast, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: mock-a},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: mock-b}]}\n"
    )


@pytest.fixture(scope="module")
def gateway(mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    yield from module_gateway(tmp_path_factory.mktemp("dash-ops"), _config(mock_upstream.url))


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """``open_page(width)``: a fresh context at that width; console or page errors fail the
    test (failed resource loads the page expects, such as a 404, are Chromium's noise)."""
    contexts: list[Any] = []
    problems: list[str] = []

    def factory(width: int) -> Any:
        phone = width < 600
        ctx = browser.new_context(
            viewport={"width": width, "height": 844 if phone else 900}, is_mobile=phone
        )
        contexts.append(ctx)
        return collect_problems(ctx.new_page(), problems, 15_000)

    yield factory
    for ctx in contexts:
        ctx.close()
    assert problems == []


def status_with(gw: Proc, secret: str, model: str = "gpt-4o-mini") -> int:
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )
    return r.status_code


def go(pg: Any, gw: Proc, route: str) -> None:
    sign_in(pg, gw)
    pg.get_by_role("heading", name="Pools", exact=True).wait_for()
    pg.get_by_role("link", name=route.title(), exact=True).click()
    pg.get_by_role("heading", name=route.title(), exact=True).wait_for()


def fits(pg: Any, width: int) -> None:
    """Nothing wider than the screen: wide tables scroll inside their own region."""
    assert pg.evaluate("document.documentElement.scrollWidth") <= width


def create_key(pg: Any, key_id: str, name: str, models: str) -> str:
    """Through the dialog; the key may use the mock provider's unpooled connections."""
    pg.locator("#new-key").click()
    dlg = pg.locator("dialog[open]")
    dlg.get_by_label("Name").fill(name)
    dlg.get_by_label("Key id").fill(key_id)
    dlg.get_by_label("Allowed models").fill(models)
    dlg.get_by_label("Allowed providers").fill("mock")
    dlg.get_by_role("button", name="Create key").click()
    dlg.wait_for(state="detached")
    secret = pg.locator("#new-secret")
    expect(secret).to_be_visible()
    expect(pg.locator("#secret-reveal")).to_contain_text("shown once")
    return str(secret.text_content())


def test_keys_page_create_rotate_revoke(open_page: Any, gateway: Proc) -> None:
    pg = open_page(1280)
    go(pg, gateway, "keys")
    expect(pg.locator('tr[data-key="alice"]')).to_contain_text("not since the gateway started")

    secret = create_key(pg, "ci-bot", "CI bot", "gpt-4o-mini")
    assert secret.startswith("fg-")
    row = pg.locator('tr[data-key="ci-bot"]')
    expect(row).to_contain_text("CI bot")
    expect(row.locator(".key-models")).to_have_text("gpt-4o-mini")
    expect(row.locator(".key-upstreams")).to_have_text("mock")
    assert secret[3:10] not in pg.locator("#keys-table").inner_text()  # no character of it
    shot(pg, "dashboard-keys-created")

    # the secret works, for its allowed model only; the page then shows when it was last used
    assert status_with(gateway, secret) == 200
    assert status_with(gateway, secret, model="gpt-4o") in (400, 403)
    pg.locator("#reveal-done").click()
    expect(pg.locator("#new-secret")).to_have_count(0)
    pg.get_by_role("button", name="Refresh").click()
    expect(row.locator(".key-last-used")).to_contain_text("ago")

    # a duplicate id: the API's refusal is shown in the dialog, nothing is created
    pg.locator("#new-key").click()
    dlg = pg.locator("dialog[open]")
    dlg.get_by_label("Key id").fill("alice")
    dlg.get_by_role("button", name="Create key").click()
    expect(dlg.locator(".alert")).to_contain_text("already exists")
    pg.keyboard.press("Escape")
    dlg.wait_for(state="detached")

    # edit the allowed models
    row.get_by_role("button", name="Edit ci-bot").click()
    dlg = pg.locator("dialog[open]")
    dlg.get_by_label("Allowed models").fill("")
    dlg.get_by_role("button", name="Save").click()
    dlg.wait_for(state="detached")
    expect(row.locator(".key-models")).to_have_text("any model")

    # rotate: a new secret, shown once; the old one stops at once
    row.get_by_role("button", name="Rotate ci-bot").click()
    pg.locator("dialog[open]").get_by_role("button", name="Rotate").click()
    new = pg.locator("#new-secret")
    expect(new).to_be_visible()
    expect(new).not_to_have_text(secret)
    rotated = str(new.text_content())
    assert status_with(gateway, secret) == 401
    assert status_with(gateway, rotated) == 200

    # revoke
    row.get_by_role("button", name="Revoke ci-bot").click()
    pg.locator("dialog[open]").get_by_role("button", name="Revoke").click()
    expect(row).to_have_count(0)
    assert status_with(gateway, rotated) == 401
    shot(pg, "dashboard-keys")


def test_combos_page_shows_per_target_figures(
    open_page: Any, gateway: Proc, mock_upstream: Proc
) -> None:
    # the first target answers 429 once, asking for ten minutes' rest: the combo falls back to
    # the second, which serves, and the first stays in cooldown for the rest of the module
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(mock_upstream.url + "/_mock/schedule", json={"faults": ["429:600"]})
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0) as c:
        for _ in range(3):
            c.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
    httpx.post(mock_upstream.url + "/_mock/reset")
    with admin(gateway) as api:
        stats = api.get("/combos/fast/stats").json()
    by_key = {t["key"]: t for t in stats["targets"]}
    a, b = by_key["mock/gpt-4o-mini@mock-a"], by_key["mock/gpt-4o-mini@mock-b"]
    assert a["errors"] == 1
    assert a["state"] == "cooldown"
    assert b["requests"] >= 1
    assert b["successRate"] == 1.0
    assert stats["fallbacks"] == {"rate_limit": 1}  # mock-a's 429 sent one request on to mock-b

    # the same facts as Prometheus series (parsed with prometheus_client's parser)
    m = scrape(gateway)
    assert val(m, "fairgate_combo_fallbacks_total", combo="fast", reason="rate_limit") == 1
    assert val(m, "fairgate_combo_requests_total", combo="fast", outcome="ok") == 3
    failed = {"provider": "mock", "connection": "mock-a", "outcome": "rate_limit"}
    assert val(m, "fairgate_target_attempts_total", model="gpt-4o-mini", **failed) == 1
    assert val(m, "fairgate_target_attempts_total", connection="mock-b", outcome="ok") >= 3
    assert (
        val(m, "fairgate_target_latency_seconds_count", provider="mock", connection="mock-b") >= 3
    )

    pg = open_page(1280)
    go(pg, gateway, "combos")
    card = pg.locator('article[data-combo="fast"]')
    expect(card.locator(".strategy")).to_have_text("priority")
    row_a = card.locator('tr[data-target="mock/gpt-4o-mini@mock-a"]')
    row_b = card.locator('tr[data-target="mock/gpt-4o-mini@mock-b"]')
    expect(row_b.locator(".t-requests")).to_have_text(str(b["requests"]))
    expect(row_b.locator(".t-success")).to_have_text("100 %")
    expect(row_b.locator(".t-p50")).to_contain_text("ms")
    expect(row_b.locator(".t-p95")).to_contain_text("ms")
    expect(row_a.locator(".t-state .badge")).to_have_text("cooldown")
    expect(row_a.locator(".t-state")).to_contain_text("until")
    assert a["successRate"] < 1  # (earlier tests' plain requests may have used mock-a too)
    expected = f"{a['successRate'] * 100:.1f}".removesuffix(".0") + " %"
    expect(row_a.locator(".t-success")).to_have_text(expected)
    expect(card.locator(".fallbacks li")).to_have_text(["1 × rate_limit"])
    shot(pg, "dashboard-combos")


def test_settings_quota_store_switch(open_page: Any, gateway: Proc) -> None:
    pg = open_page(1280)
    go(pg, gateway, "settings")
    expect(pg.locator("#active-driver")).to_have_text("sqlite")
    expect(pg.locator("#fallback-reason")).to_have_text("none")
    # an unreachable Redis: the gateway falls back to SQLite and the page says why
    password = "hunter2-" + new_secret()
    pg.get_by_label("Driver").select_option("redis")
    pg.get_by_label("Redis URL", exact=True).fill(f"redis://:{password}@127.0.0.1:9/0")
    pg.get_by_role("button", name="Apply").click()
    expect(pg.locator("#requested-driver")).to_have_text("redis (from db)")
    expect(pg.locator("#active-driver")).to_have_text("sqlite")
    expect(pg.locator("#fallback-reason")).not_to_have_text("none")
    expect(pg.locator("#redis-url-state")).to_contain_text("configured (db)")
    assert pg.get_by_label("Redis URL", exact=True).input_value() == ""
    assert password not in pg.content()
    shot(pg, "dashboard-settings-fallback")
    with admin(gateway) as api:
        assert password not in api.get("/settings").text
    # back to SQLite, forgetting the URL
    pg.get_by_label("Driver").select_option("sqlite")
    pg.get_by_label("Forget the stored Redis URL").check()
    pg.get_by_role("button", name="Apply").click()
    expect(pg.locator("#requested-driver")).to_have_text("sqlite (from db)")
    expect(pg.locator("#fallback-reason")).to_have_text("none")
    expect(pg.locator("#redis-url-state")).to_have_text("not configured")
    # a URL that is not one: the message sits next to the field
    pg.get_by_label("Redis URL", exact=True).fill("http://not-redis")
    pg.get_by_role("button", name="Apply").click()
    field = pg.get_by_label("Redis URL", exact=True)
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(pg.locator(f"#{field.get_attribute('id')}-error")).not_to_be_empty()


def test_settings_model_aliases(open_page: Any, gateway: Proc) -> None:
    """Issue 42, item 8: an alias set on the page sends a client's default model name to a model
    the gateway serves; back to the config file's (none here), the name is unknown again."""
    pg = open_page(1280)
    go(pg, gateway, "settings")
    expect(pg.locator("#aliases-source")).to_contain_text("config file")
    assert status_with(gateway, ALICE, "gpt-6.2-sol") == 404
    pg.get_by_label("Aliases", exact=True).fill("gpt-* -> gpt-4o-mini")
    pg.get_by_role("button", name="Save aliases").click()
    expect(pg.locator("#aliases-source")).to_contain_text("Set here")
    assert status_with(gateway, ALICE, "gpt-6.2-sol") == 200
    # a target that is a pattern: the message sits next to the field
    pg.get_by_label("Aliases", exact=True).fill("gpt-* -> gpt-*")
    pg.get_by_role("button", name="Save aliases").click()
    expect(pg.locator("#aliases-form .alert, #aliases-form .field-error")).not_to_have_count(0)
    pg.get_by_role("button", name="Use the config file's").click()
    expect(pg.locator("#aliases-source")).to_contain_text("config file")
    assert status_with(gateway, ALICE, "gpt-6.2-sol") == 404


def test_operator_pages_at_phone_width(open_page: Any, gateway: Proc) -> None:
    pg = open_page(390)
    go(pg, gateway, "keys")
    secret = create_key(pg, "phone", "Phone", "")
    assert status_with(gateway, secret) == 200
    expect(pg.locator("#new-secret")).to_be_in_viewport()
    fits(pg, 390)
    img = assert_not_blank(pg.screenshot(full_page=True))
    assert img.width <= 390 * 3  # device pixels: a phone's scale factor, never a wider page
    shot(pg, "dashboard-keys-phone")
    expect(pg.locator('tr[data-key="phone"] .key-models')).to_have_text("any model")

    pg.get_by_role("link", name="Combos", exact=True).click()
    card = pg.locator('article[data-combo="fast"]')
    expect(card).to_be_visible()
    expect(card.locator("tbody tr")).to_have_count(2)
    fits(pg, 390)
    shot(pg, "dashboard-combos-phone")

    pg.get_by_role("link", name="Settings", exact=True).click()
    expect(pg.locator("#active-driver")).to_be_visible()
    expect(pg.get_by_role("button", name="Apply")).to_be_visible()
    fits(pg, 390)
    shot(pg, "dashboard-settings-phone")
