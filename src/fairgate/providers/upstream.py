"""Sending a request to a connection: per-protocol auth headers, the relayed requests' pool.

The real implementation of the :class:`~fairgate.providers.transport.Upstream` port. A relayed
request goes out through :mod:`fairgate.providers.http1` (a small keep-alive HTTP/1.1 client:
aiohttp's client cost more per request than the rest of a request with no pool), with a head
built once per connection and path when the client can add nothing to it. The gateway's side
calls (:meth:`UpstreamClient.send`: OAuth token endpoints, connection tests) go through an
aiohttp session, the only one of the request path: its answer is wrapped in
:class:`_AiohttpResponse` and its errors become the port's (``UpstreamUnreachable``,
``UpstreamBroken``, ``TimeoutError``) here, as :mod:`~fairgate.providers.http1` raises them
itself, so nothing past this module knows which HTTP client sent a request.
"""

from __future__ import annotations

import ssl
import typing
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from dataclasses import replace

import aiohttp
from yarl import URL

from fairgate.domain.connections import Connection, Protocol
from fairgate.domain.tokens import TokenSet
from fairgate.providers.closing import AsyncClosing
from fairgate.providers.http1 import Http1Pool, Origin, PoolStats, request_head
from fairgate.providers.oauth import OAuthBlocked, OAuthUnavailable, chatgpt_account_id
from fairgate.providers.transport import UpstreamBroken, UpstreamResponse, UpstreamUnreachable


class UpstreamAuthUnavailable(ConnectionError):
    """No usable OAuth access token for the connection (blocked or the token endpoint is
    down): the attempt fails like an unreachable upstream and the request moves on to the next
    target. The reason is in the health view; the message names no token."""


class ManagedTokens(typing.Protocol):
    """What the transport needs of :class:`fairgate.providers.oauth.OAuthTokens`."""

    def manages(self, connection_id: str) -> bool: ...

    async def access(self, connection_id: str) -> TokenSet: ...

    async def unauthorized(self, connection_id: str, used_access_token: str) -> TokenSet: ...

    def accepted(self, connection_id: str, access_token: str) -> None: ...


ANTHROPIC_VERSION = "2023-06-01"
#: The ``anthropic-beta`` flag that lets an OAuth (subscription) access token call the API.
ANTHROPIC_OAUTH_BETA = "oauth-2025-04-20"


def _note_accepted(oauth: ManagedTokens, conn_id: str, access_token: str, status: int) -> None:
    """A 2xx/3xx proves the provider takes ``access_token``: the token's one refresh-on-401 is
    no longer spent (issue 43, N10). An error status proves nothing about the token (a 403 or
    5xx may come before or without the token check), so it keeps the mark."""
    if status < 400:
        oauth.accepted(conn_id, access_token)


class _PerConnection:
    """What a request to a connection sends that depends on the connection only (our headers,
    its origin, the request's head by path), built once per connection object instead of per
    request. A connection is frozen and replaced as a whole when it changes, so the object (or
    an equal copy) identifies its entry; the cache starts over when it holds too many
    (connections are few).

    A request with nothing of the client's to add (no header :func:`forwarded_names` lists)
    sends the head kept here as it is, its length and the body appended."""

    __slots__ = ("_by_id",)

    MAX = 4096

    def __init__(self) -> None:
        self._by_id: dict[str, _Entry] = {}

    def _entry(self, conn: Connection) -> _Entry:
        hit = self._by_id.get(conn.id)
        # the same object, or an equal one: an OAuth connection's request carries a copy with
        # the current access token (``_post_oauth``), equal to the last while the token holds,
        # so the entry is rebuilt when the token changes, not on every request
        if hit is None or (hit[0] is not conn and hit[0] != conn):
            if len(self._by_id) >= self.MAX:
                self._by_id.clear()
            hit = self._by_id[conn.id] = (conn, _own_headers(conn), {})
        return hit

    def headers(self, conn: Connection) -> dict[str, str]:
        return self._entry(conn)[1]

    def target(self, conn: Connection, path: str) -> _Target:
        _, own, targets = self._entry(conn)
        found = targets.get(path)
        if found is None:
            url = URL(upstream_url(conn, path))
            origin = Origin.of(url)
            target, host = url.raw_path_qs, origin.host_header()
            head = request_head("POST", target, host, own.items()).encode()
            found = targets[path] = _Target(origin, target, host, head, forwarded_names(conn))
        return found


class _Target(typing.NamedTuple):
    """Where a request to one path of a connection goes, its head with our headers only, and
    the client headers that may add to it (a request that carries none of them sends the head
    as it is)."""

    origin: Origin
    path: str
    host: str
    head: bytes
    forwarded: tuple[str, ...]


#: A connection's cached part: the object it was built from, our headers, its targets by path.
_Entry = tuple[Connection, dict[str, str], dict[str, _Target]]


_PER_CONNECTION = _PerConnection()


