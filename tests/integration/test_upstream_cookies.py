"""The upstream client keeps no cookies: one aiohttp session serves every connection (account)
and every client key, so a cookie one answer set must not ride along on the next request.

Real providers sit behind load balancers that set cookies on API answers (Cloudflare's
``__cf_bm`` on OpenAI's and Anthropic's API hosts); with aiohttp's default jar the gateway would
send account A's cookie with account B's requests to the same host, tying two tenants' traffic
together. Real HTTP over loopback, addressed by host name (aiohttp's default jar ignores
cookies set by a bare IP address, so ``127.0.0.1`` would hide the leak).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web

from fairgate.domain.connections import Connection
from fairgate.providers.upstream import UpstreamClient


@pytest_asyncio.fixture
async def cookie_server() -> AsyncIterator[tuple[str, list[str | None]]]:
    """An upstream that sets a cookie on every answer and records the cookies it is sent."""
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        resp = web.json_response({"id": "x", "object": "chat.completion", "choices": []})
        resp.set_cookie("__cf_bm", f"session-of-{request.headers['Authorization'][-1]}")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://localhost:{port}/v1", seen
    finally:
        await runner.cleanup()


async def test_a_cookie_set_for_one_account_is_never_sent_with_another(
    cookie_server: tuple[str, list[str | None]],
) -> None:
    base_url, seen = cookie_server
    accounts = [
        Connection(id=f"acct-{n}", provider="openai", base_url=base_url, secret=f"sk-{n}")
        for n in "ab"
    ]
    client = UpstreamClient()
    try:
        for conn in (*accounts, *accounts):
            resp = await client.post(conn, "/chat/completions", b"{}", {})
            assert resp.status == 200
            await resp.read()
    finally:
        await client.close()
    assert seen == [None, None, None, None]
