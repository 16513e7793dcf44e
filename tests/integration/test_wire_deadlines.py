"""The HTTP edge never drops a client that is merely slow to start, or a request a late event
loop has not read yet (issue 41).

A busy client can take seconds between its connect (which the kernel completes at once) and its
request: the first request's head deadline used to count from the connection, so the gateway
closed such a connection while it had room to spare, and the request then met a reset
(``httpx.ReadError`` in a 1,600-client storm on two busy cores). A connection that has sent
nothing is now *silent*: closed after ``silent_timeout_s``, or earlier, the one silent longest
first, when the connection cap needs room; the head deadline counts from a request's first
byte.

And the gateway's own loop can fall behind: uvloop (libuv) runs the timers that are due
*before* it polls the sockets, so a deadline or the idle keep-alive timeout could expire on a
connection whose request already waits in the socket, unread; closing it would reset it.
Deadlines look again once what waits is read.

These tests drive :class:`~fairgate.process.http_protocol.LimitedHttpToolsProtocol` on a loop
whose clock and timers the test moves (:class:`ManualLoop`): "the loop is late" is a deadline
that is due while the client's bytes wait unread in a real loopback socket, and "the loop
reads" is the test handing those bytes to ``data_received``, in libuv's order (due timers
first, then the sockets). No test waits for time to pass.
"""

from __future__ import annotations

import array
import fcntl
import socket
import termios
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from fairgate.process.http_protocol import LimitedHttpToolsProtocol, protocol_for
from fairgate.process.http_settings import HttpSettings

HEAD_S = 10.0
BODY_S = 60.0
KEEP_ALIVE_S = 5.0
SILENT_S = 120.0
LIMITS = HttpSettings(
    header_timeout_s=HEAD_S,
    body_timeout_s=BODY_S,
    keep_alive_s=KEEP_ALIVE_S,
    silent_timeout_s=SILENT_S,
    max_connections=3,
)
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class Timer:
    """One armed timer of :class:`ManualLoop`."""

    at: float
    callback: Callable[..., object]
    args: tuple[object, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True

    def when(self) -> float:
        return self.at


@dataclass
class ManualLoop:
    """The parts of an event loop the protocol uses, with the test's clock: timers run only
    when :meth:`run_due` is called, and an application task is recorded, never run."""

    now: float = 1000.0
    timers: list[Timer] = field(default_factory=list)
    tasks: list[Coroutine[Any, Any, Any]] = field(default_factory=list)

    def time(self) -> float:
        return self.now

    def call_at(self, at: float, callback: Callable[..., object], *args: object) -> Timer:
        timer = Timer(at, callback, args)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> Timer:
        return self.call_at(self.now + delay, callback, *args)

    def create_task(self, coro: Coroutine[Any, Any, Any], **_: object) -> _DoneTask:
        coro.close()  # the application is not what these tests are about
        self.tasks.append(coro)
        return _DoneTask()

    def armed(self) -> list[float]:
        return sorted(t.at for t in self.timers if not t.cancelled)

    def run_due(self, now: float) -> None:
        """The clock reads ``now``; the timers due by then run, in order (those they arm
        wait for the next call, as libuv's do)."""
        self.now = now
        due = sorted((t for t in self.timers if not t.cancelled and t.at <= now), key=Timer.when)
        for timer in due:
            self.timers.remove(timer)
            timer.callback(*timer.args)


class _DoneTask:
    def add_done_callback(self, _: object) -> None:
        pass


@dataclass
class Transport:
    """The server side of a real loopback TCP connection as the protocol sees its transport:
    the socket (whose unread bytes the protocol may ask the kernel about), what was written,
    whether it was closed."""

    sock: socket.socket
    written: bytearray = field(default_factory=bytearray)
    closed: bool = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        if name == "socket":
            return self.sock
        if name == "peername":
            return self.sock.getpeername()
        if name == "sockname":
            return self.sock.getsockname()
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        self.written += data

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@dataclass
class Connection:
    """A protocol on the lab's loop, its transport over a real socket, and the client's end."""

    loop: ManualLoop
    proto: LimitedHttpToolsProtocol
    transport: Transport
    client: socket.socket

    def send(self, data: bytes) -> None:
        """The client sends ``data``: it waits in the server's socket until :meth:`read`."""
        self.client.sendall(data)
        for _ in range(1000):  # loopback delivers at once; a bound, not a wait for time
            if unread(self.transport.sock) >= len(data):
                return
        raise AssertionError("the bytes sent never reached the server's socket")

    def read(self) -> None:
        """The loop polls the socket: what waits in it goes to the protocol."""
        self.transport.sock.setblocking(False)
        try:
            data = self.transport.sock.recv(65536)
        except BlockingIOError:
            return
        self.proto.data_received(data)


def unread(sock: socket.socket) -> int:
    """The bytes waiting unread in ``sock`` (the kernel's count)."""
    pending = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending)
    return pending[0]


