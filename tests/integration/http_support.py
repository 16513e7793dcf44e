"""HTTP on loopback for the integration tests.

Reading what an HTTP client sent, for the raw loopback servers of the upstream client's tests
(``test_upstream_wire.py``, ``test_http1.py``): they record requests byte for byte, so they parse
the request themselves instead of running a real HTTP server. And serving an ASGI app for real
(uvicorn on a free loopback port), for the tests that drive the gateway or its admin API over
the network (``test_admin_api.py``, ``test_tenancy.py``, ``test_tracing.py`` ...)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn


async def serve(app: Any, **options: Any) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """Serve ``app`` with uvicorn on a free loopback port (``options`` go to ``uvicorn.Config``)
    and wait until it listens: the server (set ``should_exit`` and await the task to stop it),
    its task and its base URL. Fails the test when it does not start within ten seconds."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(1000):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


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
