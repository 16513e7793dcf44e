"""The dashboard in a real browser (Debian's Chromium via Playwright) against a real gateway
process and the mock upstream: sign in, create a pool through the dialog, edit weights, send
traffic with the openai SDK, refresh and see the bars, the table and the burn rate move, see
validation messages next to the fields (the browser's own checks and the API's 422 ``fields``),
revert a plan, read the health page; screenshots land in ``test-artifacts/`` and must not be blank.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from browser_support import ARTIFACTS, assert_not_blank, browser, collect_problems
from e2e_support import (
    ADMIN_KEY,
    FAULTS,
    UPSTREAM_SECRET,
    Proc,
    launch_gateway,
    mock_upstream,
    module_gateway,
    new_secret,
)

__all__ = ["browser", "mock_upstream"]

KEYS = {"alice": new_secret(), "bob": new_secret(), "temp": new_secret()}


def _config(mock_url: str) -> str:
    conn = f"base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}'"
    keys = "".join(
        f"  - {{id: {k}, name: {k.title()}, secret: '{s}', allowed_providers: [mock, kimi]}}\n"
        for k, s in KEYS.items()
    )
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, {conn}, models: [gpt-4o-mini]{FAULTS}}}\n"
        f"  - {{id: mock-2, provider: mock, {conn}, models: [gpt-4o]{FAULTS}}}\n"
        f"  - {{id: kimi-1, provider: kimi, {conn}, models: [kimi-k2]}}\n"
        f"keys:\n{keys}"
    )


@pytest.fixture(scope="module")
def gateway(mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    yield from module_gateway(tmp_path_factory.mktemp("dash"), _config(mock_upstream.url))


@pytest.fixture
def page(browser: Any, gateway: Proc) -> Iterator[Any]:
    """A fresh browser context per test; console errors and page errors fail the test (a CSP
    violation or a script error shows up there). Failed requests the page expects (a wrong key's
    401, a missing optional endpoint's 404) are logged by Chromium as resource errors: ignored."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    pg = collect_problems(context.new_page(), problems, 10_000)
    yield pg
    context.close()
    assert problems == []


def expect(target: Any) -> Any:
    """Playwright's auto-waiting assertions (imported late: without Playwright the browser
    fixture skips or fails with a clear message instead of a collection error)."""
    from playwright.sync_api import expect as _expect

    return _expect(target)


def admin(gw: Proc) -> httpx.Client:
    return httpx.Client(base_url=gw.url + "/api", headers={"Authorization": f"Bearer {ADMIN_KEY}"})


def sign_in(pg: Any, gw: Proc, key: str = ADMIN_KEY) -> None:
    pg.goto(gw.url + "/dashboard/")
    pg.get_by_label("Admin key").fill(key)
    pg.get_by_role("button", name="Sign in").click()


def shot(pg: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.evaluate("document.getElementById('toast').classList.remove('show')")
    pg.wait_for_timeout(250)  # the toast fades out
    pg.screenshot(path=str(path), full_page=True)
    assert_not_blank(path.read_bytes())
    return path


def send(gw: Proc, key: str, n: int, model: str = "mock/gpt-4o-mini") -> tuple[int, int]:
    ok = blocked = 0
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS[key], max_retries=0) as client:
        for _ in range(n):
            try:
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=8
                )
                ok += 1
            except openai.RateLimitError:
                blocked += 1
    return ok, blocked


def error_slot(pg: Any, field: Any) -> Any:
    """The error message slot tied to a control (its id + '-error', in its aria-describedby)."""
    fid = field.get_attribute("id")
    assert f"{fid}-error" in str(field.get_attribute("aria-describedby"))
    return pg.locator(f"#{fid}-error")


#: The rows the pool dialog's "Add dimension" and "Add allocation" buttons add.
ROWS = {"dimension": ".row.dimension", "allocation": ".row.alloc"}


def add_rows(dialog: Any, kind: str, *rows: dict[str, str]) -> Any:
    """Press the pool dialog's "Add <kind>" once per row, then set each row's controls in
    turn (label: value; a select takes the option, an input the text): the rows. A row's
    first control is labelled with the row's number ("Unit (row 2)"), so a screen reader
    tells the rows apart."""
    for _ in rows:
        dialog.get_by_role("button", name=f"Add {kind}").click()
    found = dialog.locator(ROWS[kind])
    for i, row in enumerate(rows):
        for n, (label, value) in enumerate(row.items()):
            control = found.nth(i).get_by_label(f"{label} (row {i + 1})" if n == 0 else label)
            if control.evaluate("e => e.tagName") == "SELECT":
                control.select_option(value)
            else:
                control.fill(value)
    return found


