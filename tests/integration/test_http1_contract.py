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
from http_support import Answering, answering

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
async def scripted(first: bytes, close: bool) -> AsyncIterator[Answering]:
    """A server on a free port whose first answer is ``first`` (closing after it or not) and
    every later one :data:`AFTER`; how many connections it accepted is read after the
    requests."""
    answered = 0

    def answer(_conn: int, _lines: list[str], _body: bytes) -> tuple[bytes, bool]:
        nonlocal answered
        answered += 1
        return (first, close) if answered == 1 else (AFTER, False)

    async with answering(answer) as server:
        yield server
        # the clients have closed their connections: each handler ends on its EOF
        await server.finished()


Outcome = tuple[object, ...]


#: A refused answer: each client raises its own kind (``UpstreamBroken`` or
#: ``UpstreamUnreachable`` here, a ``TransportError`` in httpx), so what is compared is that the
#: answer was refused, never passed off as a whole one.
FAILED: Outcome = ("failed",)


async def ours(server: Answering) -> Outcome:
    pool = Http1Pool(keepalive_s=30.0)
    origin = Origin("http", "127.0.0.1", server.port)
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
        return (first, second, server.accepted)
    finally:
        await pool.close()


async def theirs(server: Answering) -> Outcome:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        try:
            r = await client.post(PATH, content=b"{}")
            first: Outcome = (r.status_code, r.content)
        except httpx.TransportError:
            first = FAILED
        r = await client.post(PATH, content=b"{}")
        return (first, (r.status_code, r.content), server.accepted)


@pytest.mark.parametrize("case", list(CASES))
async def test_the_relay_client_reads_an_answer_as_httpx_does(case: str) -> None:
    raw, close = CASES[case]
    async with asyncio.timeout(SAFETY_S):
        async with scripted(raw, close) as server:
            got = await ours(server)
        async with scripted(raw, close) as server:
            want = await theirs(server)
    assert got == want
    assert got[1] == (200, b"later")  # the second request is always answered
