"""The HTTP server on the wire: uvicorn's httptools protocol with the limits it lacks.

uvicorn (httptools mode) buffers a request head without any bound (a 64 MiB header is read
whole; httptools joins partial header values in memory), accepts any number of headers, has no
deadline for a head or a body (a client trickling one byte every few seconds holds a connection
and a task forever), arms its keep-alive timer only after a first response (a connection that
never sends a byte stays open), and has no limit on open connections (``limit_concurrency``
answers 503 but still keeps every connection). :class:`LimitedHttpToolsProtocol` adds:

- head size: bytes are counted *before* the parser sees them, so memory stays bounded by the
  limit; over it → 431 and close;
- header count: over it → 431 and close;
- head deadline: from the first byte of a request until the end of its headers; expired → 408
  and close (a client trickling its head is cut however it paces it);
- a new connection that has not sent a byte yet is *silent*: it is closed after
  ``silent_timeout_s``, or earlier when the cap on open connections needs room (below). A
  busy client can take seconds between its connect, which the kernel completes at once, and
  its request: a first-request deadline counted from the connection closed such clients
  while the gateway had room to spare, and the request they then sent met a reset (issue 41:
  the ``httpx.ReadError`` of a 1,600-client storm on two busy cores, whose one client process
  fell seconds behind the connects the kernel had completed);
- body deadline: from the end of the headers until the whole body is in; expired → 408 (if no
  answer started) and close, which the application sees as a client disconnect;
- idle keep-alive: as uvicorn's, with our timeout;
- a cap on open connections: one over it closes the connection that has been silent longest
  (a flood of connections that send nothing cannot lock clients out), or, when none is
  silent, gets 503 and is closed at once;
- a cap on the open connections of one client address, checked first, the same way among
  that address's own connections (its silent one, else 503 ``too_many_connections_from_address``):
  one address could fill the whole cap with request heads it never finished, and every other
  client got 503 until the attacker stopped (issue 43, N5). A trusted proxy's connections
  (``FORWARDED_ALLOW_IPS``) are counted by the client their ``X-Forwarded-For`` names, from
  each request's complete head; a trusted peer's own connections are not counted.

Every deadline and the keep-alive timeout judge what the client *sent*, not what the event loop
got round to reading: when one expires while the client's bytes wait unread in the socket, the
connection is looked at again once the loop has read them (:meth:`LimitedHttpToolsProtocol.
_unread`). On a busy host the loop can fall seconds behind, and uvloop (libuv) runs the timers
that are due *before* it polls the sockets: a request that arrived in time would otherwise be
met by a close, and closing a socket with unread bytes resets the connection, so the client
would get a reset instead of an answer (issue 41). A client that really sends nothing, or too
little, is cut as before.

:func:`run` starts uvicorn with this protocol; every limit comes from :class:`HttpSettings`.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import termios
from asyncio import TimerHandle
from typing import Any, ClassVar

import httptools
import orjson
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from fairgate.process.http_settings import HttpSettings, TrustedProxies

__all__ = ["LimitedHttpToolsProtocol", "protocol_for", "run", "server_options"]

log = logging.getLogger("fairgate.wire")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request we refuse."""


