"""A small keep-alive HTTP/1.1 client for the relayed requests: one protocol object per
connection, httptools' response parser, a pool of idle connections per origin.

Why not aiohttp's client here: a relayed request is one ``POST`` with a body we hold whole, to
a handful of origins, answered by one response that is read whole or relayed as it arrives.
aiohttp's client builds a ``ClientRequest``, a ``ClientResponse``, a timer context, a task that
writes the body and a connector lease per request: more instructions than the rest of a
request to a model without a quota pool. What a relayed request needs costs a fraction of that
(docs/performance.md, "Figures behind the code"): the head and body written in one call, the
answer parsed by the same C parser (llhttp) aiohttp and uvicorn use, and the connection handed
back. Everything else the gateway
sends (OAuth token endpoints, connection tests: rare, general) stays on aiohttp.

What it does, as an experienced user of an HTTP client expects:

- **Keep-alive pool** per origin (scheme, host, port), newest idle connection first, an idle
  connection kept ``keepalive_s`` (60 s, as aiohttp's connector) and closed once it has been
  idle that long (each at its own time, not at the next pass of a periodic sweep). At most
  ``max_idle_per_origin`` (32) idle connections are kept per origin, as urllib3's pool size and
  Go's ``MaxIdleConnsPerHost`` bound theirs: connections in use are not limited (the slots
  limit concurrency), but a burst of a few hundred concurrent calls would otherwise leave a few
  hundred idle sockets open for the next ``keepalive_s``. Past the bound the connections idle
  longest are closed once they have been idle ``over_bound_idle_s`` (2 s), not at once: under a
  steady load above the bound (64 concurrent calls against 32) some connections are always
  momentarily idle, and closing each as it came back opened a new one for the next call (868
  new connections to the upstream in 3 s at c64, 16 % of the calls: with TLS a handshake
  each), where urllib3 and Go close them at once. Connections open = in use + idle, and idle
  <= the bound per origin once the excess has been idle 2 s: that is what a gateway at rest
  holds (:meth:`Http1Pool.stats`, ``/health`` → ``upstream``).
- **A connection the server closed while idle is never used**: its close is seen by the
  protocol and the pool passes it over. A request written to a reused connection that closes
  before any answer is *not* sent again: the server may have read it and acted on it (a model
  call is billed), so it is :class:`UpstreamUnreachable` and the request path's one failover
  rule decides (retry the target or the next candidate), as with aiohttp's client, which
  does not resend a ``POST`` either.
- **Bodies** by ``Content-Length``, chunked (decoded by the parser) or delimited by the close;
  a body cut short is :class:`UpstreamBroken`, never a short body. Interim ``1xx`` answers are
  skipped.
- **Happy Eyeballs** for a host with several addresses (IPv6 and IPv4): the next address is
  tried 0.25 s after the last one started, as aiohttp's connector does.
- **Deadlines**: connecting (``connect_timeout_s``, resolving and TLS handshake included) and
  reading (``read_timeout_s`` without a byte while the caller waits, as aiohttp's
  ``sock_read``); either is a ``TimeoutError``, and the connection is closed.
- **TLS** for ``https`` with the system's trust store (``ssl.create_default_context()``, as
  aiohttp's default) and SNI, or a context given.
- **Flow control** for a stream: reading pauses while more than 1 MiB of a relayed stream waits
  for the client, and resumes as it is taken.
- **Errors** are the upstream port's: :class:`UpstreamUnreachable` before the answer's head
  (refused, reset, closed, TLS, a malformed head), :class:`UpstreamBroken` after it.

A connection whose answer was not read to its end is closed when released, never reused (its
leftover bytes would be read as the next answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import typing
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import NamedTuple

import aiohappyeyeballs
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from fairgate.providers.transport import UpstreamBroken, UpstreamUnreachable

__all__ = ["Http1Pool", "Http1Response", "Origin", "PoolStats", "request_head"]

#: A relayed stream's bytes buffered for a slow client before reading pauses.
HIGH_WATER = 1 << 20
#: The most bytes an answer's head may take (status line, headers, interim answers): an
#: upstream that sends headers without end is refused, not buffered (aiohttp's limits are
#: 8 KiB a line; a provider's heads are a few KiB).
MAX_HEAD = 256 * 1024
#: Happy Eyeballs: how long one address may try to connect before the next one starts too.
HAPPY_EYEBALLS_DELAY_S = 0.25
#: The sweeper closes a connection due this close to its expiry (a timer may fire a little
#: early: loop clocks round to their resolution).
_SWEEP_SLACK_S = 0.001


#: The port a URL of each scheme means when it names none (and a ``Host`` header omits).
_DEFAULT_PORT = {"http": 80, "https": 443}


class Origin(NamedTuple):
    """Where a connection goes: the pool's key."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: URL) -> Origin:
        scheme = url.scheme
        if scheme not in _DEFAULT_PORT or not url.host:
            raise ValueError(f"not an http(s) URL: {url.scheme}://{url.host}")
        return cls(scheme, url.host, url.explicit_port or _DEFAULT_PORT[scheme])

    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORT[self.scheme] else f"{host}:{self.port}"


