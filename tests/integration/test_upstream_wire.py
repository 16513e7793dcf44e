"""What the upstream client puts on the wire, byte for byte, and how it reuses connections.

The client's per-request work is cut for speed (headers built once per connection, no
User-Agent by a request class, the whole answer taken in one read); these tests pin what a provider
receives so that no such cut can change it: the request line, every header and its value,
no ``User-Agent``, the body as given, and one keep-alive connection for requests in a row.
Real HTTP over loopback against a raw asyncio server that records the bytes it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from http_support import answering

from fairgate.domain.connections import AuthType, Connection, Protocol
from fairgate.providers.transport import UpstreamBroken
from fairgate.providers.upstream import UpstreamClient

ANSWER = b'{"id":"x","object":"chat.completion","choices":[]}'
OK_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
    + ANSWER
)


@dataclass
class Recorder:
    """What a raw loopback server was sent: each request's head lines and body, and the
    connection (its number in accept order) each request came on."""

    port: int = 0
    requests: list[tuple[list[str], bytes, int]] = field(default_factory=list)

    def head(self, i: int) -> list[str]:
        return self.requests[i][0]


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()

    def answer(conn_no: int, lines: list[str], body: bytes) -> tuple[bytes, bool]:
        rec.requests.append((lines, body, conn_no))
        return OK_ANSWER, False

    async with answering(answer) as server:
        rec.port = server.port
        yield rec


def _conn(rec: Recorder, provider: str = "openai", **kw: object) -> Connection:
    return Connection(
        id="c",
        provider=provider,
        base_url=f"http://127.0.0.1:{rec.port}/v1",
        secret="sk-secret",
        **kw,  # type: ignore[arg-type]
    )


async def _post(
    client: UpstreamClient, conn: Connection, body: bytes, client_headers: dict[str, str]
) -> bytes:
    resp = await client.post(conn, "/chat/completions", body, client_headers)
    try:
        assert resp.status == 200
        return await resp.read()
    finally:
        resp.release()


async def test_an_openai_request_sends_exactly_our_headers_and_the_body(
    recorder: Recorder,
) -> None:
    conn = _conn(recorder, forward_headers=("openai-project",))
    body = b'{"model":"m","messages":[{"role":"user","content":"hi \xc3\xa9"}]}'
    async with UpstreamClient() as client:
        answer = await _post(client, conn, body, {"openai-project": "p1", "x-other": "no"})
    assert answer == ANSWER
    assert recorder.head(0) == [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: 127.0.0.1:{recorder.port}",
        "content-type: application/json",
        "accept-encoding: identity",
        "authorization: Bearer sk-secret",
        "openai-project: p1",
        "Accept: */*",
        f"Content-Length: {len(body)}",
    ]
    assert recorder.requests[0][1] == body


async def test_anthropic_requests_send_their_own_headers_and_the_wires_functional_ones(
    recorder: Recorder,
) -> None:
    """Issue 42, item 9: ``anthropic-beta`` (and ``anthropic-version``) reach an Anthropic
    connection without a ``forward_headers`` entry (Claude Code's beta features need them);
    other client headers do not, and an OAuth connection's flag is merged, each flag once."""
    key = _conn(recorder, protocol=Protocol.ANTHROPIC, provider="anthropic")
    oauth = _conn(
        recorder, protocol=Protocol.ANTHROPIC, provider="anthropic", auth_type=AuthType.OAUTH
    )
    async with UpstreamClient() as client:
        await _post(client, key, b"{}", {"user-agent": "sdk", "openai-project": "p"})
        await _post(client, oauth, b"{}", {})
        await _post(client, key, b"{}", {"anthropic-beta": "context-1m-2025-08-07"})
        beta = {"anthropic-beta": "oauth-2025-04-20,interleaved-thinking-2025-05-14"}
        await _post(client, oauth, b"{}", beta)
    host = f"Host: 127.0.0.1:{recorder.port}"
    common = ["content-type: application/json", "accept-encoding: identity"]
    tail = ["Accept: */*", "Content-Length: 2"]
    assert recorder.head(0) == [
        "POST /v1/chat/completions HTTP/1.1",
        host,
        *common,
        "x-api-key: sk-secret",
        "anthropic-version: 2023-06-01",
        *tail,
    ]
    assert recorder.head(1) == [
        "POST /v1/chat/completions HTTP/1.1",
        host,
        *common,
        "authorization: Bearer sk-secret",
        "anthropic-version: 2023-06-01",
        "anthropic-beta: oauth-2025-04-20",
        *tail,
    ]
    assert recorder.head(2) == [
        "POST /v1/chat/completions HTTP/1.1",
        host,
        *common,
        "x-api-key: sk-secret",
        "anthropic-version: 2023-06-01",
        "anthropic-beta: context-1m-2025-08-07",
        *tail,
    ]
    assert "anthropic-beta: oauth-2025-04-20,interleaved-thinking-2025-05-14" in recorder.head(3)


async def test_requests_in_a_row_reuse_one_connection_whether_read_or_released_unread(
    recorder: Recorder,
) -> None:
    conn = _conn(recorder)
    async with UpstreamClient() as client:
        for _ in range(3):
            assert await _post(client, conn, b"{}", {}) == ANSWER
        resp = await client.post(conn, "/chat/completions", b"{}", {})
        resp.release()  # unread: aiohttp keeps the connection, the body is still in flight
        assert await _post(client, conn, b"{}", {}) == ANSWER
        resp = await client.post(conn, "/chat/completions", b"{}", {})
        assert await resp.read() == ANSWER
        assert await resp.read() == ANSWER  # a second read answers the same bytes
        resp.release()
        resp.release()  # releasing twice is harmless
        assert await _post(client, conn, b"{}", {}) == ANSWER
    assert len(recorder.requests) == 7
    assert {c for _, _, c in recorder.requests} == {1}


async def test_a_plain_send_sends_its_own_headers_and_body(recorder: Recorder) -> None:
    async with UpstreamClient() as client:
        resp = await client.send(
            "POST",
            f"http://127.0.0.1:{recorder.port}/oauth/token",
            body=b"grant_type=refresh_token",
            headers={"content-type": "application/x-www-form-urlencoded"},
            timeout_s=5,
        )
        try:
            assert resp.status == 200
            assert await resp.read() == ANSWER
        finally:
            resp.release()
    lines = recorder.head(0)
    assert lines[0] == "POST /oauth/token HTTP/1.1"
    assert "content-type: application/x-www-form-urlencoded" in lines
    assert not [line for line in lines if line.lower().startswith("user-agent")]
    # nothing decompresses the answer, so none is asked for compressed
    assert [line for line in lines if line.lower().startswith("accept-encoding")] == [
        "accept-encoding: identity"
    ]
    assert recorder.requests[0][1] == b"grant_type=refresh_token"


async def _serve_raw(answer: list[bytes], pause_s: float) -> tuple[asyncio.Server, int]:
    """A server that reads one request head, writes ``answer``'s pieces ``pause_s`` apart and
    closes the connection ``pause_s`` after the last."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for i, piece in enumerate(answer):
                if i:
                    await asyncio.sleep(pause_s)
                writer.write(piece)
                await writer.drain()
            await asyncio.sleep(pause_s)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_body_that_arrives_after_its_head_is_read_whole() -> None:
    """The read that takes a body from aiohttp's buffer in one call must not be taken while
    the body is still on its way (aiohttp's own read waits for the rest)."""
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(ANSWER)}\r\n\r\n".encode()
    server, port = await _serve_raw([head, ANSWER[:10], ANSWER[10:]], 0.05)
    conn = Connection(id="c", provider="openai", base_url=f"http://127.0.0.1:{port}/v1", secret="s")
    try:
        async with UpstreamClient() as client:
            resp = await client.post(conn, "/chat/completions", b"{}", {})
            assert await resp.read() == ANSWER
            assert await resp.read() == ANSWER
            resp.release()
        await asyncio.sleep(0.1)  # the server's side closes
    finally:
        server.close()
        await server.wait_closed()


async def test_a_body_cut_short_is_a_broken_answer_not_a_short_one() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    for pause_s in (0.0, 0.05):  # cut with the head, or after a wait
        server, port = await _serve_raw([head + ANSWER[:10]], pause_s)
        conn = Connection(
            id="c", provider="openai", base_url=f"http://127.0.0.1:{port}/v1", secret="s"
        )
        try:
            async with UpstreamClient() as client:
                resp = await client.post(conn, "/chat/completions", b"{}", {})
                with pytest.raises(UpstreamBroken):
                    await resp.read()
                resp.release()
            await asyncio.sleep(pause_s + 0.05)  # the server's side closes
        finally:
            server.close()
            await server.wait_closed()


async def test_a_responses_connection_forwards_openai_beta_and_no_billing_header(
    recorder: Recorder,
) -> None:
    """Issue 42, item 9: the Responses wire's ``OpenAI-Beta`` passes by default; the headers
    that choose who is billed do not."""
    conn = _conn(recorder, protocol=Protocol.RESPONSES)
    async with UpstreamClient() as client:
        sent = {"openai-beta": "responses=experimental", "openai-organization": "org-x"}
        await _post(client, conn, b"{}", sent)
    head = recorder.head(0)
    assert "openai-beta: responses=experimental" in head
    assert not any(line.startswith("openai-organization") for line in head)