#: What the connection's one deadline timer is for (none, the request head, the body, the first
#: byte of a new connection).
_NONE, _HEAD, _BODY, _SILENT = 0, 1, 2, 3
#: The refusal of a connection (or a proxied request) whose client address is at its cap.
_ADDRESS_FULL = (
    "too_many_connections_from_address",
    "Too many open connections from this client address",
)
#: A deadline timer that fires this close to its deadline counts as on time (loop clocks round).
_SLACK_S = 0.001
#: How soon a deadline that found the client's bytes unread looks again: a whole millisecond
#: or more, so that libuv polls the sockets (and the protocol reads them) before the timer runs.
_RECHECK_S = 0.01


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection (see the module docstring). ``limits`` is set by
    :func:`protocol_for`.

    The silent, head and body deadlines share one timer per connection, re-armed lazily: arming a
    later deadline leaves the pending timer alone (when it fires it finds the deadline moved
    on and waits again), only an earlier one replaces it. A keep-alive connection then arms
    about one timer per head timeout instead of two timers per request. Header counts are
    checked when the head is complete (before the request is dispatched) and after each read
    while the head is open, so a head never holds more than one read's headers past the
    limit."""

    limits: ClassVar[HttpSettings] = HttpSettings()
    #: the connections that have not sent a byte yet, oldest first (an insertion-ordered set:
    #: the first is the one to close when the connection cap needs room); one per class, and
    #: :func:`protocol_for` makes a class per server
    silent: ClassVar[dict[LimitedHttpToolsProtocol, None]] = {}
    #: open connections per client address (only the counted ones: see :meth:`_count`)
    by_address: ClassVar[dict[str, int]] = {}
    proxies: ClassVar[TrustedProxies] = TrustedProxies("127.0.0.1")

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.timeout_keep_alive = self.limits.keep_alive_s  # type: ignore[assignment]
        self._head_open = True  # the bytes arriving now belong to a request head
        self._head_bytes = 0
        self._deadline_for = _NONE
        self._deadline = 0.0  # loop time
        self._timer: TimerHandle | None = None
        self._timer_at = 0.0
        self._refusal: tuple[int, str, str] | None = None
        self._address: str | None = None  # the client address this connection counts for
        self._proxied = False  # the peer is a trusted proxy: count by X-Forwarded-For

    # -- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        self._proxied = peer is not None and self.proxies.trusts(peer)
        if peer is not None and not self._proxied and not self._count(peer):
            log.debug("connection refused: address limit reached", extra={"client": peer})
            self._reply(503, *_ADDRESS_FULL)
            return
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            log.debug("connection refused: limit reached", extra={"client": self._peer()})
            self._reply(503, "too_many_connections", "The gateway has too many open connections")
            return
        self.silent[self] = None
        self._arm(_SILENT, self.limits.silent_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.silent.pop(self, None)
        self._uncount()
        self._cancel_timers()
        super().connection_lost(exc)

    def _count(self, address: str) -> bool:
        """Count this connection for ``address``; over the per-address cap, first close that
        address's connection silent longest. False (not counted) when there is none."""
        n = self.by_address.get(address, 0)
        if n >= self.limits.max_connections_per_address and not self._make_room(address):
            return False
        self.by_address[address] = self.by_address.get(address, 0) + 1
        self._address = address
        return True

    def _uncount(self) -> None:
        address = self._address
        if address is None:
            return
        self._address = None
        n = self.by_address.get(address, 0) - 1
        if n > 0:
            self.by_address[address] = n
        else:
            self.by_address.pop(address, None)

    def _make_room(self, address: str | None = None) -> bool:
        """Closes the connection that has been silent longest (one whose request is waiting
        unread is not silent), of ``address`` when given; False when there is none. An
        address's scan runs only when it is at its cap."""
        for conn in self.silent:
            if conn.transport.is_closing() or conn._unread():
                continue
            if address is not None and conn._address != address:
                continue
            del self.silent[conn]
            log.debug("connection closed: silent, room needed", extra={"client": conn._peer()})
            conn._uncount()
            conn._cancel_timers()
            conn.transport.close()
            return True
        return False

    def _count_forwarded(self) -> bool:
        """A trusted proxy's request: count its connection for the client the request's
        ``X-Forwarded-For`` names (the proxy's own requests, without one, are not counted).
        False when that client is at its cap."""
        forwarded = None
        for name, value in self.headers:
            if name == b"x-forwarded-for":
                forwarded = value
        client = None if forwarded is None else self.proxies.client_of(forwarded.decode("latin-1"))
        if client == self._address:
            return True
        self._uncount()
        return client is None or self._count(client)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if not self._head_open:
            self._feed(data)
            return
        if self._deadline_for != _HEAD:  # the first byte of a request
            if self._deadline_for == _SILENT:  # ... on a new connection
                self.silent.pop(self, None)
            self._arm(_HEAD, self.limits.header_timeout_s)
        room = self.limits.max_header_bytes - self._head_bytes
        if len(data) <= room:
            head, rest = data, b""
        else:
            head, rest = data[:room], data[room:]
        self._head_bytes += len(head)
        if head:
            self._feed(head)
        if self.transport.is_closing():
            return
        if self._head_open and self._too_many_headers():  # a head still open past the count
            self._refuse(self._header_count_refusal())
            return
        if not rest:
            return
        if self._reading_head():  # the head goes on past the limit: never give it to the parser
            self._refuse_head(
                f"Request headers exceed the limit of {self.limits.max_header_bytes} bytes"
            )
            return
        self.data_received(rest)

    def _reading_head(self) -> bool:
        """Whether the bytes arriving now still belong to a request head (the parser's
        callbacks flip it while :meth:`data_received` feeds it)."""
        return self._head_open

    def _too_many_headers(self) -> bool:
        headers = self.headers  # the head being read (uvicorn collects them; None before one)
        return headers is not None and len(headers) > self.limits.max_headers

    def _header_count_refusal(self) -> tuple[int, str, str]:
        return (
            431,
            "request_header_fields_too_large",
            f"Too many request headers (the limit is {self.limits.max_headers})",
        )

    # -- parser callbacks ---------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        if self._too_many_headers():
            self._refusal = self._header_count_refusal()
            raise _Refused
        if self._proxied and not self._count_forwarded():
            self._refusal = (503, *_ADDRESS_FULL)
            raise _Refused
        self._head_open = False
        self._arm(_BODY, self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._deadline_for = _NONE  # the body is in: no deadline until the next request
        self._head_open, self._head_bytes = True, 0
        super().on_message_complete()

    def _feed(self, data: bytes) -> None:
        """Hand ``data`` to the parser (uvicorn's ``data_received``, with our answers): a
        request we refuse, or one that does not parse, is answered and logged at debug level,
        since anyone can send them and a warning each would let them flood the log."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(self._refusal)
            else:
                log.debug("invalid HTTP request", extra={"client": self._peer()})
                self._reply(400, "invalid_http_request", "Invalid HTTP request")

    def _refuse(self, refusal: tuple[int, str, str]) -> None:
        status, code, message = refusal
        log.debug("request refused", extra={"client": self._peer(), "code": code})
        self._reply(status, code, message)

    # -- deadlines ----------------------------------------------------------------------------

    def _arm(self, what: int, timeout_s: float) -> None:
        """From now, ``what`` (the head or the body) must be in within ``timeout_s``."""
        at = self.loop.time() + timeout_s
        self._deadline_for, self._deadline = what, at
        timer = self._timer
        if timer is None or self._timer_at > at:
            if timer is not None:
                timer.cancel()
            self._timer, self._timer_at = self.loop.call_at(at, self._deadline_due), at

    def _deadline_due(self) -> None:
        self._timer = None
        what = self._deadline_for
        if what == _NONE:
            return  # nothing was due any more: the next deadline arms a timer again
        if self.loop.time() < self._deadline - _SLACK_S:  # the deadline moved on meanwhile
            self._timer, self._timer_at = (
                self.loop.call_at(self._deadline, self._deadline_due),
                self._deadline,
            )
            return
        if self._unread():  # sent in time, not read yet: judge once the loop has read it
            at = self.loop.time() + _RECHECK_S
            self._timer, self._timer_at = self.loop.call_at(at, self._deadline_due), at
            return
        self._deadline_for = _NONE
        if what == _SILENT:
            self._silent_expired()
        elif what == _HEAD:
            self._head_expired()
        else:
            self._body_expired()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's idle keep-alive close, unless the client's next request is already waiting
        unread (then it is read, which cancels the keep-alive timer, and answered)."""
        if self._unread():
            self.timeout_keep_alive_task = self.loop.call_later(
                _RECHECK_S, self.timeout_keep_alive_handler
            )
            return
        super().timeout_keep_alive_handler()

    def _unread(self) -> int:
        """How many bytes the client sent that wait unread in the socket while the protocol
        reads (0 while reading is paused: those bytes wait by our choice, and the deadline is
        the application's to keep; 0 without a socket to ask)."""
        if self.flow is not None and self.flow.read_paused:
            return 0
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return 0
        pending = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending)
        except (OSError, ValueError):  # closed meanwhile (fileno -1)
            return 0
        return pending[0]

    def _cancel_timers(self) -> None:
        self._deadline_for = _NONE
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _silent_expired(self) -> None:
        self.silent.pop(self, None)
        if not self.transport.is_closing():
            log.debug("connection closed: silent", extra={"client": self._peer()})
            self.transport.close()

    def _head_expired(self) -> None:
        if self.transport.is_closing():
            return
        idle = self._head_bytes == 0
        log.debug(
            "connection closed: idle" if idle else "connection closed: request head too slow",
            extra={"client": self._peer(), "received": self._head_bytes},
        )
        if idle or (self.cycle is not None and not self.cycle.response_complete):
            self.transport.close()  # nothing asked, or an answer still being written
        else:
            self._reply(408, "request_timeout", "The request headers took too long to arrive")

    def _body_expired(self) -> None:
        if self.transport.is_closing():
            return
        log.debug("connection closed: request body too slow", extra={"client": self._peer()})
        if self.cycle is not None and not self.cycle.response_started:
            self._reply(408, "request_timeout", "The request body took too long to arrive")
        else:
            self.transport.close()

    # -- answers ------------------------------------------------------------------------------

    def _refuse_head(self, message: str) -> None:
        log.debug("request refused: head too large", extra={"client": self._peer()})
        self._reply(431, "request_header_fields_too_large", message)

    def _reply(self, status: int, code: str, message: str) -> None:
        """Answer with an OpenAI-shaped JSON error and close (the request is not read further,
        so the connection cannot be reused)."""
        body = orjson.dumps(
            {"error": {"message": message, "type": "invalid_request_error", "code": code}}
        )
        head = [STATUS_LINE[status]]
        head += [n + b": " + v + b"\r\n" for n, v in self.server_state.default_headers]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self._cancel_timers()
        self.transport.write(b"".join(head) + body)
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "?"