def expect_plan(pg: Any, source: str, limit: str, status: str | None = None) -> None:
    """The plans page shows a plan from ``source`` (``catalog`` or ``override``) with ``limit``
    in its table, offers "Revert to catalog" for an override only, and says ``status`` after a
    change."""
    expect(pg.locator("#plan-source")).to_have_text(source)
    if status is not None:
        expect(pg.locator("#plan-status")).to_contain_text(status)
    expect(pg.locator("#plan-table")).to_contain_text(limit)
    revert = expect(pg.locator("#plan-revert"))
    if source == "override":
        revert.to_be_enabled()
    else:
        revert.to_be_disabled()


# -- tests -------------------------------------------------------------------------------------


def test_dashboard_is_served_with_a_strict_policy(gateway: Proc) -> None:
    r = httpx.get(gateway.url + "/dashboard", follow_redirects=False)
    assert r.status_code in (301, 302, 307, 308)
    assert r.headers["location"].endswith("/dashboard/")
    r = httpx.get(gateway.url + "/dashboard/")
    assert r.status_code == 200
    assert "text/html" in r.headers["content-type"]
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    for asset in ("app.js", "style.css"):
        a = httpx.get(f"{gateway.url}/dashboard/{asset}")
        assert a.status_code == 200
        assert a.content
    # nothing in the page reaches for another host: it works offline
    for text in (r.text, httpx.get(gateway.url + "/dashboard/app.js").text):
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)


def test_wrong_key_shows_a_clear_message(page: Any, gateway: Proc) -> None:
    sign_in(page, gateway, "not-the-admin-key")
    err = page.locator("#signin-error")
    expect(err).to_contain_text("not accepted")
    expect(err).to_contain_text("Invalid admin key")
    expect(page.get_by_label("Admin key")).to_have_attribute("aria-invalid", "true")
    assert page.locator("#app-view").is_hidden()
    # a client key is refused too, with the API's own reason
    page.get_by_label("Admin key").fill(KEYS["alice"])
    page.get_by_role("button", name="Sign in").click()
    expect(err).to_contain_text("Client keys cannot use the admin API")
    # the right key signs in and is kept for the tab only
    page.get_by_label("Admin key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Pools", exact=True).wait_for()
    assert page.evaluate("sessionStorage.getItem('fairgate.adminKey')") == ADMIN_KEY
    assert page.evaluate("localStorage.getItem('fairgate.adminKey')") is None


def test_new_pool_waits_for_the_connections(page: Any, gateway: Proc) -> None:
    """ "New pool" lists the connections to choose from: clicked before they were read (a slow
    gateway, a loaded host) it offered "No connections yet". It is disabled until they come."""
    held: list[Any] = []

    def hold(route: Any) -> None:  # a bound method will not do: Playwright wraps functions
        held.append(route)

    page.route("**/api/connections", hold)
    sign_in(page, gateway)
    page.get_by_role("heading", name="Pools", exact=True).wait_for()
    button = page.get_by_role("button", name="New pool")
    expect(button).to_be_disabled()
    for _ in range(500):  # until the page has asked for them (its answer is held back)
        if held:
            break
        page.wait_for_timeout(20)
    assert held, "the pools page never asked for the connections"
    expect(button).to_be_disabled()
    for route in held:
        route.continue_()
    expect(button).to_be_enabled()
    button.click()
    dialog = page.locator("dialog[open]")
    expect(dialog.get_by_label("mock-1 (mock)")).to_be_enabled()
    expect(dialog).not_to_contain_text("No connections yet")


