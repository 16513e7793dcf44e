"""The quota store's hot path to a single Redis server: EVALSHA on connections the store holds.

Why not ``client.evalsha`` (redis-py's ``execute_command``): per command it checks a connection
out of the blocking pool (a condition lock and a ``can_read`` poll of the socket), wraps the call
in a retry closure, times it for its observability hooks, packs and encodes every argument, and
puts a socket timeout around the write (``asyncio.wait_for``) and another around the read. The
store needs none of that per call: :meth:`RedisQuotaStore._call` already bounds the calls in
flight (one connection each, so nobody waits here) and puts its own lag-compensated deadline
around each one (:mod:`fairgate.store.deadline`), and the store packs its arguments once
(the keys cached per pool, key and bucket). What a lane call costs is one ``writelines``, one read
by redis-py's own parser (hiredis when installed), nothing else.

What is kept from redis-py: its connection class (TLS, AUTH, database selection, the hiredis or
Python parser: everything the URL says) and its error handling on the socket. A read or write
that fails or is cancelled (the store's deadline cancels it) disconnects the connection, so a
reply can never be read by the wrong call; the next call on it reconnects. As on the store's
client: one immediate retry on a connection error only (a Redis restart costs no failed
command; retrying a timeout could apply a script twice), and a script the server does not know
(``NOSCRIPT``, a Redis restarted empty) is loaded on that connection and run again.

Only for a single server: a Redis Cluster routes each script by its keys' slot and follows
``MOVED`` redirections, which is the cluster client's job (the store uses it there).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

__all__ = ["LaneScript", "ScriptLane", "command"]

_EVALSHA: Final = b"$7\r\nEVALSHA\r\n"
_LOAD: Final = b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n"


class LaneScript:
    """A script as the lane sends it: its SHA1 and its source, encoded once."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source, usedforsecurity=False).hexdigest().encode()


def command(sha: bytes, keys: list[bytes], args: list[bytes]) -> bytes:
    """``EVALSHA sha numkeys *keys *args`` in RESP, from the keys' and arguments' bytes."""
    numkeys = b"%d" % len(keys)
    out = [
        b"*%d\r\n%b$40\r\n%b\r\n$%d\r\n%b\r\n"
        % (3 + len(keys) + len(args), _EVALSHA, sha, len(numkeys), numkeys)
    ]
    out.extend(b"$%d\r\n%b\r\n" % (len(v), v) for v in keys)
    out.extend(b"$%d\r\n%b\r\n" % (len(v), v) for v in args)
    return b"".join(out)


class ScriptLane:
    """Connections for EVALSHA, held by one store, each used by one call at a time.

    The caller bounds the calls in flight (the store's slots): the lane opens a connection when
    none is idle and keeps it for good, so it never holds more than that bound."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        # the pool's connection settings (host, TLS, AUTH, db, parser) without its socket
        # timeout: the store's deadline bounds every call (module docstring)
        kwargs = {**pool.connection_kwargs, "socket_timeout": None}
        self._connection_class: type[AbstractConnection] = pool.connection_class
        self._kwargs = kwargs
        self._idle: list[AbstractConnection] = []
        self._all: list[AbstractConnection] = []

    def _take(self) -> AbstractConnection:
        if self._idle:
            return self._idle.pop()
        conn = self._connection_class(**self._kwargs)
        self._all.append(conn)
        return conn

    async def evalsha(self, script: LaneScript, keys: list[bytes], args: list[bytes]) -> Any:
        """``EVALSHA`` of ``script`` with ``keys`` and ``args``; its reply. The script is loaded
        on the connection when the server does not know it."""
        packed = command(script.sha, keys, args)
        conn = self._take()
        try:
            was_open = conn.is_connected
            try:
                return await self._round_trip(conn, packed)
            except RedisConnectionError:
                if not was_open:  # the connect itself failed (redis-py retried it once)
                    raise
                # an open connection broke (redis-py closed it); the retry reconnects: a Redis
                # restart costs no failed command
                return await self._round_trip(conn, packed)
        except NoScriptError:
            load = b"%b$%d\r\n%b\r\n" % (_LOAD, len(script.source), script.source)
            await self._round_trip(conn, load)
            return await self._round_trip(conn, packed)
        finally:
            self._idle.append(conn)

    @staticmethod
    async def _round_trip(conn: AbstractConnection, packed: bytes) -> Any:
        # send_packed_command connects when needed; both calls close the connection on a
        # failure or a cancel, so an unread reply never stays on it
        await conn.send_packed_command(packed, check_health=False)
        return await conn.read_response()

    async def open(self, count: int) -> int:
        """Open up to ``count`` connections now, one after the other (before traffic; see
        ``RedisQuotaStore.warm``). Returns how many are open: the first failure stops there,
        and the caller logs the shortfall (the server may be back by the time traffic comes)."""
        held = [self._take() for _ in range(count)]
        opened = 0
        try:
            for conn in held:
                await conn.connect()  # type: ignore[no-untyped-call]
                opened += 1
        except (RedisError, OSError):
            pass
        finally:
            self._idle.extend(held)
        return opened

    async def close(self) -> None:
        for conn in self._all:
            await conn.disconnect()
        self._idle.clear()
        self._all.clear()