def protocol_for(limits: HttpSettings) -> type[LimitedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``limits``."""
    return type(
        "FairgateHttpProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "limits": limits,
            "silent": {},
            "by_address": {},
            "proxies": TrustedProxies(limits.trusted_proxies),
        },
    )


def server_options(limits: HttpSettings, drain_s: int) -> dict[str, Any]:
    """uvicorn's options for a gateway process, one process (:func:`run`) or several
    (:mod:`fairgate.server.workers`)."""
    return {
        "loop": "uvloop",
        "log_level": "warning",
        "log_config": None,  # uvicorn's loggers propagate to our JSON handler (configure_logging)
        # uvicorn's access lines are info (never written at our level), but their arguments are
        # still built for every answer unless the access log is off
        "access_log": False,
        # "server: uvicorn" on every answer tells a scanner what to probe and a client nothing
        "server_header": False,
        # the forwarded client address is read only where it is used (process/edge.py), not for
        # every /v1 request
        "proxy_headers": False,
        "timeout_graceful_shutdown": drain_s,
        # a deep accept queue lets a connection burst wait for a slot instead of a reset
        "backlog": max(2048, limits.max_connections),
    }


def run(app: Any, host: str, port: int, limits: HttpSettings, drain_s: int = 30) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT/SIGTERM (in-flight requests drain for up to
    ``drain_s`` seconds first)."""
    uvicorn.run(
        app, host=host, port=port, http=protocol_for(limits), **server_options(limits, drain_s)
    )
