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


def dominant_resource_fair(
    capacities: Sequence[float],
    weights: Sequence[float],
    costs: Sequence[Sequence[float]],
    demands: Sequence[float],
) -> list[float]:
    """Weighted dominant-resource-fair allocation, in requests per key (issue 18's ideal).

    ``capacities`` per dimension; per key a weight, the cost of one of its requests in each
    dimension (``costs[i][d]``) and how many requests it asks (``demands``, already bounded by
    any cap). Progressive filling, exactly (fractions): raise a level ``t``; each key holds
    ``t × weight / dominant`` requests, where ``dominant = max_d cost[d] / capacity[d]`` is the
    share of its most-used dimension one request takes, so every key's weighted dominant share
    rises together; a key stops when its demand is met or when any dimension it uses is full.
    Keys of weight 0 share what is left, max-min among themselves (as :func:`max_min_fair`).

    With one dimension it is :func:`max_min_fair` in that dimension's unit (each key's
    dominant share is its share of the one capacity). Worked example: 100 requests and 100,000
    tokens; a chat key A (500 tokens a request) and a research key B (10,000), equal weights,
    both asking more than the pool. A's dominant share per request is 1/100 (requests), B's
    1/10 (tokens): at level ``t`` A holds ``100 t`` requests and B ``10 t``. Tokens fill first,
    at ``t = 2/3`` (A 33,333 + B 66,667 tokens), so A gets 66.7 requests and B 6.67: each
    holds two thirds of its dominant dimension, and 26.7 requests stay unused because no key
    can use them without tokens.
    """
    exact = exact_dominant_resource_fair(
        [Fraction(max(0.0, c)) for c in capacities],
        weights,
        [[Fraction(max(0.0, c)) for c in row] for row in costs],
        [Fraction(max(0.0, d)) for d in demands],
    )
    return [float(a) for a in exact]


def exact_dominant_resource_fair(
    caps: Sequence[Fraction],
    weights: Sequence[float],
    cost: Sequence[Sequence[Fraction]],
    want: Sequence[Fraction],
) -> list[Fraction]:
    """:func:`dominant_resource_fair` in and out in fractions (non-negative inputs), for
    callers that multiply the allocation back out per dimension without rounding."""
    n = len(weights)
    if len(want) != n or len(cost) != n:
        raise ValueError("weights, costs and demands must have the same length")
    if any(len(row) != len(caps) for row in cost):
        raise ValueError("every key needs one cost per dimension")
    alloc = [Fraction(0)] * n
    weighted = {i: Fraction(weights[i]) for i in range(n) if weights[i] > 0}
    _progressive_fill(caps, cost, weighted, want, alloc)
    unweighted = {i: Fraction(1) for i in range(n) if weights[i] <= 0}
    if unweighted:
        _progressive_fill(caps, cost, unweighted, want, alloc)
    return alloc


def _progressive_fill(
    caps: Sequence[Fraction],
    cost: Sequence[Sequence[Fraction]],
    weights: dict[int, Fraction],
    want: Sequence[Fraction],
    alloc: list[Fraction],
) -> None:
    """Fill ``weights``' members into ``alloc`` from what ``alloc`` leaves of ``caps``."""
    dims = range(len(caps))
    used = [sum((alloc[i] * cost[i][d] for i in range(len(alloc))), Fraction(0)) for d in dims]
    full = {d for d in dims if used[d] >= caps[d]}
    rate: dict[int, Fraction] = {}
    for i, w in weights.items():
        if want[i] <= alloc[i]:
            continue
        if any(cost[i][d] > 0 and d in full for d in dims):
            continue
        dom = max((cost[i][d] / caps[d] for d in dims if caps[d] > 0), default=Fraction(0))
        if all(c == 0 for c in cost[i]):  # costs nothing anywhere: it gets what it asks
            alloc[i] = want[i]
            continue
        if dom == 0:  # uses only dimensions of capacity 0 (full from the start)
            continue
        rate[i] = w / dom
    base = {i: alloc[i] for i in rate}
    t = Fraction(0)
    while rate:
        events = [(want[i] - base[i]) / r for i, r in rate.items()]
        for d in dims:
            r_d = sum((r * cost[i][d] for i, r in rate.items()), Fraction(0))
            if r_d > 0:
                events.append(t + (caps[d] - used[d]) / r_d)
        step = min(events)
        for i, r in rate.items():
            delta = r * (step - t)
            for d in dims:
                used[d] += delta * cost[i][d]
            alloc[i] = base[i] + r * step
        t = step
        saturated = {d for d in dims if used[d] >= caps[d]}
        for i in list(rate):
            if alloc[i] >= want[i] or any(cost[i][d] > 0 for d in saturated):
                del rate[i]
