"""The outermost ASGI layer (``process/edge.py``): the ``/v1`` fast lane and what every path
gets from it (the host check, the request id), and what falls through to Starlette."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from inproc_support import ALICE, base_config, conn

from fairgate.config import parse_config
from fairgate.path import proxy
from fairgate.process.http_settings import HttpSettings
from fairgate.process.state import Gateway
from fairgate.providers.inprocess import HandlerUpstream, Reply, UpstreamRequest, openai_chat
from fairgate.server.app import create_app
from fairgate.timers import ManualTimer

AUTH = {"authorization": f"Bearer {ALICE}"}
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _answer(req: UpstreamRequest) -> Reply:
    return openai_chat("hello")


@asynccontextmanager
async def _client(
    tmp_path: Path, http: HttpSettings | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app; an exception that escapes the app is not raised in the client (a
    server would log it), so the answer sent before it can be checked."""
    timer = ManualTimer()
    gw = Gateway(
        data_dir=tmp_path,
        config=parse_config(base_config([conn("c1")]), {}),
        env={},
        clock=timer.clock,
    )
    gw.timer = timer
    app = create_app(gw, http=http, upstream=HandlerUpstream(_answer))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


async def test_the_request_id_is_echoed_on_the_fast_lane_and_on_starlettes_routes(
    tmp_path: Path,
) -> None:
    async with _client(tmp_path) as c:
        r = await c.post("/v1/chat/completions", json=BODY, headers={**AUTH, "x-request-id": "r-1"})
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "r-1"
        r = await c.get("/health", headers={"x-request-id": "r-2"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "r-2"
        r = await c.get("/v1/models", headers={**AUTH, "x-request-id": "bad id!"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] not in ("", "bad id!")


async def test_a_wrong_method_on_a_client_path_falls_through_to_the_routers_405(
    tmp_path: Path,
) -> None:
    async with _client(tmp_path) as c:
        r = await c.get("/v1/chat/completions", headers=AUTH)
        assert r.status_code == 405
        assert r.json()["error"]["message"] == "Method GET not allowed here"
        assert r.headers["x-request-id"]
        r = await c.post("/v1/nothing", headers=AUTH)
        assert r.status_code == 404


async def test_a_foreign_host_is_refused_on_every_path_before_any_route(tmp_path: Path) -> None:
    limits = HttpSettings(allowed_hosts=frozenset({"localhost"}))
    async with _client(tmp_path, limits) as c:
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/health")):
            r = await c.request(method, path, json=BODY, headers={**AUTH, "host": "evil.test"})
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "host_not_allowed"
            assert r.headers["x-request-id"]
        r = await c.post("/v1/chat/completions", json=BODY, headers=AUTH)
        assert r.status_code == 200, r.text


async def test_a_crash_in_a_client_handler_is_a_json_500_without_details(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(proxy, "_dispatch", broken)
    async with _client(tmp_path) as c:
        r = await c.post("/v1/chat/completions", json=BODY, headers={**AUTH, "x-request-id": "r-3"})
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "internal_error"
        assert "secret" not in r.text
        assert r.headers["x-request-id"] == "r-3"


async def test_a_head_of_the_models_route_is_served_through_the_router(tmp_path: Path) -> None:
    async with _client(tmp_path) as c:
        r = await c.head("/v1/models", headers={**AUTH, "x-request-id": "r-4"})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == "r-4"
        r = await c.head("/v1/models")
        assert r.status_code == 401


async def test_the_handler_sees_each_header_once_with_its_first_value(tmp_path: Path) -> None:
    seen: list[UpstreamRequest] = []

    async def answer(req: UpstreamRequest) -> Reply:
        seen.append(req)
        return openai_chat("hello")

    timer = ManualTimer()
    cfg = base_config(
        [conn("c1", provider="mock", forward_headers=["x-mock-note", "x-mock-latin"])]
    )
    gw = Gateway(data_dir=tmp_path, config=parse_config(cfg, {}), env={}, clock=timer.clock)
    gw.timer = timer
    app = create_app(gw, upstream=HandlerUpstream(answer))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            headers: list[tuple[str, str | bytes]] = [
                ("Authorization", f"Bearer {ALICE}"),
                ("Authorization", "Bearer not-the-key"),
                ("X-Mock-Note", "first"),
                ("x-mock-note", "second"),
                ("x-mock-latin", "caf\xe9".encode("latin-1")),
            ]
            r = await c.post("/v1/chat/completions", json=BODY, headers=headers)
    assert r.status_code == 200, r.text
    (req,) = seen
    assert req.headers["x-mock-note"] == "first"
    assert req.headers["x-mock-latin"] == "caf\xe9"
    assert req.headers["authorization"] != f"Bearer {ALICE}"  # ours, never the client's
