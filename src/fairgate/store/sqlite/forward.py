"""Forwarding: the quota file's owner counts in memory for every process on the file.

Why: the memory mode (:mod:`fairgate.store.sqlite.memory`) is exact only while one process
changes the file, so a second process (``serve --workers 2``) used to make the owner hand over
and every process count transactionally: a SQLite write transaction per loop turn in each,
pages read again after the other's commits, waits on the writers' lock. CPU per request went
up by half (docs/performance.md). Instead, a process that finds an owner sends it its calls
(admit, settle, release, ...) over a local stream socket and the owner answers them from the
same in-memory counters as its own: one place decides, so limits stay exact, and the file
keeps one writer.

The hop is kept cheap by pipelining in both directions: every call a forwarder makes in one
turn of its event loop goes out as one frame (one ``write``), and the owner answers every
call of a frame it can answer at once (all of them, in memory mode) in one frame. A frame is a
4-byte length and a pickled list: ``[(id, method, args), ...]`` one way, ``[(id, ok, value),
...]`` the other. Pickle because both ends are the same code and the values are the store
port's records; it is only ever read from a peer running as the same user (``SO_PEERCRED``),
which could write the quota file itself anyway.

An owner that stops gracefully (a worker restarted, the group stopping) says goodbye on every
connection before it closes it: everything it read before was answered before the goodbye,
which names the calls it is still running (counting transactionally since a hand-over), so
every other call a forwarder is waiting for was never read and is sent again to the next owner
(:class:`Unsent`): a graceful restart loses no call. What a forwarder cannot know is whether a
call in flight when the owner *died* was applied (a ``kill -9``, like one of a process alone
in memory mode, loses its last few milliseconds of counting): such a call fails with the
store's unavailable error (the engine fails open for an admission and journals a settle, as in
any store outage) and is never re-sent (a settle sent twice would count twice). The next call
finds a new owner first (:meth:`SqliteQuotaStore`'s rejoin: this process takes the file
itself, or forwards to whoever did).
"""

from __future__ import annotations

import asyncio
import copyreg
import dataclasses
import io
import operator
import os
import pickle
import socket
import sqlite3
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, cast

from fairgate.domain.units import Unit
from fairgate.quota.decision import DimensionCheck, Outcome, Reason, Scope, Verdict
from fairgate.quota.hold import HoldTicket, QueueFull
from fairgate.quota.model import Policy
from fairgate.quota.ports import (
    AdmitRequest,
    AdmitResult,
    CounterRef,
    GcResult,
    PoolCounts,
    ReservationExists,
    UsageItem,
)
from fairgate.quota.window import Anchor, Count

_LEN = struct.Struct("<I")
#: A frame larger than this is a broken peer, not a batch (a batch of 10,000 calls is ~5 MB).
MAX_FRAME = 64 * 1024 * 1024

#: The store methods a forwarder may ask the owner to run, and nothing else.
FORWARDED = frozenset(
    {
        "admit",
        "settle",
        "release",
        "record",
        "peek",
        "pool_usage",
        "active_keys",
        "cumulative",
        "anchors",
        "set_anchor",
        "clear",
        "gc",
        "flush",
        "leave",
        "waiters",
        "ping",
    }
)


#: How long a call nobody waits for on a request's path may wait for one that is (seconds).
LATER_S = 0.002

#: The call id of an owner's goodbye (real calls count from 1); its value: the ids still running.
BYE = 0


class Unsent(sqlite3.OperationalError):
    """The owner stopped without reading this call: it can go to the next owner as it is."""


def _went_away() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("the quota file's owner process went away")


class Later:
    """An answer the owner cannot give at once (it is counting transactionally): the awaitable
    that gives it."""

    __slots__ = ("aw",)

    def __init__(self, aw: Awaitable[Any]) -> None:
        self.aw = aw


#: ``answer(method, args)``: the result, or :class:`Later`; raises what the call raises.
Answer = Callable[[str, tuple[Any, ...]], Any]


#: The records that cross the socket, pickled as ``cls(*fields)``: pickle's own way for a
#: slotted dataclass (a state dict per record, set field by field on load) took about 36 µs of
#: CPU to write and read an admission's request and answer, this about 26 (process time).
_RECORDS = (
    AdmitRequest,
    AdmitResult,
    DimensionCheck,
    Verdict,
    Count,
    Anchor,
    UsageItem,
    CounterRef,
    PoolCounts,
    GcResult,
    HoldTicket,
)

