"""HTTP on loopback for the integration tests.

Reading what an HTTP client sent, for the raw loopback servers of the upstream client's tests
(``test_upstream_wire.py``, ``test_http1.py``, ``test_http1_contract.py``): they record
requests byte for byte and answer with exact bytes, so they parse the request themselves
instead of running a real HTTP server (:func:`answering`, where one answer per request is the
whole script). And serving an ASGI app for real
(uvicorn on a free loopback port), for the tests that drive the gateway or its admin API over
the network (``test_admin_api.py``, ``test_tenancy.py``, ``test_tracing.py`` ...)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from fairgate.admin.api import create_admin_app
from fairgate.clock import ManualClock
from fairgate.mock.server import MockUpstream
from fairgate.process.state import Gateway
from fairgate.server.app import create_app


@asynccontextmanager
async def served(app: Any, **options: Any) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free loopback port (``options`` go to ``uvicorn.Config``)
    once it listens: its base URL; the server stops when the block ends. Fails the test when it
    does not start within ten seconds."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def gateway_client(gw: Gateway) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """The gateway's app (``gw`` starts with it) served on loopback: its URL and a client of it."""
    async with served(create_app(gw)) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield url, c


@asynccontextmanager
async def admin_client(gw: Gateway, admin_key: str) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """``gw`` started and its admin API alone served on loopback: its URL and a client that
    sends ``admin_key``; the gateway stops when the block ends."""
    await gw.start()
    try:
        async with (
            served(create_admin_app(gw), lifespan="off", ws="none") as url,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}) as c,
        ):
            yield url, c
    finally:
        await gw.stop()


@dataclass
class AdminApi:
    """A started gateway whose admin API is served on loopback (``admin_client``), a client of
    it that sends the admin key, and the test clock the gateway runs on."""

    gw: Gateway
    client: httpx.AsyncClient
    base_url: str
    clock: ManualClock

    @property
    def db(self) -> Any:
        return self.gw.db

    def dump(self) -> list[str]:
        """Every row of the metadata DB, to show that a rejected request changed nothing."""
        return list(self.gw.db.iterdump())

    async def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return await self.client.request(method, url, **kw)


@dataclass
class ServedGateway:
    """A gateway served on loopback (:func:`gateway_client`), the mock upstream behind it, a
    client of its port and the admin key: what the tests that drive one gateway over the
    network start from (each adds its own fields and requests)."""

    gw: Gateway
    mock: MockUpstream
    client: httpx.AsyncClient
    admin_key: str

    async def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """A call of the admin API (``/api`` + ``path``) on the gateway's port, as the admin."""
        return await self.client.request(
            method, "/api" + path, headers={"Authorization": f"Bearer {self.admin_key}"}, **kw
        )


def error_of(r: httpx.Response, *secrets: str) -> dict[str, Any]:
    """The ``error`` object of an admin API error answer (its only member, with a message and a
    type), after checking that the answer shows none of ``secrets``, no stack trace and no path
    of the source tree."""
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert isinstance(err["message"], str)
    assert isinstance(err["type"], str)
    for needle in (*secrets, "Traceback", "/work/", 'File "'):
        assert needle not in r.text
    return err


@asynccontextmanager
async def admin_api(gw: Gateway, admin_key: str, clock: ManualClock) -> AsyncIterator[AdminApi]:
    """``admin_client`` as an :class:`AdminApi`."""
    async with admin_client(gw, admin_key) as (url, client):
        yield AdminApi(gw, client, url, clock)


async def read_request(reader: asyncio.StreamReader) -> tuple[list[str], bytes]:
    """The next request on ``reader``: its head's lines (the request line first, without the
    blank line that ends the head) and its body (by ``Content-Length``; none without one).
    Raises ``asyncio.IncompleteReadError`` when the client closes first."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")[:-2]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return lines, await reader.readexactly(length)


#: What :func:`answering` writes for one request, given the number of its connection (1 for the
#: first accepted), its head's lines and its body: the bytes, and whether to close after them.
Answer = Callable[[int, list[str], bytes], tuple[bytes, bool]]


@dataclass
class Answering:
    """A raw server of :func:`answering`: its port, how many connections it accepted, and the
    tasks serving them."""

    port: int = 0
    accepted: int = 0
    handlers: list[asyncio.Task[None]] = field(default_factory=list)

    async def finished(self) -> None:
        """Wait until every connection's handler has ended: each ends on its client's close,
        so a test that has closed its clients sees the server done, not still writing."""
        await asyncio.gather(*self.handlers, return_exceptions=True)


@asynccontextmanager
async def answering(answer: Answer) -> AsyncIterator[Answering]:
    """A server on a free loopback port that reads each request of each connection and writes
    what ``answer`` says for it. A client that closes or resets ends its connection quietly:
    the tests judge the client's side, not the server's."""
    server_state = Answering()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_state.accepted += 1
        number = server_state.accepted
        task = asyncio.current_task()
        assert task is not None
        server_state.handlers.append(task)
        try:
            while True:
                lines, body = await read_request(reader)
                data, close = answer(number, lines, body)
                writer.write(data)
                await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    server_state.port = server.sockets[0].getsockname()[1]
    try:
        yield server_state
    finally:
        server.close()
        await server.wait_closed()
