"""The quota store's hot path to a single Redis server: EVALSHA pipelined on one connection.

Why not ``client.evalsha`` (redis-py's ``execute_command``): per command it checks a connection
out of the blocking pool (a condition lock and a ``can_read`` poll of the socket), wraps the call
in a retry closure, times it for its observability hooks, packs and encodes every argument, and
puts a socket timeout around the write (``asyncio.wait_for``) and another around the read. The
store needs none of that per call: :meth:`RedisQuotaStore._call` already bounds the calls in
flight and puts its own lag-compensated deadline around each one
(:mod:`fairgate.backends.deadline`), and the store packs its arguments once (the keys cached
per pool, key and bucket).

Why one pipelined connection, not a connection per call: a governed request makes two script
calls, and each call on its own connection costs a write, a loop wake-up and a read in this
process and the same again in redis-server, on the same two cores. Here every call made in one
turn of the event loop goes out in one write (the flush is the loop's next callback), and
redis-server answers a pipeline's commands in one write, which one ``data_received`` parses
(hiredis, directly) and hands out in order. Redis runs one command at a time whatever the
number of connections, so one connection holds nobody back.

What a call that fails or is cancelled does to the others on its connection: nothing. Replies
come back in the order the commands went out, so a cancelled call (the store's deadline)
leaves its place in the queue and its reply is read and dropped when it comes; but a call the
server did not answer in time may mean a connection that is gone without a word (a dropped
route), so the connection is *retired*: new calls go to a fresh one, and the retired one closes
once every call still on it has been answered or abandoned. Nothing is ever resent on a
connection that still answers (a script applied twice would count a request twice). A
connection that breaks (the server closed it, a restart) fails the calls on it with a connection
error, and each gets one immediate retry on a new connection, as on the store's client: a Redis
restart costs no failed command.

What is kept from redis-py: its connection class opens the connection (TCP or a Unix socket,
TLS, AUTH, database selection: everything the URL says, and its connect retry); the lane then
takes over the connection's transport with its own protocol (``set_protocol``). Its error
mapping (``NOSCRIPT`` is :class:`~redis.exceptions.NoScriptError`, and so on) is used for the
replies. A script the server does not know (a Redis restarted empty) is loaded and run again on
the same connection, the load and the call in one write.

Only for a single server: a Redis Cluster routes each script by its keys' slot and follows
``MOVED`` redirections, which is the cluster client's job (the store uses it there).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from typing import Any, Final

import hiredis
import redis.asyncio
from redis._parsers import BaseParser
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError

__all__ = ["LaneCounts", "LaneScript", "ScriptLane", "command"]

_EVALSHA: Final = b"$7\r\nEVALSHA\r\n"
#: How long a call nobody waits for on a request's path may wait for one that is (seconds).
LATER_S: Final = 0.002
_LOAD: Final = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"


class LaneScript:
    """A script as the lane sends it: its SHA1, its ``SCRIPT LOAD`` command, encoded once."""

    __slots__ = ("load", "sha")

    def __init__(self, source: str) -> None:
        text = source.encode()
        self.sha = hashlib.sha1(text, usedforsecurity=False).hexdigest().encode()
        self.load = b"%b$%d\r\n%b\r\n" % (_LOAD, len(text), text)


#: ``$<n>\r\n``, the head of a bulk string of ``n`` bytes, for the lengths most values have
_BULK_HEAD: Final = tuple(b"$%d\r\n" % n for n in range(1024))


def command(sha: bytes, keys: list[bytes], args: list[bytes]) -> bytes:
    """``EVALSHA sha numkeys *keys *args`` in RESP, from the keys' and arguments' bytes.

    Packed with one table lookup and one concatenation per value and one join (an admission
    has about 40 values: far cheaper than formatting each one, docs/performance.md, "Figures
    behind the code")."""
    values = keys + args
    numkeys = b"%d" % len(keys)
    head = b"*%d\r\n%b$40\r\n%b\r\n$%d\r\n%b\r\n" % (
        3 + len(values),
        _EVALSHA,
        sha,
        len(numkeys),
        numkeys,
    )
    if not values:
        return head
    try:
        body = b"\r\n".join([_BULK_HEAD[len(v)] + v for v in values])
    except IndexError:  # a value longer than the table
        body = b"\r\n".join([b"$%d\r\n%b" % (len(v), v) for v in values])
    return head + body + b"\r\n"


class LaneCounts:
    """What a lane did so far: connections opened, writes made (each carrying every call of
    one loop turn). For the tests and benchmarks; one integer add per write."""

    __slots__ = ("opened", "writes")

    def __init__(self) -> None:
        self.opened = 0
        self.writes = 0


class _Pipe(asyncio.Protocol):
    """One connection's protocol: commands written in order, replies handed out in order."""

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        loop: asyncio.AbstractEventLoop,
        decode: str | None,
        counts: LaneCounts,
    ) -> None:
        # the stream writer redis-py connected with is kept while the connection lives: once
        # collected, it closes a transport that is still open (asyncio's unclosed-stream rule)
        self._writer = writer
        self._transport = writer.transport
        self._loop = loop
        kwargs: dict[str, Any] = {"protocolError": InvalidResponse, "replyError": _reply_error}
        if decode is not None:
            kwargs["encoding"] = decode
        self._reader = hiredis.Reader(**kwargs)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._out: list[bytes] = []
        self._soon = False  # a flush is due at the loop's next turn
        self._timer: asyncio.TimerHandle | None = None  # a flush of later calls only
        self._counts = counts
        self.closed = False
        self.retired = False

    @property
    def usable(self) -> bool:
        """Takes new calls: open and not retired."""
        return not (self.closed or self.retired)

    def call(self, packed: bytes, *, later: bool = False) -> asyncio.Future[Any]:
        """Queue ``packed`` for this turn's write; the future is its reply (or its error).
        ``later``: up to :data:`LATER_S` later, with the next call that is not (see
        :meth:`ScriptLane.evalsha`)."""
        if self.closed:
            raise RedisConnectionError("the script connection is closed")
        fut = self._loop.create_future()
        self._waiting.append(fut)
        self._out.append(packed)
        if not later:
            if not self._soon:
                self._soon = True
                self._loop.call_soon(self._flush)
        elif self._timer is None and not self._soon:
            self._timer = self._loop.call_later(LATER_S, self._flush)
        return fut

    def _flush(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._out and not self.closed:
            self._transport.write(b"".join(self._out))
            self._counts.writes += 1
        self._out.clear()

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        waiting = self._waiting
        try:
            while (reply := _next_reply(reader)) is not False:
                if not waiting:  # a reply nobody asked for: the stream is out of step
                    raise InvalidResponse("a reply with no command waiting for it")
                fut = waiting.popleft()
                if fut.done():  # its caller gave up (a deadline): drop its reply
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
        except InvalidResponse as exc:
            self._lose(RedisConnectionError(f"the script connection broke: {exc}"))
            return
        if self.retired and not waiting:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(RedisConnectionError("the script connection was closed by the server"))

    def _lose(self, error: RedisConnectionError) -> None:
        self.closed = True
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(error)
        self._transport.close()

    def retire(self) -> None:
        """Take no new calls; close once every call on it is answered or abandoned."""
        self.retired = True
        if all(fut.done() for fut in self._waiting):  # at most the calls in flight
            self.close()

    def close(self) -> None:
        if not self.closed:
            self._lose(RedisConnectionError("the script connection was closed"))


def _next_reply(reader: hiredis.Reader) -> Any:
    """The reader's next reply (False: none complete yet). A reply that a decoding client
    cannot decode (``decode_responses`` and bytes that are not UTF-8) is its caller's
    ``UnicodeDecodeError``, as redis-py raises it; the reader has consumed it, so the replies
    after it stay in step (it used to escape ``data_received`` and close the connection under
    every call on it)."""
    try:
        return reader.gets()
    except UnicodeDecodeError as exc:
        return exc


def _reply_error(text: str) -> Exception:
    """An error reply as redis-py would raise it (``NOSCRIPT`` -> NoScriptError, ...)."""
    error: Exception = BaseParser.parse_error(text)  # type: ignore[no-untyped-call]
    return error


def _retrieve(task: asyncio.Task[_Pipe]) -> None:
    if not task.cancelled():
        task.exception()


class ScriptLane:
    """The store's one pipelined script connection on a single server (module docstring).

    The caller bounds the calls in flight (the store's slots). A connection is opened when
    there is none (one at a time, whoever asks) and kept until it breaks or is retired."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        # the pool's connection settings (host, TLS, AUTH, db, parser) without its socket
        # timeout: the store's deadline bounds every call (module docstring)
        self._kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._connection_class: type[AbstractConnection] = pool.connection_class
        self._decode: str | None = (
            pool.connection_kwargs.get("encoding", "utf-8")
            if pool.connection_kwargs.get("decode_responses")
            else None
        )
        self._pipe: _Pipe | None = None
        self._opening: asyncio.Task[_Pipe] | None = None
        self._pipes: list[_Pipe] = []  # every connection not yet closed, for close()
        self.counts = LaneCounts()

    async def evalsha(
        self, script: LaneScript, keys: list[bytes], args: list[bytes], *, later: bool = False
    ) -> Any:
        """``EVALSHA`` of ``script`` with ``keys`` and ``args``; its reply. The script is loaded
        when the server does not know it. ``later``: nobody waits for it on a request's path (a
        settle batch), so it waits up to :data:`LATER_S` for the next call that is (an
        admission) and goes in its write: with ``serve --workers N`` each process's loop turns
        carry fewer calls, and a settle alone in its turn cost a write here, a read and a
        write in redis-server, and a read here again."""
        packed = command(script.sha, keys, args)
        pipe = self._pipe
        if pipe is None or not pipe.usable:
            pipe = await self._connection()
        try:
            try:
                return await self._await(pipe, pipe.call(packed, later=later))
            except RedisConnectionError:
                # the connection broke under the call; the retry reconnects: a Redis restart
                # costs no failed command
                pipe = await self._connection()
                return await self._await(pipe, pipe.call(packed))
        except NoScriptError:
            loaded = pipe.call(script.load)  # the load and the call in one write, in order
            again = pipe.call(packed)
            await self._await(pipe, loaded)
            return await self._await(pipe, again)

    @staticmethod
    async def _await(pipe: _Pipe, fut: asyncio.Future[Any]) -> Any:
        try:
            return await fut
        except asyncio.CancelledError:
            # not answered in time (or its caller went away): the connection may be dead
            # without a word, so new calls go to a fresh one (module docstring)
            pipe.retire()
            raise

    async def _connection(self) -> _Pipe:
        """The open connection, opening one when there is none; concurrent callers share one
        opening, which a caller's deadline cannot cancel for the others."""
        pipe = self._pipe
        if pipe is not None and pipe.usable:
            return pipe
        opening = self._opening
        if opening is None or opening.done():
            opening = self._opening = asyncio.get_running_loop().create_task(self._open())
            # its error is every waiter's; retrieved here too in case they all gave up
            opening.add_done_callback(_retrieve)
        return await asyncio.shield(opening)

    async def _open(self) -> _Pipe:
        conn = self._connection_class(**self._kwargs)
        await conn.connect()  # type: ignore[no-untyped-call]
        # the handshake is done (TLS, AUTH, SELECT); from here the transport is the lane's
        writer = conn._writer  # redis-py keeps the connection's stream here
        if writer is None:  # pragma: no cover - connect() either sets it or raises
            raise RedisConnectionError("the script connection did not open")
        conn._writer = conn._reader = None  # detached: redis-py must not close it
        pipe = _Pipe(writer, asyncio.get_running_loop(), self._decode, self.counts)
        writer.transport.set_protocol(pipe)
        self._pipes = [p for p in self._pipes if not p.closed]
        self._pipes.append(pipe)
        self._pipe = pipe
        self.counts.opened += 1
        return pipe

    @property
    def connected(self) -> bool:
        return self._pipe is not None and self._pipe.usable

    async def open(self) -> bool:
        """Open the connection now (before traffic; see ``RedisQuotaStore.warm``). Returns
        whether it is open: a failure is the caller's to log (the server may be back by the
        time traffic comes)."""
        try:
            await self._connection()
        except (RedisConnectionError, OSError):
            return False
        return True

    async def close(self) -> None:
        for pipe in self._pipes:
            pipe.close()
        self._pipes.clear()
        self._pipe = None
