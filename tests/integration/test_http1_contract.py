"""The relayed requests' own HTTP/1.1 client (``providers/http1.py``) against a general one
(issue 47, item 5): for the same raw answer on the wire, :class:`Http1Pool` reads the same
status and body as httpx (h11 underneath), refuses the same broken answers, and keeps or drops
the connection for the next request as httpx does (``Content-Length``, chunked with extensions
and trailers, a body ended by the close, ``Connection: close``, HTTP/1.0, interim ``1xx``, no
body). Each case is one loopback server: its first answer is the scripted bytes, every later
request gets a plain ``200``; how many connections it accepted for two requests tells whether
the client kept the first one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from http_support import read_request

from fairgate.providers.http1 import Http1Pool, Origin, request_head
from fairgate.providers.transport import UpstreamBroken, UpstreamUnreachable

SAFETY_S = 30.0
PATH = "/v1/chat/completions"
AFTER = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nlater"

#: name → the first answer's bytes, and whether the server closes after writing them
CASES: dict[str, tuple[bytes, bool]] = {
    "content-length": (b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"ok":true}', False),
    "chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        False,
    ),
    "close-delimited": (b"HTTP/1.1 200 OK\r\n\r\nuntil the close", True),
    "connection-close": (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye",
        True,
    ),
    "http-1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold", True),
    "interim-1xx": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
        False,
    ),
    "no-content": (b"HTTP/1.1 204 No Content\r\n\r\n", False),
    "error-status": (b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", False),
    "short-body": (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", True),
    "chunked-cut": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", True),
    "no-answer": (b"", True),
}


@contextlib.asynccontextmanager
async def scripted(first: bytes, close: bool) -> AsyncIterator[tuple[int, list[int]]]:
    """A server on a free port whose first answer is ``first``; its port and the number of
    connections it accepted (in a one-item list, read after the requests)."""
    accepted = [0]
    answered = [0]
    handlers: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            while True:
                await read_request(reader)
                answered[0] += 1
                if answered[0] == 1:
                    writer.write(first)
                    await writer.drain()
                    if close:
                        return
                else:
                    writer.write(AFTER)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
        # the clients have closed their connections: each handler ends on its EOF
        await asyncio.gather(*handlers, return_exceptions=True)
    finally:
        server.close()
        await server.wait_closed()


Outcome = tuple[object, ...]


#: A refused answer: each client raises its own kind (``UpstreamBroken`` or
#: ``UpstreamUnreachable`` here, a ``TransportError`` in httpx), so what is compared is that the
#: answer was refused, never passed off as a whole one.
FAILED: Outcome = ("failed",)


async def ours(port: int, accepted: list[int]) -> Outcome:
    pool = Http1Pool(keepalive_s=30.0)
    origin = Origin("http", "127.0.0.1", port)
    head = request_head("POST", PATH, origin.host_header(), []).encode()
    try:
        try:
            resp = await pool.request(origin, head, b"{}")
            try:
                first: Outcome = (resp.status, await resp.read())
            finally:
                resp.release()
        except (UpstreamBroken, UpstreamUnreachable):
            first = FAILED
        resp = await pool.request(origin, head, b"{}")
        try:
            second = (resp.status, await resp.read())
        finally:
            resp.release()
        return (first, second, accepted[0])
    finally:
        await pool.close()


async def theirs(port: int, accepted: list[int]) -> Outcome:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        try:
            r = await client.post(PATH, content=b"{}")
            first: Outcome = (r.status_code, r.content)
        except httpx.TransportError:
            first = FAILED
        r = await client.post(PATH, content=b"{}")
        return (first, (r.status_code, r.content), accepted[0])


@pytest.mark.parametrize("case", list(CASES))
async def test_the_relay_client_reads_an_answer_as_httpx_does(case: str) -> None:
    raw, close = CASES[case]
    async with asyncio.timeout(SAFETY_S):
        async with scripted(raw, close) as (port, accepted):
            got = await ours(port, accepted)
        async with scripted(raw, close) as (port, accepted):
            want = await theirs(port, accepted)
    assert got == want
    assert got[1] == (200, b"later")  # the second request is always answered
