"""The ideal a sharing policy is measured against: weighted max-min fairness, computed exactly.

Given a capacity and, per key, a weight and a demand (already bounded by any cap), the weighted
max-min fair allocation is the unique one where no key can get more without taking from a key
that has no more per unit of weight. Water-filling finds it: raise a level λ; each key gets
``min(demand, λ × weight)``; stop when the capacity is used or every demand is met.

Worked example: capacity 600, weights 40/30/20/10, demands 400/100/200/30. At the level where
every key gets its weighted share (λ = 6: 240/180/120/60) the keys with weight 30 and 10 want
less (100 and 30), so they are satisfied and their surplus (80 + 30) is shared by the other two
in proportion to weight: λ = (600 − 130) / 60 = 7.83, giving 313.3 and 156.7. Both want more
than that, so the allocation is 313.3/100/156.7/30 and the capacity is fully used.

Arithmetic is in :class:`fractions.Fraction`, so the allocation is exact (floats in, floats
out, nothing lost in between); the keys are few, the cost is nothing. Keys of weight 0 get only
what the weighted keys leave, shared max-min among themselves (the engine lets such keys borrow
but gives them no share).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def max_min_fair(
    capacity: float, weights: Sequence[float], demands: Sequence[float]
) -> list[float]:
    """Allocation per key (same order as the inputs). Negative demands count as 0."""
    if len(weights) != len(demands):
        raise ValueError("weights and demands must have the same length")
    cap = Fraction(max(0.0, capacity))
    want = [Fraction(max(0.0, d)) for d in demands]
    alloc = [Fraction(0)] * len(want)
    weighted = [i for i, w in enumerate(weights) if w > 0]
    left = _fill(cap, {i: Fraction(weights[i]) for i in weighted}, want, alloc)
    unweighted = [i for i, w in enumerate(weights) if w <= 0]
    if unweighted and left > 0:
        _fill(left, {i: Fraction(1) for i in unweighted}, want, alloc)
    return [float(a) for a in alloc]


def _fill(
    capacity: Fraction, weights: dict[int, Fraction], want: list[Fraction], alloc: list[Fraction]
) -> Fraction:
    """Water-fill ``capacity`` over ``weights``' members into ``alloc``; returns what is left."""
    live = {i: w for i, w in weights.items() if want[i] > 0}
    remaining = capacity
    while live:
        level = remaining / sum(live.values())
        satisfied = [i for i, w in live.items() if want[i] <= level * w]
        if not satisfied:
            for i, w in live.items():
                alloc[i] = level * w
            return Fraction(0)
        for i in satisfied:
            alloc[i] = want[i]
            remaining -= want[i]
            del live[i]
    return remaining


def water_level(capacity: float, weights: Sequence[float], demands: Sequence[float]) -> float:
    """The level λ of the allocation (inf when every demand is met)."""
    alloc = max_min_fair(capacity, weights, demands)
    levels = [a / w for a, w, d in zip(alloc, weights, demands, strict=True) if w > 0 and a < d]
    return min(levels) if levels else float("inf")