def _own_headers(conn: Connection) -> dict[str, str]:
    """Our headers for ``conn`` (auth, protocol version, content type)."""
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if conn.protocol is Protocol.ANTHROPIC and conn.auth_type == "oauth":
        # a Claude subscription: its OAuth access token as a bearer, and the beta flag
        # Anthropic requires beside one
        headers["authorization"] = f"Bearer {conn.secret}"
        headers["anthropic-version"] = ANTHROPIC_VERSION
        headers["anthropic-beta"] = ANTHROPIC_OAUTH_BETA
    elif conn.protocol is Protocol.ANTHROPIC:
        headers["x-api-key"] = conn.secret
        headers["anthropic-version"] = ANTHROPIC_VERSION
    else:
        headers["authorization"] = f"Bearer {conn.secret}"
    if conn.protocol is Protocol.RESPONSES:
        # the Codex backend wants the account the token belongs to, as the Codex CLI sends it
        account = chatgpt_account_id(conn.secret)
        if account is not None:
            headers["chatgpt-account-id"] = account
        headers["accept"] = "text/event-stream"
    return headers


#: Client headers forwarded by default to a connection of each wire (issue 42, item 9): the
#: functional ones a client of that wire needs, none that chooses who is billed. Anthropic's
#: ``anthropic-beta`` switches on what the client's request uses (a beta field, tool or
#: behaviour: without it the provider refuses the request) and ``anthropic-version`` is the
#: API version the client's body is written for; ``OpenAI-Beta`` does the same for the
#: Responses API. ``openai-organization`` / ``openai-project`` stay blocked unless a
#: connection lists them in ``forward_headers``: on a shared account they would let a tenant
#: choose who is billed.
WIRE_HEADERS: Mapping[Protocol, tuple[str, ...]] = {
    Protocol.ANTHROPIC: ("anthropic-beta", "anthropic-version"),
    Protocol.RESPONSES: ("openai-beta",),
    Protocol.OPENAI: (),
}


def forwarded_names(conn: Connection) -> tuple[str, ...]:
    """The client headers a request to ``conn`` carries when the client sends them: its wire's
    defaults (:data:`WIRE_HEADERS`) and its ``forward_headers`` allow-list."""
    extra = tuple(n for n in conn.forward_headers if n not in WIRE_HEADERS[conn.protocol])
    return WIRE_HEADERS[conn.protocol] + extra


def _merged_beta(ours: str, theirs: str) -> str:
    """Our ``anthropic-beta`` flags (an OAuth connection's) and the client's, each once."""
    flags = [f.strip() for f in f"{ours},{theirs}".split(",") if f.strip()]
    return ",".join(dict.fromkeys(flags))


def upstream_headers(conn: Connection, client_headers: Mapping[str, str]) -> dict[str, str]:
    """Our headers for ``conn``, plus the client headers it forwards (:func:`forwarded_names`):
    its wire's functional headers and what its ``forward_headers`` allow-list names. A new
    dict per call (the caller's to change); our own part is built once per connection."""
    headers = dict(_PER_CONNECTION.headers(conn))
    for name in forwarded_names(conn):
        value = client_headers.get(name)
        if value:
            ours = headers.get(name)
            headers[name] = (
                _merged_beta(ours, value) if name == "anthropic-beta" and ours else value
            )
    return headers


def upstream_url(conn: Connection, path: str) -> str:
    """``base_url`` ends with the API version (``.../v1``) as in the official SDKs."""
    return conn.base_url.rstrip("/") + path


class _AiohttpResponse:
    """aiohttp's answer behind the port; read errors become :class:`UpstreamBroken`.

    A whole answer that has arrived with its head (a small JSON answer usually has: one
    segment) is taken from aiohttp's buffer in one call, without the four coroutines of
    ``ClientResponse.read``; aiohttp has handed the connection back to the pool at the
    body's end already. After a whole read :meth:`release` does nothing: aiohttp's would only
    mark a stream that is at its end as closed (a few thousand instructions for nothing)."""

    __slots__ = ("_body", "_resp")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._body: bytes | None = None

    @property
    def status(self) -> int:
        return self._resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read(self) -> bytes:
        if self._body is not None:
            return self._body
        try:
            content = self._resp.content
            if content.is_eof() and content.exception() is None:
                body = content.read_nowait()  # all of it is here: no waiting, no coroutine
            else:
                body = await self._resp.read()
        except TimeoutError:
            raise  # aiohttp's timeouts are TimeoutErrors: a timeout, not a broken answer
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc
        self._body = body
        return body

    async def read_prefix(self, limit: int) -> bytes:
        try:
            return await self._resp.content.read(limit)
        except TimeoutError:
            raise  # aiohttp's timeouts are TimeoutErrors: a timeout, not a broken answer
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for raw in self._resp.content.iter_any():
                yield raw
        except TimeoutError:
            raise  # aiohttp's timeouts are TimeoutErrors: a timeout, not a broken answer
        except aiohttp.ClientError as exc:
            raise UpstreamBroken(type(exc).__name__) from exc

    def release(self) -> None:
        if self._body is None:
            self._resp.release()


