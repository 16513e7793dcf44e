"""The Health page shows a permanent block's classified cause; the upstream's text, which a
tenant can write, stays behind a click and is shown as text (issue 43, N16).

A real gateway process, a real Chromium, and an upstream (a stdlib HTTP server in a thread)
that answers a chat completion with OpenAI's 402 ``insufficient_quota`` whose message quotes the
request, as an upstream that echoes its input does: one request then blocks the connection for
good, and before this change the Health page's permanent-blocks table showed the tenant's words
as the block's reason.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from browser_support import browser
from e2e_support import ADMIN_KEY, UPSTREAM_SECRET, Proc, module_gateway, new_secret

__all__ = ["browser"]

KEY = new_secret()
#: What a tenant writes so that the admin takes it for the gateway's diagnosis (and markup).
TENANT_TEXT = '<img id="injected" src=x> gateway notice: rotate key alice now'


class _QuotingUpstream(BaseHTTPRequestHandler):
    """402 ``insufficient_quota`` quoting the request's last message (an account-level signal)."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        said = body["messages"][-1]["content"]
        error = {"message": f"billing: {said}", "type": "insufficient_quota", "code": None}
        raw = json.dumps({"error": error}).encode()
        self.send_response(402)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _QuotingUpstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gateway(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    config = (
        "connections:\n"
        f"  - {{id: echo-1, provider: openai, base_url: '{upstream}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini]}}\n"
        f"keys:\n  - {{id: alice, secret: '{KEY}', allowed_providers: [openai]}}\n"
    )
    yield from module_gateway(tmp_path_factory.mktemp("blocktext"), config)


def test_health_page_shows_the_cause_and_keeps_the_upstream_text_behind_a_click(
    browser: Any, gateway: Proc
) -> None:
    from playwright.sync_api import expect

    r = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": TENANT_TEXT}]},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code >= 400, r.text
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(10_000)
    try:
        page.goto(gateway.url + "/dashboard/")
        page.get_by_label("Admin key").fill(ADMIN_KEY)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("link", name="Health").click()
        section = page.locator('#resilience [data-section="permanent"]')
        expect(section.locator("tbody tr")).to_have_count(1)
        expect(section).to_contain_text("quota_permanent")  # the classified cause
        detail = section.locator("details.raw-detail")
        expect(detail.locator("pre")).not_to_be_visible()  # closed: the text is not on view
        expect(section.get_by_text("gateway notice", exact=False)).not_to_be_visible()
        detail.locator("summary").click()
        expect(detail.locator("pre")).to_be_visible()
        expect(detail.locator("pre")).to_have_text(f"billing: {TENANT_TEXT}")  # as text
        assert page.locator("#injected").count() == 0  # never markup
    finally:
        context.close()
    assert errors == []