class Lab:
    """Connections to one server (one protocol class, one server state) on one manual loop."""

    def __init__(self, listener: socket.socket, limits: HttpSettings = LIMITS) -> None:
        self.listener = listener
        self.loop = ManualLoop()
        self.protocol = protocol_for(limits)
        self.config = Config(app=_app, http=self.protocol, lifespan="off")
        self.state = ServerState()
        self.sockets: list[socket.socket] = []

    def connect(self, source: str = "127.0.0.1") -> Connection:
        """A client connection from ``source`` (any 127.x.y.z: a client address of its own)."""
        client = socket.create_connection(self.listener.getsockname(), source_address=(source, 0))
        server, _ = self.listener.accept()
        self.sockets += [client, server]
        proto = self.protocol(self.config, self.state, {}, cast(Any, self.loop))
        transport = Transport(server)
        proto.connection_made(cast(Any, transport))
        return Connection(self.loop, proto, transport, client)

    def lose(self, conn: Connection) -> None:
        """The transport of a closed connection reports its loss (as asyncio does after a
        close)."""
        assert conn.transport.closed
        conn.proto.connection_lost(None)


def _lab(limits: HttpSettings = LIMITS) -> Iterator[Lab]:
    """A lab on a fresh loopback listener (``yield from`` it); its client sockets are closed
    after the test."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        the_lab = Lab(listener, limits)
        try:
            yield the_lab
        finally:
            for sock in the_lab.sockets:
                sock.close()


@pytest.fixture
def lab() -> Iterator[Lab]:
    yield from _lab()


@pytest.fixture
def conn(lab: Lab) -> Connection:
    return lab.connect()


async def _app(scope: object, receive: object, send: object) -> None:
    """Never run (the manual loop records tasks without running them)."""


# -- a client slow to start is not dropped -----------------------------------------------------


def test_a_client_slow_to_send_its_first_request_is_served_not_reset(conn: Connection) -> None:
    """Connected, then silent for far longer than the head deadline (a busy client): the
    connection stays open while the gateway has room, and the request, once sent, runs."""
    conn.loop.run_due(conn.loop.now + 4 * HEAD_S)
    assert not conn.transport.closed
    conn.send(REQUEST)
    conn.read()
    assert len(conn.loop.tasks) == 1
    assert conn.transport.written == b""


def test_a_connection_silent_past_its_timeout_is_closed(conn: Connection) -> None:
    conn.loop.run_due(conn.loop.now + SILENT_S - 1)
    assert not conn.transport.closed
    conn.loop.run_due(conn.loop.now + 1)
    assert conn.transport.closed
    assert conn.transport.written == b""  # nothing was asked: nothing to answer
    assert conn.loop.tasks == []


def test_the_head_deadline_counts_from_the_first_byte_of_the_first_request(
    conn: Connection,
) -> None:
    """A head trickled in after a long silence is cut ``HEAD_S`` after its first byte, not
    given the silence's time (the slow-head defence is whole)."""
    conn.loop.run_due(conn.loop.now + 5 * HEAD_S)
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\n")
    conn.read()
    conn.loop.run_due(conn.loop.now + HEAD_S - 1)
    assert not conn.transport.closed
    conn.loop.run_due(conn.loop.now + 1)
    assert conn.transport.closed
    assert conn.transport.written.startswith(b"HTTP/1.1 408 ")


def test_at_the_connection_cap_the_connection_silent_longest_makes_room(lab: Lab) -> None:
    """Over the cap (3), a new connection closes the one silent longest instead of being
    refused: silent connections cannot lock clients out, and a busy client is dropped only
    when the room is needed. One whose request waits unread is not silent."""
    oldest, sending, waiting = lab.connect(), lab.connect(), lab.connect()
    sending.send(b"POST /v1/chat/completions HTTP/1.1\r\n")
    sending.read()  # a request begun: not silent
    newest = lab.connect()
    assert oldest.transport.closed
    assert oldest.transport.written == b""
    assert [c.transport.closed for c in (sending, waiting, newest)] == [False] * 3
    lab.lose(oldest)
    waiting.send(REQUEST)  # sent, not read yet: it is not the one to close
    extra = lab.connect()
    assert newest.transport.closed
    assert not waiting.transport.closed
    assert not extra.transport.closed
    waiting.read()
    assert len(lab.loop.tasks) == 1  # the waiting request was served


