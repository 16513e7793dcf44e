"""Change propagation: every replica (or worker) learns that the metadata changed, within a second.

Why a counter: the registry tables carry triggers that bump the one-row ``meta_version`` on each
write (fairgate.db.schema, migration 5), whoever writes: another replica's admin API, a second
worker on the same SQLite file, the CLI. A replica only has to compare that number with the one
its snapshot was built at; when it differs it rebuilds the registry (one assignment swaps it in,
so requests never wait and never see a mix).

- SQLite (workers of one machine): poll the counter every ``poll_s`` (default 0.25 s), a
  primary-key read of a page that is in the cache.
- PostgreSQL (replicas): ``LISTEN fairgate_meta`` on a dedicated async connection, woken by the
  trigger's ``pg_notify`` within milliseconds; the same counter is read on every wake-up and at
  least every ``poll_s`` (default 1 s), so a lost notification (or one sent while the listener
  was reconnecting) is caught by the poll.

When the database cannot be read, the replica keeps its snapshot, ``healthy`` turns False
(``/health`` says ``metadata: down``) and the watcher retries; the first successful read after
the outage compares the counter again, so the replica converges.

The rebuild never runs on the event loop (issue 48, item 5): ``rebuild`` reads the tables on a
thread of the watcher's own, over a connection of its own, and only ``apply`` (assignments, no
I/O) runs on the loop. A server that answers the version read and then hangs on the tables (a
lock, a frozen disk) held the loop, and with it every request of the replica, for the
connection's statement deadline (5.0 s seen); now requests go on being served from the last
snapshot, and a rebuild that has not finished within :data:`REBUILD_TIMEOUT_S` of responsive
loop time marks the database down (``/health`` degraded) until one does.

A server that hangs (a frozen process, a network that drops packets) is down too: the version
read on the async connection has a deadline (:data:`READ_TIMEOUT_S` of responsive loop time,
``fairgate.backends.deadline``), and while the watcher finds the server down the synchronous
connection the repositories use refuses statements at once (``PgDatabase.reachable``), so an
admin call answers 503 instead of holding the event loop on a server that does not answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, TypeVar

import psycopg

from fairgate.backends.deadline import NoReply, call_within
from fairgate.db.base import Database
from fairgate.db.common import MetadataUnavailable
from fairgate.db.postgres import PgDatabase
from fairgate.db.schema import NOTIFY_CHANNEL

log = logging.getLogger("fairgate.db.watch")

SQLITE_POLL_S: Final = 0.25
POSTGRES_POLL_S: Final = 1.0
_VERSION_SQL: Final = "SELECT version FROM meta_version WHERE id = 1"
#: The version read on the listening connection may take this long (responsive loop time, so a
#: busy host is no outage) before the server counts as not answering; at most READ_CEILING_S.
#: Generous: a false "down" refuses admin writes for a moment, and the shared PostgreSQL of a
#: loaded host can be slow; a hang is still noticed within a poll plus this.
READ_TIMEOUT_S: Final = 5.0
READ_CEILING_S: Final = 30.0
#: A rebuild (on its thread) not done after this long of responsive loop time marks the
#: database down; it goes on, and the snapshot it reads is applied when it ends.
REBUILD_TIMEOUT_S: Final = 5.0

S = TypeVar("S")


async def _read_within(read: Awaitable[int], abandoned: list[asyncio.Future[int]]) -> int:
    """The version read, given up after :data:`READ_TIMEOUT_S` of responsive loop time. The
    read runs as its own task behind a shield: on a hung server psycopg answers a cancel by
    asking the server to cancel the query and waiting for it (seconds more), so the deadline
    stops waiting for the read at once. The read given up is put in ``abandoned``: it still
    waits on its connection's socket, which must not be closed before it ends."""
    task = asyncio.ensure_future(read)
    try:
        return await call_within(asyncio.shield(task), READ_TIMEOUT_S, ceiling_s=READ_CEILING_S)
    except BaseException:
        task.cancel()
        task.add_done_callback(_settled)
        abandoned.append(task)
        raise