#: The enums inside those records, pickled as an index into :data:`_MEMBERS` (read back by
#: :func:`_member`): pickle's own way for an enum member calls its class with the value on
#: load (``EnumType.__call__``, Python code) and its ``__reduce_ex__`` on dump, about 2.5 µs a
#: member against 0.4; an admission's request carries five of them. A test walks the records'
#: fields and fails on an enum missing here.
_ENUMS: tuple[type[Enum], ...] = (Unit, Scope, Policy, Outcome, Reason, QueueFull)
_MEMBERS: tuple[Enum, ...] = tuple(m for cls in _ENUMS for m in cls)


def _member(index: int) -> Enum:
    """An enum member read from a frame (:data:`_ENUMS`)."""
    return _MEMBERS[index]


#: per enum class, member → its reduction, computed once (the dispatch table then calls
#: ``dict.__getitem__``, C). One dict per class: members of two ``StrEnum`` classes with one
#: value (``Scope.POOL``, ``QueueFull.POOL``) are equal and hash alike.
_REDUCED: dict[type[Enum], dict[Enum, tuple[Callable[[int], Enum], tuple[int]]]] = {
    cls: {} for cls in _ENUMS
}
for _i, _m in enumerate(_MEMBERS):  # by position: a list's index() would compare by value
    _REDUCED[type(_m)][_m] = (_member, (_i,))
del _i, _m


