"""The relayed requests' own HTTP/1.1 client (:mod:`fairgate.providers.http1`) on the wire.

The client replaced aiohttp for the gateway's hottest path, so every promise its module
docstring makes is one a provider or a client of the gateway relies on without knowing it: a
keep-alive pool that reuses connections newest first and drops them when they idle too long; a
connection the server closed never used, and a request the server closed on unanswered never
sent again by the client itself (it may have been acted on); bodies by length, chunked or ended
by the close, a short body never passed off as a whole one; interim answers skipped; deadlines
that close the connection; TLS with SNI; flow control for a slow stream; and a connection never
reused with an answer's leftovers in it. These tests drive :class:`Http1Pool` directly over
real loopback TCP (and TLS) against raw asyncio servers that script each connection byte by
byte and record what they were sent, so a regression shows as the wire behaviour it breaks.
They wait for events by polling for an outcome, never assert on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
import uvloop
from http_support import read_request
from yarl import URL

from fairgate.providers import http1
from fairgate.providers.http1 import Http1Pool, Http1Response, Origin, PoolStats, request_head
from fairgate.providers.transport import UpstreamBroken, UpstreamUnreachable

OK = b'{"ok":true}'
PATH = "/v1/chat/completions"


# -- a scripted loopback server ------------------------------------------------------------


@dataclass
class Request:
    """One request a server read: the connection it came on (1 for the first accepted), its
    head's lines (without the blank line) and its body."""

    conn: int
    lines: list[str]
    body: bytes


@dataclass
class Wire:
    """What a server saw: connections accepted, requests read, answers written, and the
    connections the client closed (while the server kept its side open)."""

    port: int = 0
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    answered: int = 0
    client_closed: set[int] = field(default_factory=set)

    def conns(self) -> list[int]:
        return [r.conn for r in self.requests]