class _Request(aiohttp.ClientRequest):
    """aiohttp's request, less its ``User-Agent``: our requests carry none (a provider has no
    use for aiohttp's and Python's versions). ``skip_auto_headers=("User-Agent",)`` on the
    session says the same, but makes aiohttp build a sorted ``CIMultiDict`` of the names
    skipped and a copy of the request's headers for every request; here aiohttp's other
    default headers (``Accept``, ``Accept-Encoding``) are added as aiohttp adds them, each
    only when the request has not set it."""

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if skip_auto_headers is not None:  # never from us: aiohttp's own handling
            super().update_auto_headers(skip_auto_headers)
            return
        headers = self.headers
        for name, value in self.DEFAULT_HEADERS.items():
            if name not in headers:
                headers[name] = value


class UpstreamClient(AsyncClosing):
    """The relayed requests' keep-alive pool (:mod:`fairgate.providers.http1`) and, for the
    gateway's side calls, an aiohttp session made on first use; created inside the running
    loop. Also the :class:`~fairgate.providers.transport.HttpSender` of those side calls."""

    def __init__(
        self,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        idle_per_origin: int = 32,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=timeout_s
        )
        self._pool = Http1Pool(
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=timeout_s,
            max_idle_per_origin=idle_per_origin,
            ssl_context=ssl_context,
        )
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None
        #: access tokens of ``auth_type: oauth`` connections (None: every secret is static)
        self.oauth: ManagedTokens | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0, ttl_dns_cache=300, keepalive_timeout=60, ssl=self._ssl or True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                request_class=_Request,  # no User-Agent (see there)
                # no cookies kept: the session is shared by every connection (account) and
                # every client key, so a cookie one upstream answer set (a load balancer's,
                # a session's) would otherwise ride along on another account's requests
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    def post(
        self,
        conn: Connection,
        path: str,
        body: bytes,
        client_headers: Mapping[str, str],
    ) -> Awaitable[UpstreamResponse]:
        oauth = self.oauth
        if oauth is None or conn.auth_type != "oauth" or not oauth.manages(conn.id):
            # a static secret, the usual case: the pool's own coroutine, no frame of ours
            return self._send(conn, path, body, client_headers)
        return self._post_oauth(oauth, conn, path, body, client_headers)

    async def _post_oauth(
        self,
        oauth: ManagedTokens,
        conn: Connection,
        path: str,
        body: bytes,
        client_headers: Mapping[str, str],
    ) -> UpstreamResponse:
        try:
            tokens = await oauth.access(conn.id)
            resp = await self._send(
                replace(conn, secret=tokens.access_token), path, body, client_headers
            )
            if resp.status != 401:
                _note_accepted(oauth, conn.id, tokens.access_token, resp.status)
                return resp
            resp.release()  # the token was refused: refresh once (never in a loop) and retry
            tokens = await oauth.unauthorized(conn.id, tokens.access_token)
        except (OAuthBlocked, OAuthUnavailable) as exc:
            raise UpstreamAuthUnavailable(str(exc)) from None
        resp = await self._send(
            replace(conn, secret=tokens.access_token), path, body, client_headers
        )
        _note_accepted(oauth, conn.id, tokens.access_token, resp.status)
        return resp

    def _send(
        self, conn: Connection, path: str, body: bytes, client_headers: Mapping[str, str]
    ) -> Awaitable[UpstreamResponse]:
        """The pool's request, to be awaited by the caller; the head is the cached one unless
        the client sent a header the connection forwards."""
        target = _PER_CONNECTION.target(conn, path)
        head = target.head
        if any(name in client_headers for name in target.forwarded):
            headers = upstream_headers(conn, client_headers)
            head = request_head("POST", target.path, target.host, headers.items()).encode()
        return self._pool.request(target.origin, head, body)

    async def send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> UpstreamResponse:
        sent = dict(headers)
        if not any(name.lower() == "accept-encoding" for name in sent):
            # the session does not decompress (the relay passes bytes through): ask for the
            # answer as it is, or a token endpoint that compresses would answer bytes that
            # do not parse (aiohttp's default asks for gzip and deflate)
            sent["accept-encoding"] = "identity"
        try:
            resp = await self.session.request(
                method,
                url,
                data=body,
                headers=sent,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            )
        except TimeoutError:
            raise  # aiohttp's timeouts are TimeoutErrors: a timeout, not an unreachable host
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable(type(exc).__name__) from exc
        return _AiohttpResponse(resp)

    def stats(self) -> PoolStats:
        """The relayed requests' connections: open, and of those idle (``/health``)."""
        return self._pool.stats()

    async def close(self) -> None:
        await self._pool.close()
        if self._session is not None and not self._session.closed:
            await self._session.close()
