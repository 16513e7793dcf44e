"""The upstream port: how the request path talks to a provider, in fairgate's own types.

The request path needs four things of an upstream answer: its status, its headers, its body
(whole, the first few KiB of an error, or as chunks for a stream) and a way to give the
connection back. :class:`UpstreamResponse` is exactly that, and :class:`Upstream` is the one
call that produces it. The real implementation is :class:`fairgate.providers.upstream.
UpstreamClient` (its relayed requests on :mod:`fairgate.providers.http1`); tests drive the
whole path through :class:`fairgate.providers.inprocess.HandlerUpstream`, a handler function
in the same process (as httpx's ``MockTransport`` does for httpx).

Failures are fairgate's too: :class:`UpstreamUnreachable` (no answer: refused, reset, DNS) and
:class:`UpstreamBroken` (the answer broke off while being read) are ``ConnectionError``\\ s, so
the failure classification treats them as the network errors they are; a read that took too
long is a plain ``TimeoutError``. The request path catches :data:`TRANSPORT_ERRORS` only.

The side calls that are not a client's request (``fairgate connections test``, an OAuth token
refresh) go through :class:`HttpSender`, the same client's plain "send this request" call, so
aiohttp stays inside :mod:`fairgate.providers.upstream` (and the mock provider) alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Protocol

from fairgate.domain.connections import Connection

__all__ = [
    "TRANSPORT_ERRORS",
    "HttpSender",
    "Upstream",
    "UpstreamBroken",
    "UpstreamResponse",
    "UpstreamUnreachable",
]


class UpstreamUnreachable(ConnectionError):
    """The upstream could not be reached (connection refused or reset before an answer)."""


class UpstreamBroken(ConnectionError):
    """The upstream's answer broke off while it was being read."""


#: What an upstream call or read may raise besides a bug (``OSError`` covers the two above).
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, OSError)


class UpstreamResponse(Protocol):
    """One upstream answer. ``headers`` are case-insensitive. Reading consumes the body once;
    :meth:`release` gives the connection back (idempotent, also after a full read)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    async def read_prefix(self, limit: int) -> bytes:
        """At most ``limit`` bytes of the body (an error message; bodies can be huge)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a stream), chunk by chunk."""
        ...

    def release(self) -> None: ...


class Upstream(Protocol):
    """Sends one request body to a connection's ``path`` (``/chat/completions``, …) with the
    client's headers (the implementation decides which go through, and adds the credentials).
    An awaitable, not necessarily a coroutine function: the real client hands back its pool's
    coroutine without a frame of its own."""

    def post(
        self, conn: Connection, path: str, body: bytes, client_headers: Mapping[str, str]
    ) -> Awaitable[UpstreamResponse]: ...

    async def close(self) -> None: ...


class HttpSender(Protocol):
    """One plain HTTP request, sent as given: no credentials or headers are added. For the
    gateway's own side calls (a connection test, an OAuth token refresh); ``timeout_s`` bounds
    the whole exchange, body included. Raises what :meth:`Upstream.post` raises."""

    async def send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> UpstreamResponse: ...
