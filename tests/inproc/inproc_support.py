"""The gateway's ASGI app run in the test's event loop over an in-process upstream.

Everything but the provider is real: the Starlette app and its lifespan, the metadata DB and
the SQLite quota store in ``tmp_path``, admission, routing, resilience, translation. The
upstream is a :class:`~fairgate.providers.inprocess.HandlerUpstream`; the clock is a
:class:`~fairgate.timers.ManualTimer` the test moves (a wait in the request path wakes when
the test advances it past the deadline, never by sleeping).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fairgate.config import parse_config
from fairgate.providers.inprocess import Handler, HandlerUpstream, UpstreamRequest
from fairgate.server.app import create_app
from fairgate.server.call import Services
from fairgate.server.state import Gateway
from fairgate.timers import ManualTimer

ALICE = "fg-alice-secret-0123456789"
BOB = "fg-bob-secret-0123456789"
UPSTREAM_SECRET = "upstream-secret-abcdef"


def conn(
    cid: str, provider: str = "mock", *, models: tuple[str, ...] = ("m",), **kw: Any
) -> dict[str, Any]:
    return {
        "id": cid,
        "provider": provider,
        "base_url": f"http://{cid}.invalid/v1",
        "secret": f"{UPSTREAM_SECRET}-{cid}",
        "models": list(models),
        **kw,
    }


def base_config(
    connections: list[dict[str, Any]],
    *,
    combos: list[dict[str, Any]] | None = None,
    pools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    # every key may use the connections outside every pool (their providers are listed); a
    # pooled one needs an allocation (server.require_allocation, on by default)
    providers = sorted({c["provider"] for c in connections})
    return {
        "connections": connections,
        "keys": [
            {"id": "alice", "name": "Alice", "secret": ALICE, "allowed_providers": providers},
            {"id": "bob", "name": "Bob", "secret": BOB, "allowed_providers": providers},
        ],
        "pools": pools or [],
        "combos": combos or [],
    }


@dataclass
class Harness:
    gw: Gateway
    upstream: HandlerUpstream
    client: httpx.AsyncClient
    timer: ManualTimer
    svc: Services

    def set_handler(self, handler: Handler) -> None:
        self.upstream.handler = handler

    @property
    def sent_to(self) -> list[str]:
        """The connection of every upstream request, in order."""
        return [r.conn.id for r in self.upstream.requests]

    async def chat(
        self, model: str, *, key: str = ALICE, headers: dict[str, str] | None = None, **body: Any
    ) -> httpx.Response:
        payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
        return await self.client.post(
            "/v1/chat/completions",
            json=payload,
            headers={"authorization": f"Bearer {key}", **(headers or {})},
        )

    async def open_reservations(self) -> int:
        """Reservations the quota store still holds (every pool), read from its SQLite file
        by a connection of our own."""
        with contextlib.closing(sqlite3.connect(self.gw.quota_store_path)) as db:
            return int(db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone()[0])

    async def settle_background(self) -> None:
        await self.svc.drain()


async def _no_handler(req: UpstreamRequest) -> Any:
    raise AssertionError(f"no handler set; request to {req.conn.id}")


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path, config: dict[str, Any], timer: ManualTimer, handler: Handler | None = None
) -> AsyncIterator[Harness]:
    gw = Gateway(data_dir=tmp_path, config=parse_config(config, {}), env={}, clock=timer.clock)
    gw.timer = timer
    upstream = HandlerUpstream(handler or _no_handler)
    app = create_app(gw, upstream=upstream)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield Harness(gw, upstream, client, timer, app.state.services)
