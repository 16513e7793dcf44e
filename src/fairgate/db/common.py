"""What every repository shares: its errors, the transaction helper and JSON columns.

Repositories raise :class:`NotFound`, :class:`Conflict` or :class:`Invalid` instead of leaking
``sqlite3`` errors, so the admin API can map them to 404 / 409 / 422 without knowing SQL, and a
rejected write never leaves half a change behind (:func:`transaction` rolls back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import count
from typing import Any, TypeVar

import orjson

from fairgate.db.base import Database
from fairgate.domain.units import Unit, Window, WindowAnchor
from fairgate.quota.model import Dimension, ModelCap


class RepoError(Exception):
    """Base of the repository errors; the message is safe to show (no secrets, no SQL)."""


class MetadataUnavailable(Exception):
    """The metadata DB cannot be reached (PostgreSQL down or unreachable). Not a
    :class:`RepoError`: the request was fine, so the admin API answers 503, and the replicas
    keep serving from their last registry snapshot. The message names no host or secret."""


class NotFound(RepoError):
    pass


class Conflict(RepoError):
    pass


class Invalid(RepoError):
    """A write refers to something that does not exist or breaks a cross-row rule.

    ``problems`` are ``(field path, message)`` pairs, the field relative to the written object.
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in self.problems))


T = TypeVar("T")

_savepoints = count()


@contextmanager
def transaction(conn: Database) -> Iterator[Database]:
    """One write transaction (``BEGIN IMMEDIATE``: the write lock is taken before reading, so a
    check-then-write cannot race another process). Nested use becomes a savepoint, so a repository
    method can be called alone or inside a larger unit (seeding, import) with the same code."""
    if conn.in_transaction:
        name = f"sp{next(_savepoints)}"
        conn.execute(f"SAVEPOINT {name}")
        try:
            yield conn
        except BaseException:
            conn.execute(f"ROLLBACK TO {name}")
            conn.execute(f"RELEASE {name}")
            raise
        conn.execute(f"RELEASE {name}")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def found(value: T | None, what: str) -> T:
    """``value``, or :class:`NotFound` naming ``what`` (``key 'k1'``) when the lookup found
    nothing: the one message every repository's ``get`` gives."""
    if value is None:
        raise NotFound(f"{what} not found")
    return value


def upsert(
    conn: Database,
    find: Callable[[], object | None],
    wanted: Callable[[], object],
    create: Callable[[], object],
    update: Callable[[], object],
) -> str:
    """``created``, ``updated`` or ``unchanged`` (nothing written), in one transaction: what
    every repository's ``upsert`` does (seeding and import are idempotent). ``find`` reads the
    stored form (None: absent) and ``wanted`` the form it must equal to count as unchanged;
    ``wanted`` runs only when there is a stored one (a pool's checks read the DB)."""
    with transaction(conn):
        old = find()
        if old is None:
            create()
            return "created"
        if old == wanted():
            return "unchanged"
        update()
        return "updated"


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode("utf-8")


def loads_list(raw: object) -> list[Any]:
    if not raw:
        return []
    value = orjson.loads(str(raw))
    return value if isinstance(value, list) else []


def dims_to_json(dims: Sequence[Dimension]) -> str:
    """``windowAnchor`` only when it is not the default, so rows written before it read the
    same."""
    return dumps([_dim_json(d) for d in dims])


def _dim_json(d: Dimension) -> dict[str, object]:
    out: dict[str, object] = {"unit": d.unit.value, "window": d.window.value, "limit": d.limit}
    if d.anchor is not WindowAnchor.PROVIDER:
        out["windowAnchor"] = d.anchor.value
    return out


def dims_from_json(raw: object) -> tuple[Dimension, ...]:
    return tuple(
        Dimension(
            Unit(d["unit"]),
            Window(d["window"]),
            float(d["limit"]),
            WindowAnchor(d.get("windowAnchor", WindowAnchor.PROVIDER.value)),
        )
        for d in loads_list(raw)
    )


def caps_to_json(caps: Sequence[ModelCap]) -> str:
    return dumps([{"model": c.model, "unit": c.unit.value, "limit": c.limit} for c in caps])


def caps_from_json(raw: object) -> tuple[ModelCap, ...]:
    return tuple(
        ModelCap(str(c["model"]), Unit(c["unit"]), float(c["limit"])) for c in loads_list(raw)
    )


def strings_from_json(raw: object) -> tuple[str, ...]:
    return tuple(str(s) for s in loads_list(raw))