class Peer:
    """One accepted connection, as a test's handler scripts it."""

    def __init__(
        self, wire: Wire, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.wire = wire
        self.reader = reader
        self.writer = writer
        self.number = wire.connections
        self.hung_up = False

    async def request(self) -> Request | None:
        """The next request, or None when the client closed (or reset) the connection."""
        try:
            lines, body = await read_request(self.reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        req = Request(self.number, lines, body)
        self.wire.requests.append(req)
        return req

    async def write(self, *pieces: bytes, pause_s: float = 0.0) -> None:
        """``pieces`` in separate writes, ``pause_s`` apart."""
        for i, piece in enumerate(pieces):
            if i and pause_s:
                await asyncio.sleep(pause_s)
            self.writer.write(piece)
            await self.writer.drain()

    async def answer(self, body: bytes = OK, *, head: bytes = b"") -> None:
        """A whole keep-alive ``200`` with ``body`` by its length (``head``: more header lines)."""
        await self.write(
            b"HTTP/1.1 200 OK\r\n%bContent-Length: %d\r\n\r\n%b" % (head, len(body), body)
        )
        self.wire.answered += 1

    async def until_closed(self) -> None:
        """Until the client closes its side (whatever it sends meanwhile is dropped)."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass

    def hang_up(self) -> None:
        """Closes the server's side (a FIN)."""
        self.hung_up = True
        self.writer.close()

    def reset(self) -> None:
        """Resets the connection (an RST: SO_LINGER 0, then close)."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.hang_up()


Handler = Callable[[Peer], Awaitable[None]]


async def echo(peer: Peer) -> None:
    """Answers every request with its own body (or :data:`OK` for an empty one)."""
    while (req := await peer.request()) is not None:
        await peer.answer(req.body or OK)


class Lab:
    """Servers and pools of one test, all closed when it ends."""

    def __init__(self) -> None:
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._pools: list[Http1Pool] = []

    async def serve(
        self, handler: Handler = echo, *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> Wire:
        """A server on a free port that runs ``handler`` per connection; once the handler
        returns without hanging up, the connection stays open until the client closes it."""
        wire = Wire()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            wire.connections += 1
            peer = Peer(wire, reader, writer)
            try:
                await handler(peer)
                if not peer.hung_up:
                    await peer.until_closed()
                    wire.client_closed.add(peer.number)
            except (ConnectionError, asyncio.CancelledError):
                # cancelled: the test is over (and a handler task that ends cancelled is
                # logged as an error by asyncio's stream server)
                pass
            finally:
                self._tasks.discard(task)
                writer.close()

        server = await asyncio.start_server(handle, host, 0, ssl=tls)
        self._servers.append(server)
        wire.port = server.sockets[0].getsockname()[1]
        return wire

    async def start(self, handler: Handler = echo) -> tuple[Wire, Origin, Http1Pool]:
        """A server running ``handler`` (:meth:`serve`), its origin and a pool with the
        test defaults: what most tests begin with."""
        wire = await self.serve(handler)
        return wire, origin_of(wire), self.pool()

    def pool(
        self,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 5.0,
        keepalive_s: float = 60.0,
        max_idle_per_origin: int | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> Http1Pool:
        """A pool (closed with the lab); ``max_idle_per_origin`` None: the pool's default."""
        pool = Http1Pool(
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            keepalive_s=keepalive_s,
            ssl_context=ssl_context,
            **({} if max_idle_per_origin is None else {"max_idle_per_origin": max_idle_per_origin}),
        )
        self._pools.append(pool)
        return pool

    async def close(self) -> None:
        for pool in self._pools:
            await pool.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            server.close()
            await server.wait_closed()
        await asyncio.sleep(0.01)  # the transports' closes run


@pytest_asyncio.fixture
async def lab() -> AsyncIterator[Lab]:
    the_lab = Lab()
    try:
        yield the_lab
    finally:
        await the_lab.close()


# -- helpers ---------------------------------------------------------------------------------


def origin_of(wire: Wire, scheme: str = "http", host: str = "127.0.0.1") -> Origin:
    return Origin(scheme, host, wire.port)


def head_for(origin: Origin) -> bytes:
    return request_head("POST", PATH, origin.host_header(), []).encode()


async def fetch(pool: Http1Pool, origin: Origin, body: bytes = OK) -> tuple[int, bytes]:
    """One request read whole and released: its status and body."""
    resp = await pool.request(origin, head_for(origin), body)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


async def until(predicate: Callable[[], bool], what: str = "the condition") -> None:
    """Until ``predicate`` holds (polled; a generous bound turns a hang into a failure)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"still waiting for {what}")


async def stream_into(resp: Http1Response, pieces: list[bytes]) -> None:
    """Streams ``resp``'s body into ``pieces`` (what came stays there if it breaks off)."""
    async for piece in resp.chunks():
        pieces.append(piece)


def pattern(n: int) -> bytes:
    """``n`` bytes whose order shows: a piece out of place or missing changes them."""
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


# -- the keep-alive pool ---------------------------------------------------------------------


async def test_requests_in_a_row_reuse_one_connection_and_send_exactly_the_head(lab: Lab) -> None:
    wire, origin, pool = await lab.start()
    assert pool.idle(origin) == 0
    for i in range(3):
        body = b'{"n":%d}' % i
        assert await fetch(pool, origin, body) == (200, body)
        assert pool.idle(origin) == 1
    assert wire.connections == 1
    assert wire.conns() == [1, 1, 1]
    assert wire.requests[0].lines == [
        f"POST {PATH} HTTP/1.1",
        f"Host: 127.0.0.1:{wire.port}",
        "Accept: */*",
        "Content-Length: 7",
    ]
    assert [r.body for r in wire.requests] == [b'{"n":0}', b'{"n":1}', b'{"n":2}']


async def test_the_newest_idle_connection_is_reused_first(lab: Lab) -> None:
    wire, origin, pool = await lab.start()
    first = await pool.request(origin, head_for(origin), b"a")
    second = await pool.request(origin, head_for(origin), b"b")  # the first is busy: a new one
    assert (await first.read(), await second.read()) == (b"a", b"b")
    first.release()
    second.release()  # connection 2 went idle last
    assert pool.idle(origin) == 2
    busy = await pool.request(origin, head_for(origin), b"c")
    assert await fetch(pool, origin, b"d") == (200, b"d")
    assert await busy.read() == b"c"
    busy.release()
    assert wire.conns() == [1, 2, 2, 1]


async def test_many_concurrent_requests_each_get_their_own_answer_and_are_all_reused(
    lab: Lab,
) -> None:
    wire = await lab.serve()
    origin, pool = origin_of(wire), lab.pool(max_idle_per_origin=50)
    for round_ in range(2):
        bodies = [b"%d-%d" % (round_, i) for i in range(50)]
        answers = await asyncio.gather(*(fetch(pool, origin, b) for b in bodies))
        assert answers == [(200, b) for b in bodies]
        assert pool.idle(origin) == 50
    assert wire.connections == 50  # the second round opened none
    assert len(wire.requests) == 100


async def test_the_sweeper_closes_connections_idle_too_long(lab: Lab) -> None:
    wire = await lab.serve()
    origin = origin_of(wire)
    pool = lab.pool(keepalive_s=0.05)
    assert await fetch(pool, origin) == (200, OK)
    await until(lambda: wire.client_closed == {1}, "the idle connection closed by the client")
    assert pool.idle(origin) == 0
    await until(lambda: pool._sweeper is None, "the sweeper stops with nothing idle")
    assert await fetch(pool, origin) == (200, OK)
    assert wire.connections == 2


async def test_a_connection_found_expired_when_taken_is_closed_not_used(lab: Lab) -> None:
    wire = await lab.serve()
    origin = origin_of(wire)
    pool = lab.pool()  # its sweeper is a minute away
    assert await fetch(pool, origin) == (200, OK)
    pool.keepalive_s = 0.01
    await asyncio.sleep(0.05)
    assert await fetch(pool, origin) == (200, OK)
    assert wire.conns() == [1, 2]
    await until(lambda: wire.client_closed == {1}, "the expired connection closed")


async def test_idle_connections_past_the_bound_are_closed_idle_longest_first(lab: Lab) -> None:
    """A burst leaves at most ``max_idle_per_origin`` idle sockets behind, not one per request
    of the burst for the next ``keepalive_s`` (issue 41: a soak's gateway held 49 more
    descriptors after a busy minute, all idle connections to its upstream)."""
    wire = await lab.serve()
    origin, pool = origin_of(wire), lab.pool(max_idle_per_origin=4)
    bodies = [b"%d" % i for i in range(10)]
    held = await asyncio.gather(*(pool.request(origin, head_for(origin), b) for b in bodies))
    assert [await r.read() for r in held] == bodies
    assert pool.stats() == PoolStats(open=10, idle=0)
    conn_of = {r.body: r.conn for r in wire.requests}  # the server's number of each connection
    for resp in held:  # released in order: the last four released are the ones kept
        resp.release()
    assert pool.idle(origin) == 10  # past the bound they are kept for their grace (2 s)
    idle = pool._idle[origin]
    oldest, newest, kept = idle[0], idle[-1], list(idle)[6:]
    assert pool._sweeper is not None
    assert pool._sweeper_at == pytest.approx(oldest.idle_since + 2.0)
    # on a stand-in clock: just before the oldest's grace ends nothing is closed ...
    timers = _Timers(oldest.idle_since + 2.0 - 0.005)
    pool._sweep(timers)  # type: ignore[arg-type]
    assert pool.idle(origin) == 10
    assert timers.armed == [pytest.approx(oldest.idle_since + 2.0)]
    # ... once every one has been idle 2 s, the six idle longest go and four stay
    timers = _Timers(newest.idle_since + 2.0)
    pool._sweep(timers)  # type: ignore[arg-type]
    assert list(pool._idle[origin]) == kept
    assert timers.armed == [pytest.approx(kept[0].idle_since + 60.0)]  # their keep-alive
    closed = {conn_of[b] for b in bodies[:6]}
    await until(lambda: wire.client_closed == closed, "the six idle longest closed")
    await until(lambda: pool.stats() == PoolStats(open=4, idle=4), "their sockets gone")
    again = await asyncio.gather(*(fetch(pool, origin, b) for b in bodies[6:]))
    assert again == [(200, b) for b in bodies[6:]]
    assert wire.connections == 10  # the four kept were reused
    assert {r.conn for r in wire.requests[10:]} == {conn_of[b] for b in bodies[6:]}


async def test_a_steady_load_above_the_bound_reuses_its_connections(lab: Lab) -> None:
    """Calls that come back faster than the over-bound grace find the connections the last
    ones left: four concurrent calls a round against a bound of two open four connections in
    all. Closing whatever came back past the bound at once (as urllib3 and Go do) opened two
    new connections every round: 868 new connections to the mock in 3 s of 64 concurrent
    calls against the default bound of 32, with TLS a handshake each."""
    wire = await lab.serve()
    origin, pool = origin_of(wire), lab.pool(max_idle_per_origin=2)
    for round_ in range(5):
        bodies = [b"%d-%d" % (round_, i) for i in range(4)]
        answers = await asyncio.gather(*(fetch(pool, origin, b) for b in bodies))
        assert answers == [(200, b) for b in bodies]
        assert pool.idle(origin) == 4
    assert wire.connections == 4
    assert len(wire.requests) == 20


def test_the_sweeper_is_rearmed_on_uvloop_when_its_instant_has_passed() -> None:
    """The gateway runs on uvloop, whose ``call_at`` for an instant already past hands back a
    plain ``Handle`` with no ``when()``: the pool reading the armed instant from the handle
    failed every request that released a connection next (an ``AttributeError``, a 500 to
    the client, 176 of them in a benchmark's c64 run). Three connections against a bound of
    one and no grace: the second release arms the sweeper for a past instant, the third
    must still be kept (the asyncio loop the other tests run on always has ``when()``)."""

    async def scenario() -> int:
        lab = Lab()
        try:
            wire = await lab.serve()
            origin = origin_of(wire)
            pool = lab.pool(max_idle_per_origin=1)
            pool.over_bound_idle_s = 0.0
            held = [await pool.request(origin, head_for(origin), b"%d" % i) for i in range(3)]
            for resp in held:
                await resp.read()
                resp.release()
            await asyncio.sleep(0.05)  # the sweeper runs: the bound holds again
            return pool.idle(origin)
        finally:
            await lab.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == 1


async def test_no_idle_connection_is_kept_with_a_bound_of_zero(lab: Lab) -> None:
    wire = await lab.serve()
    origin, pool = origin_of(wire), lab.pool(max_idle_per_origin=0)
    assert await fetch(pool, origin) == (200, OK)
    assert pool.idle(origin) == 0
    await until(lambda: wire.client_closed == {1}, "the answered connection closed")
    await until(lambda: pool.stats() == PoolStats(open=0, idle=0), "its socket gone")
    assert pool._sweeper is None
    with pytest.raises(ValueError, match="max_idle_per_origin"):
        Http1Pool(max_idle_per_origin=-1)
    with pytest.raises(ValueError, match="over_bound_idle_s"):
        Http1Pool(over_bound_idle_s=-1)


class _Timers:
    """A stand-in for the loop the sweeper is given: the time it is told, and the timers
    armed (``call_at``'s deadlines) recorded instead of run."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.armed: list[float] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, *_: object) -> asyncio.TimerHandle:
        self.armed.append(when)
        return asyncio.TimerHandle(when, lambda: None, (), asyncio.get_running_loop())


async def test_each_idle_connection_is_closed_when_its_own_keepalive_ends(lab: Lab) -> None:
    """The sweeper is armed for the oldest idle connection's expiry and then for the next
    one's, so no connection stays idle past ``keepalive_s`` (a sweep every ``keepalive_s``
    kept one that went idle just after a sweep for almost twice that). The sweep runs on a
    stand-in clock: each expiry is a stated instant, not a wait."""
    wire = await lab.serve()
    origin, pool = origin_of(wire), lab.pool(keepalive_s=60.0)
    loop = asyncio.get_running_loop()
    first = await pool.request(origin, head_for(origin), b"a")
    second = await pool.request(origin, head_for(origin), b"b")
    await first.read(), await second.read()
    first.release()
    oldest = pool._idle[origin][0]
    await until(lambda: loop.time() > oldest.idle_since + 0.01, "the clock moves on")
    second.release()
    newest = pool._idle[origin][1]
    assert pool._sweeper is not None
    assert pool._sweeper_at == pytest.approx(oldest.idle_since + 60.0)

    # just before the oldest's expiry: nothing closed, armed again for the same instant
    timers = _Timers(oldest.idle_since + 60.0 - 0.005)
    pool._sweep(timers)  # type: ignore[arg-type]
    assert pool.idle(origin) == 2
    assert timers.armed == [pytest.approx(oldest.idle_since + 60.0)]
    # at it: the oldest closed, armed for the newest's expiry (less than 60 s on)
    timers = _Timers(oldest.idle_since + 60.0)
    pool._sweep(timers)  # type: ignore[arg-type]
    assert list(pool._idle[origin]) == [newest]
    assert timers.armed == [pytest.approx(newest.idle_since + 60.0)]
    await until(lambda: wire.client_closed == {1}, "the expired connection closed")
    # at the newest's: nothing left idle, and no timer armed
    timers = _Timers(newest.idle_since + 60.0)
    pool._sweep(timers)  # type: ignore[arg-type]
    assert pool.stats().idle == 0
    assert timers.armed == []
    assert pool._sweeper is None
    await until(lambda: wire.client_closed == {1, 2}, "both closed")


async def test_open_and_idle_counts_follow_every_connection(lab: Lab) -> None:
    """``stats()`` is what ``/health`` reports: open sockets and, of those, the idle ones."""

    async def once(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.answer()
        if await peer.request() is not None:  # the second request on it: answered, then closed
            await peer.answer()
            peer.hang_up()

    wire, origin, pool = await lab.start(once)
    held = await pool.request(origin, head_for(origin), b"x")
    assert pool.stats() == PoolStats(open=1, idle=0)
    assert await fetch(pool, origin) == (200, OK)  # a second connection, kept idle
    assert pool.stats() == PoolStats(open=2, idle=1)
    await held.read()
    held.release()
    assert pool.stats() == PoolStats(open=2, idle=2)
    assert await fetch(pool, origin) == (200, OK)  # the newest: the server closes it after
    # the server's close takes it out of the pool at once, not at the next sweep
    await until(lambda: pool.stats() == PoolStats(open=1, idle=1), "the closed one gone")
    assert wire.connections == 2
    await pool.close()
    await until(lambda: pool.stats() == PoolStats(open=0, idle=0), "every socket closed")


async def test_closing_the_pool_closes_idle_connections_and_refuses_requests(lab: Lab) -> None:
    wire, origin, pool = await lab.start()
    busy = await pool.request(origin, head_for(origin), b"x")
    assert await fetch(pool, origin) == (200, OK)
    await pool.close()
    await until(lambda: wire.client_closed == {2}, "the idle connection closed")
    assert await busy.read() == b"x"
    busy.release()  # answered whole, but the pool is closed: closed, not kept
    await until(lambda: wire.client_closed == {1, 2}, "the released connection closed")
    assert pool.idle(origin) == 0
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"{}")


# -- stale connections -----------------------------------------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_replaced(lab: Lab) -> None:
    async def once(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.answer()
        peer.hang_up()

    wire, origin, pool = await lab.start(once)
    assert await fetch(pool, origin) == (200, OK)
    await until(lambda: pool.idle(origin) == 0, "the client noticed the close")
    assert await fetch(pool, origin, b"again") == (200, OK)
    assert wire.conns() == [1, 2]
    assert wire.answered == 2


@pytest.mark.parametrize("cut", ["close", "reset"])
async def test_a_reused_connection_closed_unanswered_is_unreachable_and_not_sent_again(
    lab: Lab, cut: str
) -> None:
    """The server read the request and closed without an answer: it may have acted on it (a
    model call is billed), so the client does not send it again by itself; the request path's
    failover rule decides. The next request goes out on a new connection."""

    async def first_answers_then_drops(peer: Peer) -> None:
        if peer.number > 1:
            await echo(peer)
            return
        await peer.request()
        await peer.answer()
        await peer.request()  # read, never answered
        if cut == "reset":
            peer.reset()
        else:
            peer.hang_up()

    wire, origin, pool = await lab.start(first_answers_then_drops)
    assert await fetch(pool, origin) == (200, OK)
    assert pool.idle(origin) == 1  # the client has not seen any close yet
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"second")
    assert wire.conns() == [1, 1]  # sent once, not again on a new connection
    assert pool.idle(origin) == 0
    assert await fetch(pool, origin, b"third") == (200, b"third")
    assert wire.conns() == [1, 1, 2]


async def test_a_new_connection_closed_unanswered_is_unreachable_and_not_retried(
    lab: Lab,
) -> None:
    async def drop(peer: Peer) -> None:
        await peer.request()
        peer.hang_up()

    wire, origin, pool = await lab.start(drop)
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"{}")
    assert wire.connections == 1
    assert pool.idle(origin) == 0


async def test_a_reused_connection_that_began_an_answer_is_unreachable(lab: Lab) -> None:
    """A head cut short is no answer: unreachable, on the one connection it was sent on."""

    async def half_answer(peer: Peer) -> None:
        await peer.request()
        await peer.answer()
        await peer.request()
        await peer.write(b"HTTP/1.1 200 O")
        peer.hang_up()

    wire, origin, pool = await lab.start(half_answer)
    assert await fetch(pool, origin) == (200, OK)
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"{}")
    assert wire.connections == 1


async def test_unsolicited_bytes_on_an_idle_connection_make_it_unusable(lab: Lab) -> None:
    async def chatty(peer: Peer) -> None:
        if peer.number > 1:
            await echo(peer)
            return
        await peer.request()
        await peer.answer()
        await asyncio.sleep(0.02)
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno")

    wire, origin, pool = await lab.start(chatty)
    assert await fetch(pool, origin) == (200, OK)
    await until(lambda: pool.idle(origin) == 0, "the chatty connection dropped")
    assert await fetch(pool, origin, b"yes") == (200, b"yes")
    assert wire.conns() == [1, 2]
    await until(lambda: wire.client_closed == {1}, "the client closed the chatty connection")


@pytest.mark.parametrize(
    "extra",
    [b"HTTP/1.1 404 Not Found\r\nContent-Length: 1\r\n\r\nX", b"HTTP/1.1 404 Not Fo"],
    ids=["whole", "partial"],
)
async def test_bytes_after_the_answer_in_the_same_segment_are_not_read_as_an_answer(
    lab: Lab, extra: bytes
) -> None:
    """A server that sends more than one answer at once: the answer ends where its length
    says, the rest (a whole answer, or the start of one) is nobody's, and the connection is
    not kept with it (the next answer would be parsed as its continuation)."""

    async def double(peer: Peer) -> None:
        if peer.number > 1:
            await echo(peer)
            return
        await peer.request()
        await peer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b%b" % (len(OK), OK, extra)
        )

    wire, origin, pool = await lab.start(double)
    assert await fetch(pool, origin) == (200, OK)
    await until(lambda: wire.client_closed == {1}, "the client closed the connection")
    assert await fetch(pool, origin, b"next") == (200, b"next")
    assert wire.conns() == [1, 2]


# -- bodies ----------------------------------------------------------------------------------

CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
#: a chunked body in writes that split a size line, carry an extension and end with a trailer
CHUNKED_PIECES = [
    b"5\r\nhel",
    b"lo\r\n",
    b"6;name=value\r\n world\r\n",
    b"1",
    b"0\r\n" + b"x" * 16 + b"\r\n",
    b"0\r\nX-Trailer: t\r\n\r\n",
]
CHUNKED_BODY = b"hello world" + b"x" * 16


async def chunked(peer: Peer) -> None:
    while await peer.request() is not None:
        await peer.write(CHUNKED_HEAD, *CHUNKED_PIECES, pause_s=0.01)
        peer.wire.answered += 1


async def test_a_chunked_body_is_read_whole_and_the_connection_kept(lab: Lab) -> None:
    wire, origin, pool = await lab.start(chunked)
    resp = await pool.request(origin, head_for(origin), b"{}")
    assert resp.status == 200
    assert resp.headers["transfer-encoding"] == "chunked"
    assert await resp.read() == CHUNKED_BODY
    assert "X-Trailer" not in resp.headers
    resp.release()
    assert pool.idle(origin) == 1
    assert await fetch(pool, origin) == (200, CHUNKED_BODY)
    assert wire.connections == 1


async def test_a_chunked_body_streams_in_order_as_it_arrives(lab: Lab) -> None:
    wire, origin, pool = await lab.start(chunked)
    resp = await pool.request(origin, head_for(origin), b"{}")
    pieces = [piece async for piece in resp.chunks()]
    resp.release()
    assert b"".join(pieces) == CHUNKED_BODY
    assert len(pieces) > 1  # handed over as they came, not gathered
    assert all(pieces)
    assert pool.idle(origin) == 1
    assert await fetch(pool, origin) == (200, CHUNKED_BODY)
    assert wire.connections == 1


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
async def test_a_body_delimited_by_the_close_is_read_whole_and_not_reused(
    lab: Lab, version: bytes
) -> None:
    async def until_close(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.write(
                b"HTTP/%b 200 OK\r\nContent-Type: text/plain\r\n\r\n" % version,
                b"first ",
                b"second ",
                b"last",
                pause_s=0.01,
            )
        peer.hang_up()

    wire, origin, pool = await lab.start(until_close)
    assert await fetch(pool, origin) == (200, b"first second last")
    assert pool.idle(origin) == 0
    resp = await pool.request(origin, head_for(origin), b"{}")
    pieces = [piece async for piece in resp.chunks()]
    resp.release()
    assert b"".join(pieces) == b"first second last"
    assert wire.connections == 2


async def test_a_body_cut_short_is_broken_whether_read_or_streamed(lab: Lab) -> None:
    async def short(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"0123456789")
            await asyncio.sleep(0.02)
        peer.hang_up()

    wire, origin, pool = await lab.start(short)
    resp = await pool.request(origin, head_for(origin), b"{}")
    with pytest.raises(UpstreamBroken):
        await resp.read()
    with pytest.raises(UpstreamBroken):
        await resp.read()  # and again: never a short body
    resp.release()
    resp = await pool.request(origin, head_for(origin), b"{}")
    pieces: list[bytes] = []
    with pytest.raises(UpstreamBroken):
        await stream_into(resp, pieces)
    resp.release()
    assert b"".join(pieces) == b"0123456789"  # what came, then the break
    assert pool.idle(origin) == 0
    assert wire.connections == 2


async def test_a_chunked_body_cut_before_its_last_chunk_is_broken(lab: Lab) -> None:
    async def short(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.write(CHUNKED_HEAD + b"5\r\nhello\r\n")
            await asyncio.sleep(0.02)
        peer.hang_up()

    _wire, origin, pool = await lab.start(short)
    resp = await pool.request(origin, head_for(origin), b"{}")
    with pytest.raises(UpstreamBroken):
        await resp.read()
    resp.release()


async def test_a_malformed_head_is_unreachable_and_a_malformed_body_broken(lab: Lab) -> None:
    async def garbage(peer: Peer) -> None:
        await peer.request()
        if peer.number == 1:
            await peer.write(b"HTTP/1.1 two hundred\r\n\r\n")
        else:
            await peer.write(CHUNKED_HEAD + b"5\r\nhello\r\nzz\r\n")

    wire, origin, pool = await lab.start(garbage)
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"{}")
    resp = await pool.request(origin, head_for(origin), b"{}")
    with pytest.raises(UpstreamBroken):
        await resp.read()
    resp.release()
    await until(lambda: wire.client_closed == {1, 2}, "both connections closed by the client")
    assert pool.idle(origin) == 0


async def test_a_head_without_end_is_refused_and_a_large_one_is_not(lab: Lab) -> None:
    """An upstream that sends headers without end is cut off at ``MAX_HEAD`` bytes, not
    buffered; a head of many large headers below it is read whole."""
    big = b"".join(b"x-big-%d: %b\r\n" % (i, b"v" * 4000) for i in range(20))  # ~80 KB

    async def heads(peer: Peer) -> None:
        if await peer.request() is None:
            return
        if peer.number == 1:
            await peer.write(b"HTTP/1.1 200 OK\r\n" + big + b"Content-Length: 2\r\n\r\nok")
            return
        await peer.write(b"HTTP/1.1 200 OK\r\nx-junk: ")
        for _ in range(8):  # 512 KiB of one header value, and no end
            await peer.write(b"a" * 65536)
        await peer.until_closed()

    wire, origin, pool = await lab.start(heads)
    resp = await pool.request(origin, head_for(origin), b"{}")
    assert resp.headers["x-big-19"] == "v" * 4000
    assert await resp.read() == b"ok"
    resp.release()
    pool2 = lab.pool()  # a new connection for the endless head
    with pytest.raises(UpstreamUnreachable, match="HeadTooLarge"):
        await pool2.request(origin, head_for(origin), b"{}")
    await until(lambda: 2 in wire.client_closed, "the client closed the connection")


async def test_a_head_split_across_writes_keeps_every_header(lab: Lab) -> None:
    async def split(peer: Peer) -> None:
        await peer.request()
        await peer.write(
            b"HTTP/1.1 201 Cre",
            b"ated\r\nX-Re",
            b"quest-Id: ab",
            b"c\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\nX-Name: caf\xc3",
            b"\xa9\r\nContent-Le",
            b"ngth: 2\r\n\r",
            b"\nok",
            pause_s=0.005,
        )
        peer.wire.answered += 1

    _wire, origin, pool = await lab.start(split)
    resp = await pool.request(origin, head_for(origin), b"{}")
    assert resp.status == 201
    assert resp.headers["x-request-id"] == "abc"
    assert resp.headers.getall("SET-COOKIE") == ["a=1", "b=2"]
    assert resp.headers["x-name"] == "café"
    assert await resp.read() == b"ok"
    resp.release()
    assert pool.idle(origin) == 1


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_an_answer_without_a_body_ends_at_its_head_and_keeps_the_connection(
    lab: Lab, status: bytes
) -> None:
    async def empty(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(b"HTTP/1.1 %b\r\nX-A: 1\r\n\r\n" % status)

    wire, origin, pool = await lab.start(empty)
    resp = await pool.request(origin, head_for(origin), b"{}")
    assert await resp.read() == b""
    resp.release()
    assert pool.idle(origin) == 1
    assert (await fetch(pool, origin))[1] == b""
    assert wire.connections == 1


# -- answers that end the connection, interim answers ----------------------------------------


@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/1.1 200 OK\r\nConnection: close", b"HTTP/1.0 200 OK"],
    ids=["connection-close", "http-1.0"],
)
async def test_an_answer_that_ends_the_connection_is_not_reused(
    lab: Lab, status_line: bytes
) -> None:
    async def last(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(b"%b\r\nContent-Length: 2\r\n\r\nok" % status_line)

    wire = await lab.serve(last)  # the server leaves its side open: the client must close
    origin = origin_of(wire)
    pool = lab.pool()
    assert await fetch(pool, origin) == (200, b"ok")
    assert pool.idle(origin) == 0
    await until(lambda: wire.client_closed == {1}, "the client closed the connection")
    assert await fetch(pool, origin) == (200, b"ok")
    assert wire.conns() == [1, 2]


async def test_interim_answers_are_skipped(lab: Lab) -> None:
    async def interim(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                pause_s=0.01,
            )

    wire, origin, pool = await lab.start(interim)
    resp = await pool.request(origin, head_for(origin), b"{}")
    assert resp.status == 200
    assert "link" not in resp.headers
    assert await resp.read() == b"ok"
    resp.release()
    assert await fetch(pool, origin) == (200, b"ok")
    assert wire.connections == 1


# -- deadlines -------------------------------------------------------------------------------


async def silent(peer: Peer) -> None:
    await peer.request()  # and never a byte back


async def mute(peer: Peer) -> None:
    """Reads nothing, answers nothing (the connection stays open until the client closes)."""


async def test_no_answer_within_the_read_deadline_is_a_timeout_and_closes(lab: Lab) -> None:
    wire = await lab.serve(silent)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=0.2)
    with pytest.raises(TimeoutError):
        await pool.request(origin, head_for(origin), b"{}")
    await until(lambda: wire.client_closed == {1}, "the timed-out connection closed")
    assert pool.idle(origin) == 0


async def test_a_body_that_stalls_past_the_read_deadline_is_a_timeout(lab: Lab) -> None:
    async def stall(peer: Peer) -> None:
        await peer.request()
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"012")

    wire = await lab.serve(stall)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=0.2)
    resp = await pool.request(origin, head_for(origin), b"{}")
    with pytest.raises(TimeoutError):
        await resp.read()
    resp.release()
    await until(lambda: wire.client_closed == {1}, "the timed-out connection closed")


async def test_a_slow_trickle_within_the_deadline_each_time_is_no_timeout(lab: Lab) -> None:
    """The deadline is per byte awaited, not for the whole answer (aiohttp's ``sock_read``)."""
    body = [b"%d" % i for i in range(7)]

    async def trickle(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(
                b"HTTP/1.1 200 OK\r\nContent-Le",
                b"ngth: 7\r\n\r\n",
                *body,
                pause_s=0.04,  # 9 writes: more than the deadline in all, far less each
            )

    wire = await lab.serve(trickle)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=0.2)
    assert await fetch(pool, origin) == (200, b"0123456")
    resp = await pool.request(origin, head_for(origin), b"{}")
    pieces = [piece async for piece in resp.chunks()]
    resp.release()
    assert b"".join(pieces) == b"0123456"
    assert wire.connections == 1


async def test_a_kept_connections_earlier_deadline_does_not_cut_the_next_request(
    lab: Lab,
) -> None:
    """The deadline's timer outlives a request on a kept connection; when it fires during
    the next request it must measure from that request, not end it."""

    async def slow_second(peer: Peer) -> None:
        n = 0
        while await peer.request() is not None:
            n += 1
            if n == 2:
                await asyncio.sleep(0.8)  # past the first request's deadline
            await peer.answer()

    # real time (the client's deadline is the loop's timer): margins of 0.4 s, which a busy
    # host's stalls do not eat (0.1 s did not leave room for one)
    wire = await lab.serve(slow_second)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=1.2)
    assert await fetch(pool, origin) == (200, OK)
    await asyncio.sleep(0.6)
    assert await fetch(pool, origin) == (200, OK)
    assert wire.connections == 1


async def test_a_deadline_that_lapsed_while_idle_is_armed_anew(lab: Lab) -> None:
    async def slow_later(peer: Peer) -> None:
        n = 0
        while await peer.request() is not None:
            n += 1
            if n == 2:
                await asyncio.sleep(0.2)
            await peer.answer()

    wire = await lab.serve(slow_later)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=0.6)  # margins of 0.4 s (real time, as above)
    assert await fetch(pool, origin) == (200, OK)
    await asyncio.sleep(1.0)  # the first request's timer fires with nobody waiting
    assert await fetch(pool, origin) == (200, OK)
    assert wire.connections == 1