def test_at_the_connection_cap_with_none_silent_one_more_is_refused(lab: Lab) -> None:
    conns = [lab.connect() for _ in range(3)]
    for c in conns:
        c.send(b"POST /v1/chat/completions HTTP/1.1\r\n")
        c.read()
    refused = lab.connect()
    assert refused.transport.closed
    assert refused.transport.written.startswith(b"HTTP/1.1 503 ")
    assert b"too_many_connections" in refused.transport.written
    assert not any(c.transport.closed for c in conns)


# -- a late loop: what waits unread is read before any verdict ---------------------------------


def test_a_request_waiting_unread_when_the_silent_timeout_is_due_is_read_not_reset(
    conn: Connection,
) -> None:
    """The client sent its request in time; the loop is late and finds the connection's
    timeout due before it reads the socket: the connection stays open, and once read the
    request runs."""
    conn.send(REQUEST)
    conn.loop.run_due(conn.loop.now + SILENT_S + 3)  # late: due 3 s ago
    assert not conn.transport.closed
    conn.read()
    assert len(conn.loop.tasks) == 1  # the request was dispatched to the application
    conn.loop.run_due(conn.loop.now + 1)
    assert not conn.transport.closed
    assert conn.transport.written == b""


def test_the_rest_of_a_head_waiting_unread_at_the_head_deadline_is_read_not_cut(
    conn: Connection,
) -> None:
    first, rest = REQUEST[:20], REQUEST[20:]
    conn.send(first)
    conn.read()
    conn.send(rest)
    conn.loop.run_due(conn.loop.now + HEAD_S + 2)
    assert not conn.transport.closed
    conn.read()
    assert len(conn.loop.tasks) == 1
    conn.loop.run_due(conn.loop.now + 1)
    assert not conn.transport.closed
    assert conn.transport.written == b""  # no 408


def test_a_head_trickled_past_the_deadline_is_cut_once_what_waited_is_read(
    conn: Connection,
) -> None:
    """Bytes waiting at the deadline delay the verdict only until they are read: a head still
    incomplete then gets its 408, as a slow client always did."""
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\n")
    conn.read()
    conn.send(b"Host: 127.0.0.1\r\n")
    conn.loop.run_due(conn.loop.now + HEAD_S + 1)
    assert not conn.transport.closed
    conn.read()  # more of the head: no request yet
    conn.loop.run_due(conn.loop.now + 1)
    assert conn.transport.closed
    assert conn.transport.written.startswith(b"HTTP/1.1 408 ")
    assert conn.loop.tasks == []


def test_a_body_waiting_unread_when_the_body_deadline_is_due_is_read(conn: Connection) -> None:
    head, body = REQUEST.split(b"\r\n\r\n")
    conn.send(head + b"\r\n\r\n")
    conn.read()
    assert len(conn.loop.tasks) == 1  # dispatched at the end of the head; the body follows
    conn.send(body)
    conn.loop.run_due(conn.loop.now + BODY_S + 2)
    assert not conn.transport.closed
    conn.read()
    conn.loop.run_due(conn.loop.now + BODY_S + 2)  # the body is in: no deadline any more
    assert not conn.transport.closed


def test_the_next_request_waiting_when_the_keep_alive_ends_is_read_not_reset(
    conn: Connection,
) -> None:
    """uvicorn's idle keep-alive close on a connection whose next request already waits: it
    is read instead (which cancels the keep-alive timer); an idle one is still closed."""
    conn.send(REQUEST)
    conn.proto.timeout_keep_alive_handler()  # the keep-alive timer, on a late loop
    assert not conn.transport.closed
    assert conn.proto.timeout_keep_alive_task is not None  # looks again once the loop read
    conn.read()
    assert conn.proto.timeout_keep_alive_task is None  # the request cancelled it
    assert len(conn.loop.tasks) == 1


def test_an_idle_connection_is_still_closed_at_the_end_of_its_keep_alive(
    conn: Connection,
) -> None:
    conn.proto.timeout_keep_alive_handler()
    assert conn.transport.closed


# -- one client address cannot fill the connection cap (issue 43, N5) --------------------------