def test_pools_create_edit_traffic_and_validation(page: Any, gateway: Proc) -> None:
    sign_in(page, gateway)
    page.get_by_role("heading", name="Pools", exact=True).wait_for()
    assert "How quota sharing works" in page.locator("details.concept").inner_text()

    # -- create a pool through the dialog, with a bad weight first ------------------------------
    page.get_by_role("button", name="New pool").click()
    dialog = page.locator("dialog[open]")
    dialog.get_by_label("Pool id").fill("team")
    dialog.get_by_label("Name").fill("Team pool")
    dialog.get_by_label("mock-1 (mock)").check()
    assert dialog.get_by_label("kimi-1 (kimi)").is_enabled()
    add_rows(
        dialog,
        "dimension",
        {"Unit": "requests", "Window": "hourly", "Limit": "20"},
        {"Unit": "tokens", "Window": "hourly", "Limit": "5000"},
    )
    allocs = add_rows(
        dialog,
        "allocation",
        {"Key": "alice", "Weight %": "150"},
        {"Key": "bob", "Weight %": "30", "Policy": "soft"},
    )
    dialog.get_by_role("button", name="Create pool").click()
    weight = allocs.nth(0).get_by_label("Weight %")
    expect(error_slot(page, weight)).to_contain_text("between 0 and 100")
    expect(weight).to_have_attribute("aria-invalid", "true")
    expect(weight).to_be_focused()
    shot(page, "dashboard-create-pool-validation")
    with admin(gateway) as api:  # nothing was sent
        assert "team" not in [p["id"] for p in api.get("/quota/pools").json()]
    weight.fill("50")
    dialog.get_by_role("button", name="Create pool").click()
    page.locator("dialog[open]").wait_for(state="detached")
    card = page.locator('article[data-pool="team"]')
    card.wait_for()
    expect(card.get_by_role("heading", name="Team pool")).to_be_visible()
    expect(card.locator("[data-status]")).to_have_text("Generous")
    expect(card.locator("[data-allocations]")).to_have_text("2")
    expect(card.locator(".facts")).to_contain_text("mock-1")
    # no traffic yet: empty bars, zero consumption
    expect(card.locator(".bar .seg")).to_have_count(0)
    expect(card.locator('tr[data-key="alice"] td.consumed')).to_have_text("0")

    # -- edit weights: 60 / 40 -------------------------------------------------------------------
    card.get_by_role("button", name="Edit allocations").click()
    dialog = page.locator("dialog[open]")
    allocs = dialog.locator(".row.alloc")
    allocs.nth(0).get_by_label("Weight %").fill("60")
    allocs.nth(1).get_by_label("Weight %").fill("140")
    allocs.nth(1).get_by_label("Weight %").press("Tab")  # checked on leaving the field
    bob_error = error_slot(page, allocs.nth(1).get_by_label("Weight %"))
    expect(bob_error).to_contain_text("between 0 and 100")
    expect(dialog.locator(".total-line")).to_contain_text("over 100 %")
    allocs.nth(1).get_by_label("Weight %").fill("40")
    expect(bob_error).to_be_empty()  # fixed while typing
    dialog.get_by_role("button", name="Save allocations").click()
    page.locator("dialog[open]").wait_for(state="detached")
    expect(card.locator('tr[data-key="alice"] td.num').first).to_have_text("60 %")
    expect(card.locator('tr[data-key="bob"] td.num').first).to_have_text("40 %")
    # focus is back on the button that opened the dialog
    expect(card.get_by_role("button", name="Edit allocations")).to_be_focused()

    # -- the API's 422 fields land next to the right input -----------------------------------------
    card.get_by_role("button", name="Edit allocations").click()
    dialog = page.locator("dialog[open]")
    dialog.get_by_role("button", name="Add allocation").click()
    third = dialog.locator(".row.alloc").nth(2)
    third.get_by_label("Key (row 3)").select_option("temp")
    third.get_by_label("Weight %").fill("0")
    with admin(gateway) as api:  # the key goes away while the dialog is open
        assert api.delete("/keys/temp").status_code == 204
    dialog.get_by_role("button", name="Save allocations").click()
    key_select = third.get_by_label("Key (row 3)")
    expect(error_slot(page, key_select)).to_contain_text("unknown key 'temp'")
    expect(key_select).to_have_attribute("aria-invalid", "true")
    expect(page.locator("dialog[open]")).to_be_visible()
    page.keyboard.press("Escape")  # Escape closes the dialog
    page.locator("dialog[open]").wait_for(state="detached")

    # -- traffic through the gateway, then refresh ----------------------------------------------
    assert send(gateway, "alice", 14) == (12, 2)  # strict from 10 of 20: alice stops at 60 %
    assert send(gateway, "bob", 3) == (3, 0)
    page.get_by_role("button", name="Refresh").click()
    row = card.locator('tr[data-key="alice"]')
    expect(row.locator("td.consumed")).to_have_text("12")
    expect(row.locator("td.fair-share")).to_have_text("12")
    expect(row.locator("td.blocked")).to_have_text("2")
    expect(card.locator('tr[data-key="bob"] td.consumed')).to_have_text("3")
    expect(card.locator('tr[data-key="bob"] td.surplus')).to_have_text("+5 unused")
    expect(row.locator("td.surplus")).to_have_text("at share")
    # two dimensions: the dominant share column, at least alice's 12 of 20 requests (issue 18)
    expect(row.locator("td.dominant")).to_contain_text(" % of ")
    assert float(row.locator("td.dominant").get_attribute("data-value") or 0) >= 0.6 - 1e-9
    expect(card.locator("[data-status]")).to_have_text("Strict")
    bar = card.locator('.bar[data-dimension="requests/hourly"]')
    full = bar.bounding_box()["width"]
    alice_w = bar.locator('.seg[data-key="alice"]').bounding_box()["width"]
    bob_w = bar.locator('.seg[data-key="bob"]').bounding_box()["width"]
    assert alice_w == pytest.approx(full * 12 / 20, abs=3)
    assert bob_w == pytest.approx(full * 3 / 20, abs=3)
    expect(card.locator(".dim-total").first).to_contain_text("15 of 20 req")
    tokens_bar = card.locator('.bar[data-dimension="tokens/hourly"]')
    assert tokens_bar.locator('.seg[data-key="alice"]').bounding_box()["width"] > 0
    assert "alice" in str(bar.get_attribute("aria-label"))
    # the burn rate: a chart of samples and a forecast
    burn = card.locator("section.burn")
    assert "/min" in burn.locator(".burn-caption").inner_text()
    assert burn.locator("svg.chart").count() == 1
    assert int(burn.locator("svg.chart").get_attribute("data-points") or 0) >= 1
    # seconds of traffic are a burst, not a rate: no forecast before a minute of samples
    # (the forecast itself: tests/integration/test_engine.py, on an injected clock)
    assert "collecting samples" in burn.locator(".burn-caption").inner_text()
    # the table follows the dimension picker
    card.get_by_label("Dimension").select_option("tokens/hourly")
    expect(card.locator("table caption")).to_contain_text("tokens")
    assert float(card.locator('tr[data-key="alice"] td.consumed').get_attribute("data-value")) > 0
    card.get_by_label("Dimension").select_option("requests/hourly")
    shot(page, "dashboard-pools")