def _settled(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned read's outcome (no "exception was never retrieved")."""
    if not task.cancelled():
        task.exception()


#: Connections whose close waits for an abandoned read (kept referenced until closed).
_CLOSING: set[asyncio.Future[None]] = set()


def _close_after(read: asyncio.Future[int], conn: psycopg.AsyncConnection[Any]) -> None:
    """Close ``conn`` once ``read`` has ended. Closing it while psycopg still waits on its
    socket would close a file descriptor the event loop watches: the number is soon reused
    (the next connection), and uvloop aborts the process on the stale registration."""

    def close(_: asyncio.Future[int]) -> None:
        closing = asyncio.ensure_future(conn.close())
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)

    read.add_done_callback(close)


class MetadataProbe:
    """Whether the PostgreSQL server answers now, asked without holding the event loop: a
    ``SELECT 1`` on an async connection of its own, given up after :data:`READ_TIMEOUT_S` of
    responsive loop time.

    Why: the admin API's repositories use the synchronous connection on the loop; a statement
    sent to a server that has just hung (before the watcher noticed) held the loop, and every
    request of the replica, for the statement deadline (5.0 s seen, issue 48 item 5). An admin
    call asks this first: while it waits, requests go on; a server that does not answer makes
    the call a 503 and the synchronous connection refuses statements until the watcher reads
    from the server again."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._abandoned: list[asyncio.Future[int]] = []

    async def answers(self) -> bool:
        async with self._lock:
            try:
                conn: psycopg.AsyncConnection[Any] | None = self._conn
                if conn is None or conn.closed or conn.broken:
                    conn = await call_within(
                        psycopg.AsyncConnection.connect(
                            self._url, autocommit=True, connect_timeout=3
                        ),
                        READ_TIMEOUT_S,
                        ceiling_s=READ_CEILING_S,
                    )
                    self._conn = conn
                assert conn is not None
                await _read_within(self._one(conn), self._abandoned)
                return True
            except (psycopg.Error, NoReply, OSError):
                self._drop()
                return False

    async def close(self) -> None:
        async with self._lock:
            self._drop()

    @staticmethod
    async def _one(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT 1")
        row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    def _drop(self) -> None:
        """Forget the connection; closed once a read given up on it has ended (_close_after)."""
        conn, self._conn = self._conn, None
        pending = [t for t in self._abandoned if not t.done()]
        self._abandoned.clear()
        if conn is None:
            return
        if pending:
            _close_after(pending[0], conn)
        else:
            closing = asyncio.ensure_future(conn.close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)


def read_version(db: Database) -> int:
    row = db.execute(_VERSION_SQL).fetchone()
    return int(row[0]) if row is not None else 0


class ChangeWatcher(Generic[S]):
    """Rebuilds the snapshot whenever the counter moved: ``rebuild()`` reads it from the
    database on the watcher's thread (it opens its own connection there), ``apply(snapshot)``
    swaps it in on the event loop and says whether it did (False: the snapshot was stale, and
    the next check reads again).

    ``seen`` is the counter the current snapshot reflects; set it just before building the first
    snapshot so a write in between is caught by the first poll. ``url`` is the PostgreSQL URL to
    listen on (None: poll ``db``, the SQLite file).
    """

    def __init__(
        self,
        db: Database,
        rebuild: Callable[[], S],
        apply: Callable[[S], bool],
        *,
        url: str | None = None,
        poll_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rebuild_timeout_s: float = REBUILD_TIMEOUT_S,
    ) -> None:
        self._db = db
        self._rebuild = rebuild
        self._apply = apply
        #: how long a rebuild may take (responsive loop time) before the DB counts as down
        self.rebuild_timeout_s = rebuild_timeout_s
        #: one thread: rebuilds run one at a time, and one still hung holds the next back
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fg-meta")
        #: True while a rebuild runs on the thread (a test's view of a hung one)
        self.rebuilding = False
        self._url = url
        self.poll_s = poll_s if poll_s is not None else POSTGRES_POLL_S if url else SQLITE_POLL_S
        self._sleep = sleep
        self.seen = 0
        #: False while the database cannot be read (the snapshot in use is the last good one).
        self.healthy = True
        #: How many times the snapshot was rebuilt because the counter moved.
        self.reloads = 0
        #: True while a PostgreSQL ``LISTEN`` is in place (notifications arrive).
        self.listening = False

    def start_version(self) -> int:
        """Read the counter before the first snapshot is built (see class doc)."""
        self.seen = read_version(self._db)
        return self.seen

    async def check(self, version: int | None = None) -> bool:
        """Compare the counter (read from ``db`` unless given) and rebuild on a change; True if
        rebuilt. A failed read or rebuild keeps the old snapshot and marks the DB down; the
        counter still differs, so the next check rebuilds again."""
        try:
            current = read_version(self._db) if version is None else version
        except (MetadataUnavailable, psycopg.Error) as exc:
            self._down(exc)
            return False
        if current == self.seen:
            self._up()  # it answered, and the snapshot is current
            return False
        try:
            snapshot = await self._rebuilt()
        except (MetadataUnavailable, psycopg.Error, NoReply) as exc:
            self._down(exc)
            return False
        self._up()
        if not self._apply(snapshot):
            return False  # stale: left unseen, so the next check reads it again
        self.seen = current
        self.reloads += 1
        return True

    async def _rebuilt(self) -> S:
        """The rebuild, run on the watcher's thread; given up after the rebuild timeout of
        responsive loop time (``NoReply``): the thread goes on, and its result is dropped."""
        loop = asyncio.get_running_loop()
        future = asyncio.wrap_future(self._thread.submit(self._rebuild_marked), loop=loop)
        future.add_done_callback(_settled)
        return await call_within(
            asyncio.shield(future), self.rebuild_timeout_s, ceiling_s=READ_CEILING_S
        )

    def _rebuild_marked(self) -> S:
        self.rebuilding = True
        try:
            return self._rebuild()
        finally:
            self.rebuilding = False

    def close(self) -> None:
        """Stop the rebuild thread (one still running on a hung server is left to end)."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def run(self) -> None:
        """Until cancelled."""
        if self._url is None:
            while True:
                await self._sleep(self.poll_s)
                await self.check()
        while True:
            try:
                await self._listen(self._url)
            except (psycopg.Error, NoReply) as exc:
                self._down(exc)
                await self._sleep(min(self.poll_s, POSTGRES_POLL_S))
            finally:
                self.listening = False

    async def _listen(self, url: str) -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=3)
        abandoned: list[asyncio.Future[int]] = []
        try:
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.listening = True
            while True:
                # read on the async connection: the event loop never waits on the network here
                version = await _read_within(self._read_version(conn), abandoned)
                await self.check(version)
                async for _ in conn.notifies(timeout=self.poll_s, stop_after=1):
                    pass
        finally:
            # closed, not left through ``async with``: that would first roll back (autocommit:
            # nothing to roll back), and on a server that hangs the rollback would wait for it,
            # delaying the "down" that the caller reports next; after a read given up, only
            # once that read has ended (see _close_after)
            pending = [t for t in abandoned if not t.done()]
            if pending:
                _close_after(pending[0], conn)
            else:
                await conn.close()

    @staticmethod
    async def _read_version(conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute(_VERSION_SQL)
        row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    def _down(self, exc: BaseException) -> None:
        if self.healthy:
            reason = str(exc).strip().splitlines()[:1] or [type(exc).__name__]
            log.warning("metadata database unavailable, serving the last snapshot: %s", reason[0])
        self.healthy = False
        self._reachable(False)

    def _up(self) -> None:
        if not self.healthy:
            log.info("metadata database reachable again")
        self.healthy = True
        self._reachable(True)

    def _reachable(self, yes: bool) -> None:
        if isinstance(self._db, PgDatabase):
            self._db.set_reachable(yes)