#: 127.0.0.1 is an ordinary client here: the only trusted proxy is elsewhere
PER_ADDRESS = HttpSettings(
    max_connections=5, max_connections_per_address=2, trusted_proxies="10.9.9.9"
)
#: 127.0.0.1 is a trusted proxy (the default): its connections count for the forwarded client
BEHIND_PROXY = HttpSettings(max_connections=10, max_connections_per_address=2)
HEAD_BEGUN = b"POST /v1/chat/completions HTTP/1.1\r\n"


@pytest.fixture
def cap_lab() -> Iterator[Lab]:
    yield from _lab(PER_ADDRESS)


@pytest.fixture
def proxy_lab() -> Iterator[Lab]:
    yield from _lab(BEHIND_PROXY)


def test_unfinished_heads_from_one_address_cannot_fill_the_cap(cap_lab: Lab) -> None:
    """The finding: 1,000 unfinished heads from one address took the whole connection cap, and
    every other client got 503 ``too_many_connections``. One address now holds at most its own
    cap; the others are served."""
    attacker = [cap_lab.connect("127.0.0.1") for _ in range(2)]
    for c in attacker:
        c.send(HEAD_BEGUN)  # begun, never finished: not silent, nothing to evict
        c.read()
    refused = [cap_lab.connect("127.0.0.1") for _ in range(3)]
    for c in refused:
        assert c.transport.closed
        assert c.transport.written.startswith(b"HTTP/1.1 503 ")
        assert b"too_many_connections_from_address" in c.transport.written
        cap_lab.lose(c)
    victim = cap_lab.connect("127.0.0.2")
    assert not victim.transport.closed
    victim.send(REQUEST)
    victim.read()
    assert len(cap_lab.loop.tasks) == 1  # served
    assert not any(c.transport.closed for c in attacker)
    attacker[0].transport.close()
    cap_lab.lose(attacker[0])
    again = cap_lab.connect("127.0.0.1")  # one closed: the address has room again
    assert not again.transport.closed


def test_at_its_cap_an_address_closes_its_own_silent_connection_not_anothers(
    cap_lab: Lab,
) -> None:
    other = cap_lab.connect("127.0.0.3")  # silent longest of all
    mine = [cap_lab.connect("127.0.0.1") for _ in range(2)]  # silent too
    newest = cap_lab.connect("127.0.0.1")
    assert mine[0].transport.closed  # its own oldest silent one made room
    assert mine[0].transport.written == b""
    assert not other.transport.closed
    assert not newest.transport.closed
    assert not mine[1].transport.closed


def test_a_trusted_proxys_connections_count_for_the_forwarded_client(proxy_lab: Lab) -> None:
    """Behind a trusted proxy every client arrives from the proxy's address: each request is
    counted for the client its ``X-Forwarded-For`` names; the proxy's own are not counted."""

    def request(forwarded_for: str | None) -> bytes:
        xff = b"" if forwarded_for is None else f"X-Forwarded-For: {forwarded_for}\r\n".encode()
        return REQUEST.replace(b"Content-Length", xff + b"Content-Length")

    conns = [proxy_lab.connect() for _ in range(4)]  # all from the proxy (127.0.0.1)
    assert not any(c.transport.closed for c in conns)  # the proxy itself is not capped
    for c, xff in zip(
        conns,
        ["203.0.113.7", "198.51.100.1, 203.0.113.7", "203.0.113.7", "198.51.100.9"],
        strict=True,
    ):
        c.send(request(xff))
        c.read()
    third = conns[2]
    assert third.transport.closed  # 203.0.113.7's third connection
    assert third.transport.written.startswith(b"HTTP/1.1 503 ")
    assert b"too_many_connections_from_address" in third.transport.written
    assert [c.transport.closed for c in (conns[0], conns[1], conns[3])] == [False] * 3
    assert len(proxy_lab.loop.tasks) == 3
    own = proxy_lab.connect()  # the proxy's own requests (no header): not counted
    own.send(request(None))
    own.read()
    assert not own.transport.closed


def test_a_forwarded_address_from_an_untrusted_peer_is_ignored(cap_lab: Lab) -> None:
    """A client that is no trusted proxy cannot spread its connections over invented
    addresses: it counts as the address it connects from."""
    conns = [cap_lab.connect("127.0.0.1") for _ in range(2)]
    for i, c in enumerate(conns):
        c.send(
            REQUEST.replace(
                b"Content-Length", f"X-Forwarded-For: 192.0.2.{i}\r\nContent-Length".encode()
            )
        )
        c.read()
    third = cap_lab.connect("127.0.0.1")
    assert third.transport.closed
    assert b"too_many_connections_from_address" in third.transport.written