def test_plans_edit_and_revert(page: Any, gateway: Proc) -> None:
    sign_in(page, gateway)
    page.get_by_role("link", name="Plans").click()
    page.get_by_role("heading", name="Plans", exact=True).wait_for()
    page.get_by_label("Connection").select_option("kimi-1")
    expect(page.locator("#plan-title")).to_contain_text("kimi-1")
    expect_plan(page, "catalog", "1,500")
    # edit the catalog plan into an override
    page.locator(".row.dimension").first.get_by_label("Limit").fill("-3")
    page.get_by_role("button", name="Save plan").click()
    limit = page.locator(".row.dimension").first.get_by_label("Limit")
    expect(error_slot(page, limit)).to_contain_text("0 or more")
    limit.fill("1000")
    page.get_by_role("button", name="Add dimension").click()
    page.locator(".row.dimension").nth(1).get_by_label("Limit").fill("250000")
    page.get_by_role("button", name="Save plan").click()
    expect_plan(page, "override", "1,000", status="override plan")
    with admin(gateway) as api:
        plan = api.get("/quota/plans/kimi-1").json()
    assert plan["source"] == "override"
    assert [d["limit"] for d in plan["dimensions"]] == [1000, 250000]
    shot(page, "dashboard-plans-override")
    # revert to the catalog
    page.get_by_role("button", name="Revert to catalog").click()
    expect_plan(page, "catalog", "1,500", status="catalog plan again")
    with admin(gateway) as api:
        assert api.get("/quota/plans/kimi-1").json()["source"] == "catalog"
    shot(page, "dashboard-plans")


def test_health_page(page: Any, gateway: Proc) -> None:
    # an upstream failure gives the resilience view something to show (when the gateway has one)
    httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "mock/gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {KEYS['bob']}", "x-mock-fault": "500"},
    )
    sign_in(page, gateway)
    page.get_by_role("link", name="Health").click()
    expect(page.locator("#store-driver")).to_have_text("sqlite")
    expect(page.locator("#store-status")).to_have_text("reachable")
    expect(page.locator("#fail-open")).to_have_text("0")
    resilience = page.locator("#resilience")
    expect(resilience).not_to_contain_text("Loading")
    with admin(gateway) as api:
        has_monitoring = api.get("/monitoring/health").status_code != 404
    if has_monitoring:
        expect(resilience.locator("#monitoring-unavailable")).to_have_count(0)
        expect(resilience.locator("table").first).to_contain_text("mock")
    else:
        expect(resilience).to_contain_text("Not available")
    shot(page, "dashboard-health")


