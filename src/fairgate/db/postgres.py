"""PostgreSQL as the metadata DB: the adapter that lets the SQLite-shaped repositories run on it.

Why an adapter rather than a second set of repositories: one place for each behaviour. The
repositories keep their portable SQL; this module translates the few differences, each once:

- placeholders ``?`` → ``%s`` (outside string literals), and ``%`` escaped;
- ``BEGIN IMMEDIATE`` (SQLite's "take the write lock before reading") → ``BEGIN`` plus a
  transaction-scoped advisory lock, so a check-then-write cannot race another replica either:
  metadata writes are rare admin actions, serialising them cluster-wide costs nothing;
- two-argument ``MAX(a, b)`` → ``GREATEST(a, b)``; ``INSERT OR IGNORE`` → ``ON CONFLICT DO
  NOTHING``; Python booleans → 0/1 (the columns are integers on both engines);
- in migrations, ``INTEGER`` → ``BIGINT`` (epoch milliseconds), ``REAL`` → ``DOUBLE PRECISION``
  and ``TEXT`` → ``TEXT COLLATE "C"`` (SQLite's byte order, so listings sort the same).

Rows answer by position and by column name, like ``sqlite3.Row``. Migrations run under a
session advisory lock, so replicas starting together apply each version exactly once.

A dropped connection is reopened on the next statement outside a transaction; while the server
is unreachable every statement raises :class:`~fairgate.db.common.MetadataUnavailable`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Final, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus

from fairgate.db.common import MetadataUnavailable
from fairgate.db.schema import MIGRATIONS, statements

#: Advisory lock ids ("fairgate" as a 64-bit integer, and the next one for migrations).
WRITE_LOCK: Final = 0x6661697267617465
MIGRATE_LOCK: Final = WRITE_LOCK + 1
#: Seconds to wait for the server when (re)connecting: a replica must not hang on a dead DB.
CONNECT_TIMEOUT_S: Final = 3
#: Seconds a statement on the gateway's own (event-loop) connection may wait for the server
#: before it gives up (:class:`_BoundedConnection`); plenty for the metadata DB's statements.
STATEMENT_DEADLINE_S: Final = 5.0
#: psycopg's own interval between checks for Ctrl-C while it waits (its default).
_WAIT_INTERVAL_S: Final = 0.1

RV = TypeVar("RV")

_LITERAL_OR_QMARK = re.compile(r"'(?:[^']|'')*'|\?")
_MAX2 = re.compile(r"\bMAX\(\s*([\w.]+)\s*,\s*([\w.]+)\s*\)")
_OR_IGNORE = re.compile(r"\bINSERT\s+OR\s+IGNORE\s+INTO\b")
_DDL_TYPES = (
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


@lru_cache(maxsize=512)
def translate_sql(sql: str, with_params: bool = True) -> str:
    """The repositories' SQLite-flavoured statement as PostgreSQL runs it (see module doc)."""
    out = sql
    if with_params:
        out = out.replace("%", "%%")
        out = _LITERAL_OR_QMARK.sub(lambda m: "%s" if m.group() == "?" else m.group(), out)
    out = _MAX2.sub(r"GREATEST(\1, \2)", out)
    if _OR_IGNORE.search(out):
        out = _OR_IGNORE.sub("INSERT INTO", out).rstrip().rstrip(";") + " ON CONFLICT DO NOTHING"
    return out


def translate_ddl(sql: str) -> str:
    """A migration statement's column types as PostgreSQL needs them (see module doc)."""
    for pattern, replacement in _DDL_TYPES:
        sql = pattern.sub(replacement, sql)
    return sql


class PgRow:
    """A result row readable like ``sqlite3.Row``: ``row[0]``, ``row["id"]``, unpacking."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
    index = {col.name: i for i, col in enumerate(cursor.description or ())}
    return lambda values: PgRow(values, index)


def _params(parameters: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(int(p) if isinstance(p, bool) else p for p in parameters)


class _BoundedConnection(psycopg.Connection[PgRow]):
    """psycopg's connection whose statements give up after :attr:`statement_deadline_s`.

    Why: the connection is synchronous and, in the gateway, used on the event loop. A server
    that hangs (a frozen host: the kernel still accepts and acknowledges, nothing answers) never
    fails a statement by itself: no TCP timeout fires, and a cancel request would wait on the
    same frozen server. psycopg's own wait takes a timeout; every statement passes through it,
    so the loop is held for the deadline at most, where it was held until the server came
    back. None (the default): no deadline (a CLI, the resilience writer's own thread)."""

    statement_deadline_s: float | None = None

    def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None
    ) -> RV:
        if timeout is None:
            timeout = self.statement_deadline_s
        return super().wait(gen, interval, timeout)


