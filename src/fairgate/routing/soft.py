"""The soft quota penalty (SPEC §4), implemented once for every strategy.

A client key over its fair share on a ``soft`` allocation is not blocked: the targets whose pool
says "soft" are deprioritised for that key's requests. Strategies come in two shapes, and the
penalty has one form for each:

- **Scored** strategies (auto, weighted, random, p2c, least-used, cost-optimized, headroom,
  reset-aware) compute a number per target. The penalty multiplies a higher-is-better score by
  ``factor`` (0.7 by default, ``QUOTA_SOFT_DEPRIORITIZE_FACTOR``) — or divides a
  lower-is-better cost by it — so a penalised target loses to an equal one but can still beat a
  clearly worse one. Exact ties (for instance two scores of 0) are broken by the flag itself:
  the unpenalised target goes first. :func:`sort_by_score` and :func:`sort_by_cost` do both.
- **Rank-only** strategies (priority, round-robin, lkgp, cache-optimized, the context and fill
  strategies, strict-random, fusion) have no number to scale: a position is all they produce.
  The penalty is then a *stable partition*: penalised targets keep their relative order behind
  the unpenalised ones. Where a strategy has hard feasibility classes (fits the context window
  or not; has quota room or not), the partition happens inside each class, so a penalty never
  puts a target that cannot serve the request ahead of one that can. :func:`soft_partition`.

Pipeline is the one exception: its order *is* the program (step 1 feeds step 2), so it is never
reordered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = [
    "SOFT_FACTOR",
    "soft_cost",
    "soft_partition",
    "soft_score",
    "sort_by_cost",
    "sort_by_score",
]

T = TypeVar("T")

#: Default ``QUOTA_SOFT_DEPRIORITIZE_FACTOR``.
SOFT_FACTOR = 0.7


def soft_score(score: float, penalized: bool, factor: float = SOFT_FACTOR) -> float:
    """A higher-is-better score, multiplied by ``factor`` when the target is penalised."""
    return score * factor if penalized else score


def soft_cost(cost: float, penalized: bool, factor: float = SOFT_FACTOR) -> float:
    """A lower-is-better cost, divided by ``factor`` when penalised (the mirror of
    :func:`soft_score`: a penalised target looks 1/0.7 ≈ 1.43× as expensive)."""
    if not penalized or math.isinf(cost):
        return cost
    return cost / factor if factor > 0 else math.inf


def soft_partition(
    items: Iterable[T],
    penalized: Callable[[T], bool],
    *,
    group: Callable[[T], int] | None = None,
) -> list[T]:
    """Stable partition: within each ``group`` (ascending; one group when None), unpenalised
    items first, each part keeping its input order."""
    indexed = list(enumerate(items))
    indexed.sort(key=lambda p: (group(p[1]) if group else 0, penalized(p[1]), p[0]))
    return [item for _, item in indexed]


def sort_by_score(
    items: Sequence[T],
    scores: Sequence[float],
    penalized: Callable[[T], bool],
    factor: float = SOFT_FACTOR,
    *,
    group: Callable[[T], int] | None = None,
) -> list[T]:
    """Highest soft score first; exact ties → unpenalised first → input order."""
    keyed = [
        (group(item) if group else 0, -soft_score(s, pen, factor), pen, i, item)
        for i, (item, s) in enumerate(zip(items, scores, strict=True))
        for pen in (penalized(item),)
    ]
    keyed.sort(key=lambda k: k[:4])
    return [k[4] for k in keyed]


def sort_by_cost(
    items: Sequence[T],
    costs: Sequence[float],
    penalized: Callable[[T], bool],
    factor: float = SOFT_FACTOR,
) -> list[T]:
    """Lowest soft cost first (``inf`` = unknown, last); exact ties → unpenalised first →
    input order."""
    keyed = [
        (soft_cost(c, pen, factor), pen, i, item)
        for i, (item, c) in enumerate(zip(items, costs, strict=True))
        for pen in (penalized(item),)
    ]
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]