def test_phone_width_and_keyboard(browser: Any, gateway: Proc) -> None:
    with admin(gateway) as api:  # a pool to show, whichever tests ran before
        if api.get("/quota/pools/phone").status_code == 404:
            body = {
                "id": "phone",
                "name": "A pool with a rather long name for a phone screen",
                "connections": ["mock-2"],
                "dimensions": [{"unit": "requests", "window": "daily", "limit": 500}],
                "allocations": [
                    {"key": "alice", "weight": 70, "policy": "hard"},
                    {"key": "bob", "weight": 30, "policy": "burst"},
                ],
            }
            assert api.post("/quota/pools", json=body).status_code == 201
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        pg = context.new_page()
        sign_in(pg, gateway)
        pg.get_by_role("heading", name="Pools", exact=True).wait_for()
        pg.locator("article.pool").first.wait_for()
        # nothing wider than the screen: wide tables scroll inside their own region
        # (the layout viewport of a phone grows to fit wide content: compare with 390, not it)
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        shot(pg, "dashboard-pools-phone")
        # keyboard only: open the create dialog, Escape closes it, focus comes back
        pg.locator("#new-pool").focus()
        pg.keyboard.press("Enter")
        expect(pg.locator("dialog[open]").get_by_label("Pool id")).to_be_focused()
        pg.keyboard.press("Escape")
        pg.locator("dialog[open]").wait_for(state="detached")
        expect(pg.locator("#new-pool")).to_be_focused()
        # sign out forgets the key
        pg.get_by_role("button", name="Sign out").click()
        expect(pg.get_by_label("Admin key")).to_be_visible()
        assert pg.evaluate("sessionStorage.getItem('fairgate.adminKey')") is None
    finally:
        context.close()


def test_unallocated_use_is_shown_as_its_own_row(
    browser: Any, mock_upstream: Proc, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With allocations not required, a key without one borrows from a pool: the table shows
    that use on its own row, and an empty pool says what really happens (no "held to 0 %")."""
    conn = f"base_url: '{mock_upstream.url}/v1', secret: '{UPSTREAM_SECRET}'"
    config = (
        "server: {default_provider: mock, require_allocation: false}\n"
        "connections:\n"
        f"  - {{id: solo-1, provider: mock, {conn}, models: [gpt-4o-mini]}}\n"
        f"  - {{id: idle-1, provider: kimi, {conn}, models: [kimi-k2]}}\n"
        "keys:\n"
        f"  - {{id: alice, name: Alice, secret: '{KEYS['alice']}'}}\n"
        f"  - {{id: bob, name: Bob, secret: '{KEYS['bob']}'}}\n"
        "pools:\n"
        "  - {id: solo, connections: [solo-1], allocations: [{key: alice, weight: 100}],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 100}]}\n"
        "  - {id: idle, connections: [idle-1],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 100}]}\n"
    )
    gw = launch_gateway(tmp_path_factory.mktemp("dash-unalloc"), config, {})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        assert send(gw, "alice", 1) == (1, 0)
        assert send(gw, "bob", 2) == (2, 0)  # no allocation: allowed, counted on its own row
        pg = context.new_page()
        pg.set_default_timeout(10_000)
        sign_in(pg, gw)
        card = pg.locator('article[data-pool="solo"]')
        row = card.locator('tr[data-key="(unallocated)"]')
        expect(row).to_contain_text("Keys without an allocation")
        expect(row.locator("td.consumed")).to_have_text("2")
        expect(row.locator("td.fair-share")).to_have_text("none")
        expect(card.locator('tr[data-key="alice"] td.consumed')).to_have_text("1")
        idle = pg.locator('article[data-pool="idle"]')
        expect(idle).to_contain_text("any key may borrow this pool's unused quota")
        assert "held to 0" not in pg.content()
        shot(pg, "dashboard-unallocated")
        # allocations required: an empty pool is closed to every key, and the page says so
        with admin(gw) as api:
            r = api.put("/settings", json={"access": {"requireAllocation": True}})
        assert r.status_code == 200
        pg.get_by_role("button", name="Refresh").click()
        expect(idle).to_contain_text("no key may use this pool")
    finally:
        context.close()
        gw.stop()
