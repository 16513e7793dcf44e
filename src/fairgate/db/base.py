"""The metadata DB connection as the repositories see it, whichever engine holds it.

Why an interface this thin: the repositories speak a portable subset of SQL with ``?``
placeholders through ``execute``/``executemany`` and :func:`fairgate.db.common.transaction`.
SQLite's own connection already has this shape, so the embedded default pays nothing; the
PostgreSQL adapter (:mod:`fairgate.db.postgres`) translates the few dialect differences in one
place. Everything above (repositories, seeding, the registry loader, the admin API) is the same
code on both engines, and the contract tests run it on both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class Cursor(Protocol):
    """What the repositories read from a statement: rows indexable by position and by name."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Database(Protocol):
    """A metadata DB connection: ``sqlite3.Connection`` or ``fairgate.db.postgres.PgDatabase``.

    ``in_transaction`` lets :func:`~fairgate.db.common.transaction` nest as savepoints.
    """

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> Cursor: ...

    def close(self) -> None: ...


#: A result row: ``row[0]``, ``row["name"]`` and unpacking work (``sqlite3.Row``, ``PgRow``).
Row = Any