class PgDatabase:
    """One autocommit psycopg connection shaped like the ``sqlite3.Connection`` the repositories
    use (``execute``, ``executemany``, ``in_transaction``, ``close``)."""

    def __init__(self, url: str, conn: psycopg.Connection[PgRow]) -> None:
        self.url = url
        self._conn = conn
        #: None: a statement may wait as long as the server takes (a CLI, the resilience
        #: writer's own thread); else it gives up after that long (:class:`_BoundedConnection`;
        #: set by :meth:`connect`, after the migrations, and given to every reopened connection)
        self.statement_deadline_s: float | None = None
        #: False while the change watcher finds the server not answering (db/watch.py): every
        #: statement then fails at once. This connection is synchronous and used on the event
        #: loop, so a statement sent to a server that hangs (rather than refuses) would hold
        #: the loop, and with it every request of the replica, until the server came back.
        self.reachable = True

    def set_reachable(self, yes: bool) -> None:
        """Told by the change watcher whether the server answers (:attr:`reachable`). Back from
        an outage, the connection is closed to be reopened by the next statement: it lived
        through the outage untouched (statements were refused), so it may be one the server
        dropped, and its first use would fail an admin write that could have succeeded."""
        if yes and not self.reachable and not self.in_transaction:
            self._conn.close()
        self.reachable = yes

    @classmethod
    def connect(
        cls, url: str, *, migrate: bool = True, statement_deadline_s: float | None = None
    ) -> PgDatabase:
        """Connect (and migrate: without a deadline, the migration lock may be held for a
        while by another replica migrating), then apply ``statement_deadline_s``."""
        conn = _open(url)
        db = cls(url, conn)
        if migrate:
            migrate_postgres(db)
        db.statement_deadline_s = conn.statement_deadline_s = statement_deadline_s
        return db

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open. A broken connection reports its status as UNKNOWN,
        which is not IDLE, yet its transaction is gone and the next statement reopens the
        connection outside any: it counts as none (else the first write after a database
        restart was taken for a nested one and sent a SAVEPOINT outside a transaction)."""
        if self._conn.broken or self._conn.closed:
            return False
        return self._conn.info.transaction_status != TransactionStatus.IDLE

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[PgRow]:
        conn = self._live()
        with self._within(conn):
            if sql == "BEGIN IMMEDIATE":
                conn.execute("BEGIN")
                return conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            if parameters:
                return conn.execute(translate_sql(sql), _params(parameters))
            return conn.execute(translate_sql(sql, False))

    def executemany(
        self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /
    ) -> psycopg.Cursor[PgRow]:
        rows = [_params(p) for p in seq_of_parameters]
        conn = self._live()
        cur = conn.cursor()
        if rows:
            with self._within(conn):
                cur.executemany(translate_sql(sql), rows)
        return cur

    @contextlib.contextmanager
    def _within(self, conn: psycopg.Connection[PgRow]) -> Iterator[None]:
        """The driver's connection errors become :class:`MetadataUnavailable`. A statement
        that ran out of its deadline leaves its connection mid-query: it is closed (the next
        statement opens another), and the server counts as unreachable, so the next statements
        are refused at once until the change watcher reads from it again (it sets
        :attr:`reachable` back)."""
        try:
            yield
        except psycopg.errors._WaitTimeout:  # psycopg's own (private) type for its wait timeout
            conn.close()
            self.reachable = False
            raise MetadataUnavailable(
                "the metadata database is unreachable (it did not answer within "
                f"{self.statement_deadline_s:g} s)"
            ) from None
        except psycopg.OperationalError as exc:
            raise MetadataUnavailable(_reason(exc)) from None

    def close(self) -> None:
        self._conn.close()

    def _live(self) -> psycopg.Connection[PgRow]:
        """The connection, reopened when the previous one broke (never inside a transaction:
        a broken transaction is lost and its statements must fail). Refused at once while the
        change watcher finds the server not answering (:attr:`reachable`)."""
        if not self.reachable:
            raise MetadataUnavailable(
                "the metadata database is unreachable (it does not answer the change watcher)"
            )
        if self._conn.broken or self._conn.closed:
            try:
                self._conn = _open(self.url, self.statement_deadline_s)
            except psycopg.OperationalError as exc:
                raise MetadataUnavailable(_reason(exc)) from None
        return self._conn


def _open(url: str, statement_deadline_s: float | None = None) -> _BoundedConnection:
    conn = _BoundedConnection.connect(
        url, autocommit=True, row_factory=_row_factory, connect_timeout=CONNECT_TIMEOUT_S
    )
    conn.statement_deadline_s = statement_deadline_s
    return conn


def _reason(exc: psycopg.OperationalError) -> str:
    """The first line of the driver's message (no URL, no password: libpq never echoes it)."""
    first = str(exc).strip().splitlines()
    return f"the metadata database is unreachable ({first[0] if first else type(exc).__name__})"


def migrate_postgres(db: PgDatabase) -> int:
    """Apply the missing migrations, each in its own transaction, under a session advisory lock
    (two replicas starting at once: the second waits, then finds nothing left to do)."""
    db.execute("SELECT pg_advisory_lock(?)", (MIGRATE_LOCK,))
    try:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        current = int(row[0] or 0) if row is not None else 0
        for version, migration in enumerate(MIGRATIONS, start=1):
            if version <= current:
                continue
            db.execute("BEGIN")
            try:
                for stmt in statements(migration, "postgres"):
                    db.execute(translate_ddl(stmt))
                db.execute("INSERT INTO schema_version(version) VALUES (?)", (version,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            current = version
        return current
    finally:
        db.execute("SELECT pg_advisory_unlock(?)", (MIGRATE_LOCK,))
