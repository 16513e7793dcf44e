"""Resilience persistence off the event loop: one thread of its own, with a connection of its own.

Why: the metadata DB connection the repositories use is synchronous and lives on the event loop.
Resilience rows are written on the request path (a lockout learned from a success's rate-limit
headers, a cooldown after a 429), so a write inline would hold the loop, and with it every
request of the process, for as long as the database takes to answer. On PostgreSQL that is
forever when the server hangs (a frozen host accepts the connection and never replies), and the
change watcher that would notice the outage cannot run while the loop waits. Here the loop only
records what to write; a daemon thread writes it, on its own connection, in order.

- **Coalesced by row**: a write replaces a pending write of the same row in its place, so
  while the database hangs the queue holds at most one write per row (connections × models,
  providers), never one per request; the writes carry the merged state, so the last
  one is the one that counts.
- **Durability**: a write is sent as soon as the thread is free (one primary-key upsert, well
  under a millisecond on a responsive database); a ``kill -9`` loses what was still queued, a
  graceful stop waits for the queue (:meth:`PersistenceWriter.close`, bounded by a deadline
  so a hung database cannot hold the shutdown). What is lost is only what a restart would
  restore: the live state stays in the resilience store (memory or Redis) either way.
- A failed write is logged and dropped, as the inline write was; the thread reopens its
  connection for the next one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Hashable
from typing import Final, TypeVar, cast

import psycopg

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.db.common import MetadataUnavailable
from fairgate.resilience.persistence import PersistedState, SqlitePersistence, push_into
from fairgate.resilience.state import ResilienceStore

__all__ = ["CLOSE_TIMEOUT_S", "PersistenceWriter"]

log = logging.getLogger("fairgate.resilience")

#: A graceful stop waits this long for the queued writes (a hung database must not hold it).
CLOSE_TIMEOUT_S: Final = 2.0
_DB_ERRORS: Final = (sqlite3.Error, MetadataUnavailable, psycopg.Error)

T = TypeVar("T")
Write = Callable[[SqlitePersistence], object]


class PersistenceWriter:
    """Queues resilience writes for a thread that runs them on a connection from ``connect``.

    ``connect`` opens the metadata DB (called on the thread, again after a failed write).
    Methods are called from the event loop; only the thread touches the connection.
    """

    def __init__(self, connect: Callable[[], Database], *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._connect = connect
        self._clock = clock
        self._cond = threading.Condition()
        # row (or a unique token) -> (what to run, its op name, where to put its result)
        self._pending: dict[Hashable, tuple[Write, str, concurrent.futures.Future[object]]] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self._persistence: SqlitePersistence | None = None
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()

    # -- the loop's side -----------------------------------------------------------------------

    def submit(self, row: Hashable, op: str, write: Write) -> None:
        """Queue ``write`` of the row ``row`` (replacing a queued write of that row)."""
        self._queue(row, op, write)

    async def restore(self, store: ResilienceStore) -> PersistedState:
        """Load every active row (on the thread) and push it into ``store``; at start."""
        state: PersistedState = await self._run("load", lambda p: p.load())
        await push_into(store, state)
        return state

    async def flush(self) -> None:
        """Wait until everything queued before this call is written (or failed)."""
        await self._run("flush", lambda p: None)

    @property
    def pending(self) -> int:
        """Writes queued and not started yet."""
        with self._cond:
            return len(self._pending)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Wait for the queue up to ``timeout_s``, then stop the thread (what is still queued
        is lost, and logged: the database did not answer in time)."""
        if self._thread is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.flush(), timeout_s)
        with self._cond:
            self._closing = True
            left = len(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        if left:
            log.warning("resilience persistence: %d writes not saved at stop", left)
        # the thread closes its connection as it ends: wait for that (not for a hung database)
        with contextlib.suppress(asyncio.TimeoutError):
            stopped = asyncio.shield(asyncio.wrap_future(self._stopped))
            await asyncio.wait_for(stopped, max(0.0, end - loop.time()))

    # -- plumbing ------------------------------------------------------------------------------

    async def _run(self, op: str, call: Callable[[SqlitePersistence], T]) -> T:
        token = object()
        future = self._queue(token, op, call)
        try:
            return cast(T, await asyncio.wrap_future(future))
        except asyncio.CancelledError:  # given up (a deadline): it is no longer queued either
            with self._cond:
                self._pending.pop(token, None)
            raise

    def _queue(self, key: Hashable, op: str, write: Write) -> concurrent.futures.Future[object]:
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                future.set_exception(RuntimeError("resilience persistence is closed"))
                return future
            self._pending[key] = (write, op, future)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="fairgate-resilience-persist", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if self._closing:
                    break
                key = next(iter(self._pending))
                write, op, future = self._pending.pop(key)
            if not future.set_running_or_notify_cancel():
                continue  # its waiter gave up
            try:
                result = write(self._open())
            except _DB_ERRORS as exc:
                log.warning("resilience persistence %s failed: %s", op, exc)
                self._drop_connection()
                future.set_exception(exc)
            except BaseException as exc:  # a bug: reported to whoever waits, the thread goes on
                log.exception("resilience persistence %s failed", op)
                future.set_exception(exc)
            else:
                future.set_result(result)
        self._drop_connection()
        self._stopped.set_result(None)

    def _open(self) -> SqlitePersistence:
        if self._persistence is None:
            self._persistence = SqlitePersistence(self._connect(), clock=self._clock)
        return self._persistence

    def _drop_connection(self) -> None:
        if self._persistence is not None:
            with contextlib.suppress(*_DB_ERRORS):
                self._persistence.connection.close()
            self._persistence = None