def _fields(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    get = operator.attrgetter(*names)
    if len(names) == 1:
        return lambda o: (get(o),)
    return cast(Callable[[Any], tuple[Any, ...]], get)


def _reducer(cls: type) -> Callable[[Any], tuple[type, tuple[Any, ...]]]:
    get = _fields(cls)
    return lambda o: (cls, get(o))


_DISPATCH: dict[type, Any] = {
    **copyreg.dispatch_table,
    **{cls: _reducer(cls) for cls in _RECORDS},
    **{cls: _REDUCED[cls].__getitem__ for cls in _ENUMS},
}


class _Framer:
    """Frames with :data:`_DISPATCH`, on one reused pickler (one per connection end: frames
    are made on the event loop's thread only)."""

    __slots__ = ("_buf", "_pickler")

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._pickler = pickle.Pickler(self._buf, pickle.HIGHEST_PROTOCOL)
        self._pickler.dispatch_table = _DISPATCH

    def frame(self, payload: object) -> bytes:
        buf = self._buf
        buf.seek(0)
        buf.truncate()
        buf.write(b"\0\0\0\0")
        self._pickler.clear_memo()
        self._pickler.dump(payload)
        raw = buf.getbuffer()
        _LEN.pack_into(raw, 0, len(raw) - _LEN.size)
        out = bytes(raw)
        del raw  # a BytesIO cannot be resized while a view of it lives
        return out


class _Frames:
    """Splits a byte stream into frames' payloads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        at = 0
        while len(buf) - at >= _LEN.size:
            (n,) = _LEN.unpack_from(buf, at)
            if n > MAX_FRAME:
                raise ValueError("forwarded frame too large")
            end = at + _LEN.size + n
            if end > len(buf):
                break
            out.append(buf[at + _LEN.size : end])
            at = end
        self._buf = buf[at:]
        return out


def _error(exc: BaseException) -> tuple[str, str]:
    """An exception as it crosses the socket: the kinds the engine tells apart."""
    if isinstance(exc, ReservationExists):
        return ("exists", str(exc.args[0]) if exc.args else "")
    if isinstance(exc, sqlite3.OperationalError | OSError):
        return ("unavailable", str(exc))
    if isinstance(exc, ValueError):
        return ("value", str(exc))
    return ("error", f"{type(exc).__name__}: {exc}")


def _raise(kind: str, text: str) -> BaseException:
    if kind == "exists":  # with the owner's message (its constructor takes the id)
        exists = ReservationExists.__new__(ReservationExists)
        ValueError.__init__(exists, text)
        return exists
    if kind == "unavailable":
        return sqlite3.OperationalError(text)
    if kind == "value":
        return ValueError(text)
    return RuntimeError(text)


def same_user(sock: socket.socket) -> bool:
    """Is the peer of a Unix socket this process's user (``SO_PEERCRED``)?"""
    try:
        cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _, uid, _ = struct.unpack("3i", cred)
    return bool(uid == os.getuid())


class _Serving(asyncio.Protocol):
    """The owner's end of one forwarder's connection."""

    def __init__(self, answer: Answer, tasks: set[asyncio.Task[Any]]) -> None:
        self._answer = answer
        self._tasks = tasks
        self._frames = _Frames()
        self._transport: asyncio.Transport | None = None
        self._framer = _Framer()
        self._running: set[int] = set()  # ids of calls answered :class:`Later`

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, only alike)
        sock = transport.get_extra_info("socket")
        if sock is None or not same_user(sock):
            transport.close()
            return
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._transport is None:
            return
        try:
            payloads = self._frames.feed(data)
        except ValueError:
            self._transport.close()
            return
        for payload in payloads:
            out: list[tuple[int, bool, Any]] = []
            for cid, name, args in pickle.loads(payload):
                if name not in FORWARDED:
                    out.append((cid, False, ("error", f"not forwarded: {name}")))
                    continue
                try:
                    result = self._answer(name, args)
                except Exception as exc:  # the caller's error, handed back to it
                    out.append((cid, False, _error(exc)))
                    continue
                if isinstance(result, Later):
                    self._later(cid, result.aw)
                else:
                    out.append((cid, True, result))
            if out:
                self._send(out)

    def _later(self, cid: int, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        self._running.add(cid)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            self._running.discard(cid)
            if t.cancelled():
                self._send([(cid, False, ("unavailable", "the owner is closing"))])
            elif (exc := t.exception()) is not None:
                self._send([(cid, False, _error(exc))])
            else:
                self._send([(cid, True, t.result())])

        task.add_done_callback(done)

    def _send(self, answers: list[tuple[int, bool, Any]]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(self._framer.frame(answers))

    def goodbye(self) -> None:
        """Say which calls are still running, then close (module docstring)."""
        t = self._transport
        if t is not None:
            self._send([(BYE, True, sorted(self._running))])
            t.close()


class ForwardServer:
    """The owner's listener: serves forwarded calls on the running loop with ``answer``."""

    def __init__(self, sock: socket.socket, answer: Answer) -> None:
        self._sock = sock
        self._answer = answer
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._conns: list[_Serving] = []
        loop = asyncio.get_running_loop()
        self._starting: asyncio.Task[None] | None = loop.create_task(self._start())

    def _protocol(self) -> _Serving:
        p = _Serving(self._answer, self._tasks)
        self._conns = [c for c in self._conns if c._transport is not None]  # forwarders gone
        self._conns.append(p)
        return p

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._protocol, sock=self._sock)
        self._starting = None

    def close(self) -> None:
        """Stop listening and drop every forwarder (each then finds a new owner)."""
        if self._starting is not None:
            self._starting.cancel()
            self._starting = None
        if self._server is not None:
            self._server.close()
            self._server = None
        else:
            self._sock.close()
        for conn in self._conns:
            conn.goodbye()
        self._conns = []


def _first(pending: dict[int, Any]) -> int:
    """The oldest call id still waiting (ids grow; a dict keeps its insertion order)."""
    return next(iter(pending), 1 << 62)


class ForwardClient(asyncio.Protocol):
    """A forwarder's connection to the owner: :meth:`call` pipelines, one write per loop turn."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        """``timeout_s``: an owner that answers nothing for this long (stopped, not dead: a
        dead one's socket closes) fails the calls waiting for it, as SQLite's busy timeout
        fails a writer that waits for a stopped one's lock."""
        self._sock: socket.socket | None = sock
        self._timeout_s = timeout_s
        #: (loop time, the last call id) of each frame sent and not yet fully answered
        self._sent: deque[tuple[float, int]] = deque()
        self._watch: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._opening: asyncio.Future[None] | None = None
        self._frames = _Frames()
        self._framer = _Framer()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: the loop the connection lives on, taken once: ``asyncio.get_running_loop()`` asks
        #: the kernel for the pid on every call (Python 3.11's check against a fork), a
        #: ``getpid`` system call per forwarded call and per frame
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out: list[tuple[int, str, tuple[Any, ...]]] = []
        self._soon = False  # a flush is due at the loop's next turn
        self._timer: asyncio.TimerHandle | None = None  # a flush of later calls only
        self._next = 0
        #: the owner went away (or never answered): the store finds a new one before its
        #: next call
        self.lost = False
        #: calls sent and frames written (how much the pipelining saved: tests, benchmarks)
        self.calls = 0
        self.writes = 0

    async def _open(self) -> None:
        if self._opening is None:
            loop = self._loop = asyncio.get_running_loop()
            self._opening = loop.create_future()
            try:
                sock, self._sock = self._sock, None
                assert sock is not None
                sock.setblocking(False)
                await loop.create_unix_connection(lambda: self, sock=sock)
            except BaseException as exc:
                self._opening.set_exception(exc)
                self.lost = True
                raise
            finally:
                if not self._opening.done():
                    self._opening.set_result(None)
        await asyncio.shield(self._opening)

    async def call(self, name: str, args: tuple[Any, ...], *, later: bool = False) -> Any:
        """Have the owner run store method ``name(*args)``; its result or its error (the
        store's unavailable error when the owner goes away first). ``later``: nobody waits
        for it on a request's path (a settle, a release), so it may wait up to
        :data:`LATER_S` for a call that is (the next admission) and go in the same frame: the
        owner's wake-ups and the frames are then about one per admission, not per call."""
        if self._transport is None:
            if self.lost:
                raise Unsent("the quota file's owner process went away")
            await self._open()
        loop = self._loop
        assert loop is not None  # set by the first call's _open
        fut = loop.create_future()
        cid = self._next = self._next + 1
        self._pending[cid] = fut
        self._out.append((cid, name, args))
        if not later:
            if not self._soon:
                self._soon = True
                loop.call_soon(self._flush)
        elif self._timer is None and not self._soon:
            self._timer = loop.call_later(LATER_S, self._flush)
        self.calls += 1
        return await fut

    def _flush(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        out, self._out = self._out, []
        if not out:
            return
        t = self._transport
        if t is None or t.is_closing():
            self._fail(out)
            return
        t.write(self._framer.frame(out))
        self.writes += 1
        loop = self._loop
        assert loop is not None
        self._sent.append((loop.time(), out[-1][0]))
        if self._watch is None:
            self._watch = loop.call_later(self._timeout_s, self._check)

    def _check(self) -> None:
        """The owner's answers are late: fail everything waiting once the oldest unanswered
        call was sent ``timeout_s`` ago (the owner is stopped), else look again later."""
        self._watch = None
        pending, sent = self._pending, self._sent
        oldest = _first(pending)
        while sent and sent[0][1] < oldest:
            sent.popleft()  # every call of that frame is answered
        if not sent:
            return
        loop = self._loop
        assert loop is not None
        due = sent[0][0] + self._timeout_s
        if loop.time() < due:
            self._watch = loop.call_at(due, self._check)
            return
        self.lost = True
        self._pending = {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(
                    sqlite3.OperationalError("the quota file's owner is not answering")
                )
        if self._transport is not None:
            self._transport.close()

    def _fail(self, calls: list[tuple[int, str, tuple[Any, ...]]]) -> None:
        """Calls never written: the next owner gets them."""
        for cid, _, _ in calls:
            fut = self._pending.pop(cid, None)
            if fut is not None and not fut.done():
                fut.set_exception(Unsent("the quota file's owner process went away"))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """No goodbye (the owner died): whether a call waiting for its answer was applied
        is unknown, so each fails (module docstring)."""
        self.lost = True
        self._transport = None
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(_went_away())

    def _goodbye(self, running: list[int]) -> None:
        """The owner stops: the calls it names may be applied, every other was not read."""
        self.lost = True
        pending, self._pending = self._pending, {}
        still = set(running)
        for cid, fut in pending.items():
            if not fut.done():
                fut.set_exception(_went_away() if cid in still else Unsent("owner stopped"))
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self._frames.feed(data)
        except ValueError:
            if self._transport is not None:
                self._transport.close()
            return
        pending = self._pending
        for payload in payloads:
            for cid, ok, value in pickle.loads(payload):
                if cid == BYE:
                    self._goodbye(value)
                    return
                fut = pending.pop(cid, None)
                if fut is None or fut.done():  # its caller was cancelled
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(_raise(*value))

    async def drain(self) -> None:
        """Send what waits and wait for every answer (a graceful stop loses no settle)."""
        if self._out:
            self._flush()
        pending = list(self._pending.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.lost = True
        if self._transport is not None:
            self._transport.close()
        elif self._sock is not None:
            self._sock.close()
            self._sock = None
