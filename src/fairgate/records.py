"""Immutable records that are cheap to build: the plain data a governed request makes a dozen of.

``@record`` is ``@dataclass(frozen=True, slots=True)`` for the type checker (``mypy --strict``
refuses any assignment to a field, as for a frozen dataclass: ``typing.dataclass_transform``
with ``frozen_default``), and at run time a slots dataclass whose ``__init__`` assigns its fields
plainly. Equality and hashing are the frozen dataclass's (by fields; ``eq=False``: by identity).

Why not ``frozen=True`` at run time: a frozen dataclass's ``__init__`` sets each field through
``object.__setattr__`` (a global lookup and a call per field), and an admission and its settle
build fifteen such records (checks, counts, the verdict, the store's request and result, usage
items, the standing, the ticket, the admission): together a large share of an admit+settle on the
SQLite store (issue 15; the figures: docs/performance.md, "Figures behind the code").
What run time loses is the ``FrozenInstanceError`` on an assignment, which the type checker
already refuses in ``src`` (and nothing in the code assigns to a record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["camel", "camel_json", "record"]

T = TypeVar("T")


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, eq: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, eq_default=True)
def record(
    cls: type[T] | None = None, /, *, eq: bool = True
) -> type[T] | Callable[[type[T]], type[T]]:
    """``@record`` or ``@record(eq=False)`` on a class of annotated fields (see the module
    docstring); ``eq=False`` compares and hashes by identity."""

    def wrap(c: type[T]) -> type[T]:
        return dataclass(slots=True, eq=eq, unsafe_hash=eq)(c)

    return wrap if cls is None else wrap(cls)


def camel(name: str) -> str:
    """``expires_at_ms`` → ``expiresAtMs``: a field's name as the JSON APIs spell it."""
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def camel_json(rec: Any) -> dict[str, object]:
    """A flat dataclass record as a JSON object: every field, in order, under its camelCase
    name. For the records the health and admin APIs show as they are (a record with a nested
    or renamed part writes its own ``as_json``)."""
    return {camel(f.name): getattr(rec, f.name) for f in fields(rec)}