def request_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]]) -> str:
    """A request's head up to (not including) its ``Content-Length`` line, which the send adds:
    ``headers`` in order, then ``Accept: */*`` when they name no ``Accept`` (what aiohttp added,
    so a provider sees the same request as before). A header that could split the head (a CR or
    LF, from a client's forwarded header) is refused here, before anything is sent."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n"]
    accept = False
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} holds a line break or a colon")
        if not accept and name.lower() == "accept":
            accept = True
        lines.append(f"{name}: {value}\r\n")
    if not accept:
        lines.append("Accept: */*\r\n")
    lines.append("Content-Length: ")
    return "".join(lines)


def _close_delimited(headers: CIMultiDictProxy[str]) -> bool:
    """Whether an answer's body ends with its connection: neither a length nor chunks (asked
    only when a connection closes mid-answer, so it is not worked out per answer)."""
    return "content-length" not in headers and (
        "chunked" not in headers.get("transfer-encoding", "").lower()
    )


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the exchange on it; the parser's callbacks land here."""

    __slots__ = (
        "_body_size",
        "_chunks",
        "_head_size",
        "_interim",
        "_last_read",
        "_loop",
        "_paused",
        "_raw_headers",
        "_streaming",
        "_timer",
        "_waiter",
        "closed",
        "complete",
        "error",
        "headers",
        "idle_since",
        "keep_alive",
        "origin",
        "parser",
        "pool",
        "pooled",
        "status",
        "transport",
    )

    def __init__(self, pool: Http1Pool, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.origin = origin
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.pooled = False  # in the pool's idle deque of its origin
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: CIMultiDictProxy[str] | None = None
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._chunks: list[bytes] = []
        self._body_size = 0
        self.complete = False
        self.keep_alive = False
        self.error: Exception | None = None
        self._interim = False
        self._streaming = False
        self._paused = False

    # -- asyncio's protocol callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's does not subclass asyncio.Transport: no isinstance)
        self.transport = typing.cast(asyncio.Transport, transport)
        self.pool.open += 1

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        if self.complete or self.error is not None:  # bytes nobody asked for: unusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools' parse errors (and an upgrade we never asked for)
            self._fail(type(exc).__name__)
            self.close()
            return
        if self.headers is None:  # still in the head: bounded, as every HTTP client bounds it
            self._head_size += len(data)
            if self._head_size > MAX_HEAD:
                self._fail("HeadTooLarge")
                self.close()

    def eof_received(self) -> bool:
        self.closed = True  # never taken from the pool again, even before connection_lost
        if self.pooled:
            self.pool.discard(self)
        return False  # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.open -= 1  # asyncio calls this once, after connection_made
        if self.pooled:  # the server closed it while idle: it leaves the pool at once
            self.pool.discard(self)
        self._cancel_timer()
        if self.complete or self.error is not None:
            return
        if self.headers is not None and _close_delimited(self.headers):
            self.complete = True  # its body ends with the connection
            self._wake()
            return
        self._fail(type(exc).__name__ if exc is not None else "ServerDisconnected")

    # -- httptools' callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_message_begin(self) -> None:
        """A second answer (or its start) in the same bytes as the first, from a server
        answering twice: it must not replace the first's status and headers, add to its
        body, or stay in the parser to be taken as the start of the next request's answer.
        The parse stops here and data_received closes the connection (the answer that came
        whole is still read)."""
        if self.complete:
            raise UpstreamBroken("UnsolicitedAnswer")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        raw = self._raw_headers
        self._raw_headers = []
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._interim = True
            return
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in raw:
            headers.add(name.decode("latin-1"), value.decode("utf-8", "surrogateescape"))
        self.status = status
        self.headers = CIMultiDictProxy(headers)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._body_size += len(body)
        if self._streaming and self._body_size > HIGH_WATER and not self._paused:
            self._paused = True
            if self.transport is not None:
                self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # -- the exchange ---------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, reason: str) -> None:
        if self.headers is None:
            self.error = UpstreamUnreachable(reason)
        else:
            self.error = UpstreamBroken(reason)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self.error)

    async def wait(self) -> None:
        """Until the parser has more (a head, a body piece, the end) or the read deadline."""
        waiter = self._waiter = self._loop.create_future()
        if self._timer is None:
            self._arm(self._last_read + self.pool.read_timeout_s)
        try:
            await waiter
        except BaseException:
            # the answer failed, or the caller left mid-answer: cancelled while waiting, or
            # just after the waiter got its result (then nobody holds the answer, and the
            # connection would stay open, in no pool, for good)
            self.close()
            raise
        finally:
            self._waiter = None

    def _arm(self, when: float) -> None:
        self._timer = self._loop.call_at(when, self._on_deadline)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_deadline(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait arms it again
        due = self._last_read + self.pool.read_timeout_s
        if self._loop.time() < due:
            self._arm(due)  # bytes came since it was armed: the deadline moved
            return
        self.error = TimeoutError()
        waiter.set_exception(self.error)
        self.close()

    def send(self, data: bytes) -> None:
        self._reset()
        self._last_read = self._loop.time()
        assert self.transport is not None
        self.transport.write(data)

    def take(self) -> bytes:
        """The body read so far, handed over (reading resumes if it had paused). The
        read deadline counts from the resume: no byte could come while reading was paused
        (aiohttp's ``sock_read`` stops its timer while paused, too)."""
        data = b"".join(self._chunks)  # one piece is returned as it is, not copied
        self._chunks = []
        self._body_size = 0
        if self._paused:
            self._paused = False
            if self.transport is not None and not self.closed:
                self._last_read = self._loop.time()
                self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.closed = True
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def finish(self) -> None:
        """The answer's holder is done with it: back to the pool if it was read to its end
        and may be kept, closed otherwise. The read deadline's timer stays armed on a kept
        connection: when it fires with nobody waiting it lapses, and a later wait that finds
        it still armed uses it (no timer made and cancelled per request)."""
        if self.complete and self.keep_alive and not self.closed and self.error is None:
            self.pool.put(self)
        else:
            self.close()


class Http1Response:
    """One answer (the upstream port's ``UpstreamResponse``)."""

    __slots__ = ("_body", "_conn", "_released", "headers", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status
        assert conn.headers is not None
        self.headers: CIMultiDictProxy[str] = conn.headers
        self._body: bytes | None = None
        self._released = False

    async def read(self) -> bytes:
        if self._body is not None:
            return self._body
        if self._released:
            raise UpstreamBroken("read after release")
        conn = self._conn
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            await conn.wait()
        body = self._body = conn.take()
        return body

    async def read_prefix(self, limit: int) -> bytes:
        if self._body is not None:
            return self._body[:limit]
        if self._released:
            raise UpstreamBroken("read after release")
        conn = self._conn
        while not conn.complete and conn._body_size < limit:
            if conn.error is not None:
                raise conn.error
            await conn.wait()
        if conn.complete:
            data = self._body = conn.take()
        else:
            data = b"".join(conn._chunks)  # kept: a later read still gets the whole body
        return data[:limit]

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._released:
            raise UpstreamBroken("read after release")
        conn = self._conn
        conn._streaming = True
        while True:
            if conn._chunks:
                yield conn.take()
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._conn.finish()


class PoolStats(NamedTuple):
    """What a pool holds: connections whose socket is open (in use or idle) and, of those, the
    idle ones. At rest (nothing in flight) ``open == idle``; a difference is an answer nobody
    released, a socket held until the server gives up on it."""

    open: int
    idle: int


class Http1Pool:
    """Idle connections per origin, and the one call that sends a request and awaits the head
    of its answer. Created and used inside one running loop.

    Each origin's idle connections are a deque in the order they went idle (oldest left):
    requests take the newest, and the one sweeper timer is armed for the oldest's expiry, so a
    connection is closed ``keepalive_s`` after it went idle (a periodic sweep every
    ``keepalive_s`` kept some up to twice that), or for the oldest's over-bound grace
    (``over_bound_idle_s``) while an origin holds more than ``max_idle_per_origin``. Only live
    connections are in a deque: one the server closes while idle leaves it at once
    (:meth:`discard`)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 600.0,
        keepalive_s: float = 60.0,
        max_idle_per_origin: int = 32,
        over_bound_idle_s: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_idle_per_origin < 0:
            raise ValueError("max_idle_per_origin must be 0 or more")
        if over_bound_idle_s < 0:
            raise ValueError("over_bound_idle_s must be 0 or more")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        #: idle connections kept per origin; 0: none (every connection closed after its answer)
        self.max_idle_per_origin = max_idle_per_origin
        #: how long a connection past the bound may stay idle (the idle longest go first)
        self.over_bound_idle_s = over_bound_idle_s
        #: connections whose socket is open (counted by the connections themselves)
        self.open = 0
        self._ssl = ssl_context
        self._idle: dict[Origin, deque[_Connection]] = {}
        #: the sweeper's timer and the loop time it is armed for (uvloop hands back a plain
        #: ``Handle``, without ``when()``, for an instant already past)
        self._sweeper: asyncio.Handle | None = None
        self._sweeper_at = 0.0
        self._closed = False

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def idle(self, origin: Origin) -> int:
        """How many idle connections the pool keeps for ``origin`` (for tests and metrics)."""
        return sum(1 for c in self._idle.get(origin, ()) if not c.closed)

    def stats(self) -> PoolStats:
        """Open and idle connections over every origin (``/health`` → ``upstream``)."""
        return PoolStats(self.open, sum(len(idle) for idle in self._idle.values()))

    def put(self, conn: _Connection) -> None:
        if self._closed or self.max_idle_per_origin == 0:
            conn.close()
            return
        loop = conn._loop
        conn.idle_since = loop.time()
        idle = self._idle.get(conn.origin)
        if idle is None:
            idle = self._idle[conn.origin] = deque()
        conn.pooled = True
        idle.append(conn)
        due = self._due(idle)
        sweeper = self._sweeper
        if sweeper is None or self._sweeper_at > due:  # else one is armed for an earlier instant
            if sweeper is not None:
                sweeper.cancel()
            self._sweeper, self._sweeper_at = loop.call_at(due, self._sweep, loop), due

    def _due(self, idle: deque[_Connection]) -> float:
        """When the sweeper must next look at an origin's idle connections (oldest first):
        the oldest's keep-alive end, or sooner its over-bound grace while past the bound."""
        oldest = idle[0].idle_since
        if len(idle) > self.max_idle_per_origin:
            return oldest + min(self.keepalive_s, self.over_bound_idle_s)
        return oldest + self.keepalive_s

    def discard(self, conn: _Connection) -> None:
        """Takes ``conn`` out of its origin's idle connections (the server closed it)."""
        conn.pooled = False
        idle = self._idle.get(conn.origin)
        if idle is None:
            return
        with contextlib.suppress(ValueError):
            idle.remove(conn)
        if not idle:
            del self._idle[conn.origin]

    @staticmethod
    def _drop(conn: _Connection) -> None:
        conn.pooled = False
        conn.close()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Closes what has been idle ``keepalive_s`` (oldest first), then arms itself for the
        next oldest's expiry; not armed while nothing is idle, so a pool nobody uses any more
        holds no sockets past their time and no timer."""
        self._sweeper = None
        # due within a millisecond counts as due: a timer may fire that early (loop clocks round)
        now = loop.time() + _SWEEP_SLACK_S
        oldest_kept = now - self.keepalive_s
        over_bound_kept = now - self.over_bound_idle_s
        bound = self.max_idle_per_origin
        next_due: float | None = None
        for origin, idle in list(self._idle.items()):
            while idle and (
                idle[0].idle_since <= oldest_kept
                or (len(idle) > bound and idle[0].idle_since <= over_bound_kept)
            ):
                self._drop(idle.popleft())
            if not idle:
                del self._idle[origin]
                continue
            due = self._due(idle)
            next_due = due if next_due is None else min(next_due, due)
        if next_due is not None and not self._closed:
            self._sweeper = loop.call_at(next_due, self._sweep, loop)
            self._sweeper_at = next_due

    def _take(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        oldest_kept = loop.time() - self.keepalive_s
        while idle:
            conn = idle.pop()  # the newest: the one least likely to have been closed
            conn.pooled = False
            if conn.closed:
                continue
            if conn.idle_since < oldest_kept:
                # this one and every older one have been idle too long
                conn.close()
                while idle:
                    self._drop(idle.popleft())
                return None
            return conn
        return None

    async def _connect(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> _Connection:
        """A new connection: the host resolved, its addresses tried by Happy Eyeballs (RFC
        8305, as aiohttp's connector does: the next address is tried 0.25 s after the last
        started, so an address family that drops packets costs 0.25 s, not the whole connect
        deadline), then TLS when the origin is ``https``."""
        tls = origin.scheme == "https"
        conn = _Connection(self, origin, loop)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
                sock = await aiohappyeyeballs.start_connection(
                    infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY_S, interleave=1, loop=loop
                )
                try:
                    await loop.create_connection(
                        lambda: conn,
                        sock=sock,
                        ssl=self._context() if tls else None,
                        server_hostname=origin.host if tls else None,
                    )
                except BaseException:
                    sock.close()  # not handed to a transport yet (or its transport failed)
                    raise
        except TimeoutError:
            conn.close()
            raise
        except OSError as exc:  # refused, unreachable, DNS (gaierror), TLS (SSLError)
            raise UpstreamUnreachable(type(exc).__name__) from exc
        return conn

    async def request(self, origin: Origin, head: bytes, body: bytes) -> Http1Response:
        """Sends ``head`` (a :func:`request_head`, encoded, ending where the length goes) and
        ``body``, and returns once the answer's head is here."""
        if self._closed:
            raise UpstreamUnreachable("ClientClosed")
        loop = asyncio.get_running_loop()
        data = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        conn = self._take(origin, loop)
        if conn is None:
            conn = await self._connect(origin, loop)
        conn.send(data)
        while conn.headers is None:
            error = conn.error
            if error is not None:
                conn.close()
                raise error
            await conn.wait()
        return Http1Response(conn)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idles = list(self._idle.values())
        self._idle.clear()
        for idle in idles:
            for conn in idle:
                self._drop(conn)