# -- connecting ------------------------------------------------------------------------------


async def test_a_refused_connection_is_unreachable(lab: Lab) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    pool = lab.pool()
    with pytest.raises(UpstreamUnreachable):
        await pool.request(Origin("http", "127.0.0.1", port), b"POST / HTTP/1.1\r\n", b"")


async def test_an_unknown_host_is_unreachable(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver's answer is made here, so the test needs no DNS."""

    async def unknown(*_args: object, **_kw: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", unknown)
    pool = lab.pool()
    origin = Origin("http", "no-such-host.invalid", 80)
    with pytest.raises(UpstreamUnreachable, match="gaierror"):
        await pool.request(origin, head_for(origin), b"")


async def test_an_address_that_drops_the_connect_gives_way_to_the_next(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Happy Eyeballs: a host whose first address drops every SYN (an IPv6 route that goes
    nowhere, say) is reached on its second address after the delay, not after the whole
    connect deadline. The dropping address is a listening socket whose accept queue is full:
    Linux drops a SYN to it, as a black hole does."""
    wire = await lab.serve(echo)
    loop = asyncio.get_running_loop()
    hole = socket.socket()
    fillers: list[socket.socket] = []
    try:
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)
        for _ in range(4):  # more than the queue holds: the last connects cannot complete
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(hole.getsockname())
            fillers.append(filler)
        probe = socket.socket()
        probe.setblocking(False)
        fillers.append(probe)
        with pytest.raises(TimeoutError):  # the black hole holds: a connect to it hangs
            await asyncio.wait_for(loop.sock_connect(probe, hole.getsockname()), 0.5)
        addresses = [hole.getsockname(), ("127.0.0.1", wire.port)]

        async def dual(*_args: object, **_kw: object) -> list[object]:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", a) for a in addresses]

        monkeypatch.setattr(loop, "getaddrinfo", dual)
        pool = lab.pool(connect_timeout_s=30.0)  # far above the delay: a success is the proof
        origin = Origin("http", "dual.test", wire.port)
        assert await fetch(pool, origin) == (200, OK)
        assert wire.connections == 1
    finally:
        for sock in (*fillers, hole):
            sock.close()


async def test_a_tls_handshake_that_never_ends_is_a_connect_timeout(lab: Lab) -> None:
    """A TCP server that never answers the ClientHello: the connect deadline covers the
    handshake. (An unroutable address cannot stand in here: this host's network accepts
    connections to anywhere.)"""
    wire = await lab.serve(mute)  # plain TCP: the ClientHello is never answered
    pool = lab.pool(ssl_context=ssl.create_default_context(), connect_timeout_s=0.2)
    origin = origin_of(wire, "https")
    with pytest.raises(TimeoutError):
        await pool.request(origin, head_for(origin), b"{}")
    await until(lambda: wire.client_closed == {1}, "the half-made connection closed")


# -- TLS -------------------------------------------------------------------------------------


@dataclass
class Tls:
    cert: Path
    key: Path

    def server_context(self, names: list[str | None]) -> ssl.SSLContext:
        """A server context that records the SNI name of each handshake in ``names``."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)

        def sni(_obj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
            names.append(name)

        ctx.sni_callback = sni
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A self-signed certificate for ``localhost`` and ``127.0.0.1``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    files = Tls(folder / "cert.pem", folder / "key.pem")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


async def test_https_with_sni_and_a_kept_connection(lab: Lab, tls: Tls) -> None:
    names: list[str | None] = []
    wire = await lab.serve(tls=tls.server_context(names))
    origin = origin_of(wire, "https", "localhost")
    pool = lab.pool(ssl_context=tls.client_context())
    assert await fetch(pool, origin, b"one") == (200, b"one")
    assert await fetch(pool, origin, b"two") == (200, b"two")
    assert names == ["localhost"]  # one handshake, naming the host
    assert wire.connections == 1
    assert wire.requests[0].lines[1] == f"Host: localhost:{wire.port}"


async def test_https_to_an_ip_address_and_a_body_ended_by_the_close(lab: Lab, tls: Tls) -> None:
    async def until_close(peer: Peer) -> None:
        if await peer.request() is not None:
            await peer.write(b"HTTP/1.1 200 OK\r\n\r\n", b"secret ", b"stream", pause_s=0.01)
        peer.hang_up()

    names: list[str | None] = []
    wire = await lab.serve(until_close, tls=tls.server_context(names))
    origin = origin_of(wire, "https")
    pool = lab.pool(ssl_context=tls.client_context())
    assert await fetch(pool, origin) == (200, b"secret stream")
    assert names == [None]  # no SNI for an address
    assert pool.idle(origin) == 0


async def test_an_untrusted_certificate_is_unreachable(lab: Lab, tls: Tls) -> None:
    wire = await lab.serve(tls=tls.server_context([]))
    origin = origin_of(wire, "https", "localhost")
    pool = lab.pool()  # the system's trust store: it does not know our certificate
    with pytest.raises(UpstreamUnreachable):
        await pool.request(origin, head_for(origin), b"{}")
    assert wire.requests == []


# -- releasing, reading twice, reading a prefix ----------------------------------------------


async def test_releasing_an_answer_still_in_flight_closes_its_connection(lab: Lab) -> None:
    async def partial(peer: Peer) -> None:
        if peer.number > 1:
            await echo(peer)
            return
        await peer.request()
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n012")

    wire, origin, pool = await lab.start(partial)
    resp = await pool.request(origin, head_for(origin), b"{}")
    resp.release()
    resp.release()  # twice: harmless
    with pytest.raises(UpstreamBroken):
        await resp.read()
    with pytest.raises(UpstreamBroken):
        await resp.read_prefix(1)
    with pytest.raises(UpstreamBroken):
        await anext(aiter(resp.chunks()))
    assert pool.idle(origin) == 0
    await until(lambda: wire.client_closed == {1}, "the released connection closed")
    assert await fetch(pool, origin, b"next") == (200, b"next")
    assert wire.conns() == [1, 2]


async def test_releasing_a_whole_answer_unread_keeps_the_connection(lab: Lab) -> None:
    wire, origin, pool = await lab.start()
    resp = await pool.request(origin, head_for(origin), b"unread")
    await until(lambda: resp._conn.complete, "the whole answer arrived")
    resp.release()
    assert pool.idle(origin) == 1
    assert await fetch(pool, origin, b"next") == (200, b"next")  # not the unread bytes
    assert wire.connections == 1


async def test_reading_twice_and_reading_a_prefix(lab: Lab) -> None:
    body = pattern(100)

    async def halves(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + body[:40],
                body[40:],
                pause_s=0.05,
            )

    wire, origin, pool = await lab.start(halves)

    resp = await pool.request(origin, head_for(origin), b"{}")
    first = await resp.read()
    assert first == body
    assert await resp.read() == first
    assert await resp.read_prefix(10) == body[:10]  # from what was read
    resp.release()

    resp = await pool.request(origin, head_for(origin), b"{}")
    assert await resp.read_prefix(10) == body[:10]  # without waiting for the rest
    assert await resp.read_prefix(10) == body[:10]
    assert await resp.read() == body  # the prefix is not lost to the read
    resp.release()

    resp = await pool.request(origin, head_for(origin), b"{}")
    assert await resp.read_prefix(1000) == body  # at most the body
    assert await resp.read() == body
    resp.release()

    resp = await pool.request(origin, head_for(origin), b"{}")
    assert await resp.read_prefix(10) == body[:10]
    pieces = [piece async for piece in resp.chunks()]
    assert b"".join(pieces) == body  # the prefix is not lost to the stream either
    resp.release()
    assert wire.connections == 1


# -- cancellation ----------------------------------------------------------------------------


async def test_cancelling_a_request_awaiting_its_head_closes_the_connection(lab: Lab) -> None:
    wire, origin, pool = await lab.start(silent)
    task = asyncio.create_task(pool.request(origin, head_for(origin), b"{}"))
    await until(lambda: len(wire.requests) == 1, "the request reached the server")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: wire.client_closed == {1}, "the cancelled connection closed")
    assert pool.idle(origin) == 0


async def test_cancelling_a_request_just_as_its_head_arrives_closes_the_connection(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head came (the waiter has its result) but the caller was cancelled before it
    resumed: nobody holds the answer, so its connection must not stay open, unowned."""

    async def head_then_stall(peer: Peer) -> None:
        await peer.request()
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")

    wire, origin, pool = await lab.start(head_then_stall)
    task = asyncio.create_task(pool.request(origin, head_for(origin), b"{}"))
    wake = http1._Connection._wake

    def wake_then_cancel(conn: http1._Connection) -> None:
        wake(conn)
        task.cancel()

    monkeypatch.setattr(http1._Connection, "_wake", wake_then_cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: wire.client_closed == {1}, "the cancelled connection closed")
    assert pool.idle(origin) == 0


async def test_cancelling_a_read_mid_body_closes_the_connection(lab: Lab) -> None:
    async def stall(peer: Peer) -> None:
        await peer.request()
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n012")

    wire, origin, pool = await lab.start(stall)
    resp = await pool.request(origin, head_for(origin), b"{}")
    reading = asyncio.create_task(resp.read())
    await asyncio.sleep(0.02)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    await until(lambda: wire.client_closed == {1}, "the cancelled connection closed")
    resp.release()
    assert pool.idle(origin) == 0


# -- flow control ----------------------------------------------------------------------------


class ReadingSpy:
    """Counts a transport's pauses and resumes of reading."""

    def __init__(self, resp: Http1Response, monkeypatch: pytest.MonkeyPatch) -> None:
        transport = resp._conn.transport
        assert transport is not None
        self.pauses = 0
        self.resumes = 0
        pause, resume = transport.pause_reading, transport.resume_reading

        def paused() -> None:
            self.pauses += 1
            pause()

        def resumed() -> None:
            self.resumes += 1
            resume()

        monkeypatch.setattr(transport, "pause_reading", paused)
        monkeypatch.setattr(transport, "resume_reading", resumed)


async def test_a_large_stream_read_slowly_arrives_whole_and_in_order(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http1, "HIGH_WATER", 1024)
    body = pattern(256 * 1024)

    async def big(peer: Peer) -> None:
        while await peer.request() is not None:
            await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 8192):
                await peer.write(body[i : i + 8192])

    wire, origin, pool = await lab.start(big)
    resp = await pool.request(origin, head_for(origin), b"{}")
    spy = ReadingSpy(resp, monkeypatch)
    pieces: list[bytes] = []
    async for piece in resp.chunks():
        pieces.append(piece)
        await asyncio.sleep(0.001)  # a slow client
    resp.release()
    assert b"".join(pieces) == body
    assert spy.pauses >= 1
    assert spy.resumes == spy.pauses
    assert pool.idle(origin) == 1
    assert await fetch(pool, origin) == (200, body)  # the kept connection reads again
    assert wire.connections == 1


async def test_time_paused_for_a_slow_client_does_not_count_against_the_read_deadline(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While reading is paused no byte can come: once it resumes, the upstream has the whole
    deadline again (as aiohttp's ``sock_read``, which stops its timer while paused)."""
    monkeypatch.setattr(http1, "HIGH_WATER", 1024)
    go = asyncio.Event()

    async def burst_then_wait(peer: Peer) -> None:
        await peer.request()
        await peer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4197\r\n\r\n", b"a" * 100)
        await asyncio.sleep(0.02)
        await peer.write(b"b" * 4096)  # past the high water: reading pauses
        await go.wait()
        await asyncio.sleep(0.2)  # well within a deadline counted from the resume
        await peer.write(b"c")

    wire = await lab.serve(burst_then_wait)
    origin = origin_of(wire)
    pool = lab.pool(read_timeout_s=0.8)  # real time: a margin of 0.6 s
    resp = await pool.request(origin, head_for(origin), b"{}")
    spy = ReadingSpy(resp, monkeypatch)
    pieces: list[bytes] = []
    async for piece in resp.chunks():
        pieces.append(piece)
        if len(pieces) == 1:
            await asyncio.sleep(1.2)  # the client is slow: longer than the deadline
        elif spy.resumes:
            go.set()
    resp.release()
    assert b"".join(pieces) == b"a" * 100 + b"b" * 4096 + b"c"
    assert spy.pauses == 1
    assert wire.connections == 1


# -- request heads and origins ---------------------------------------------------------------


def test_request_head_writes_the_headers_in_order_and_adds_accept() -> None:
    head = request_head("POST", "/v1/x?y=1", "h:8080", [("authorization", "Bearer k")])
    assert head == (
        "POST /v1/x?y=1 HTTP/1.1\r\nHost: h:8080\r\nauthorization: Bearer k\r\n"
        "Accept: */*\r\nContent-Length: "
    )
    for accept in ("accept", "Accept", "ACCEPT"):
        head = request_head("POST", "/", "h", [(accept, "text/event-stream")])
        assert (
            head == f"POST / HTTP/1.1\r\nHost: h\r\n{accept}: text/event-stream\r\nContent-Length: "
        )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-a", "one\r\nx-injected: 1"),
        ("x-a", "one\rtwo"),
        ("x-a", "one\ntwo"),
        ("x-a\r\nx-b", "v"),
        ("x-a\n", "v"),
        ("x-a\r", "v"),
        ("x-a: b", "v"),
    ],
)
def test_request_head_refuses_a_header_that_could_split_the_head(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="line break or a colon"):
        request_head("POST", "/", "h", [("ok", "fine"), (name, value)])


@pytest.mark.parametrize(
    ("url", "origin", "host"),
    [
        ("http://api.example.com/v1", Origin("http", "api.example.com", 80), "api.example.com"),
        ("https://api.example.com/v1", Origin("https", "api.example.com", 443), "api.example.com"),
        ("http://h:8080/", Origin("http", "h", 8080), "h:8080"),
        ("https://h:80/", Origin("https", "h", 80), "h:80"),
        ("http://h:443/", Origin("http", "h", 443), "h:443"),
        ("https://h:443/", Origin("https", "h", 443), "h"),
        ("http://[::1]:8080/v1", Origin("http", "::1", 8080), "[::1]:8080"),
        ("https://[2001:db8::1]/", Origin("https", "2001:db8::1", 443), "[2001:db8::1]"),
        ("http://127.0.0.1:9/", Origin("http", "127.0.0.1", 9), "127.0.0.1:9"),
    ],
)
def test_origin_of_a_url_and_its_host_header(url: str, origin: Origin, host: str) -> None:
    assert Origin.of(URL(url)) == origin
    assert origin.host_header() == host


@pytest.mark.parametrize("url", ["ftp://h/x", "ws://h/", "unix:///tmp/s", "http:///path", "/rel"])
def test_origin_of_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Origin.of(URL(url))


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
async def test_a_request_to_an_ipv6_address(lab: Lab) -> None:
    wire = await lab.serve(host="::1")
    origin = Origin.of(URL(f"http://[::1]:{wire.port}/v1"))
    pool = lab.pool()
    assert await fetch(pool, origin, b"six") == (200, b"six")
    assert wire.requests[0].lines[1] == f"Host: [::1]:{wire.port}"
