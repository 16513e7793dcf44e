"""Reading what an HTTP client sent, for the raw loopback servers of the upstream client's
tests (``test_upstream_wire.py``, ``test_http1.py``): they record requests byte for byte, so
they parse the request themselves instead of running a real HTTP server."""

from __future__ import annotations

import asyncio


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
