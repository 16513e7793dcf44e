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

import heapq
from collections.abc import Mapping, Sequence
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
    rows = [{d: c for d, c in enumerate(row) if c != 0} for row in cost]
    dominant = [
        max((row[d] / caps[d] for d in range(len(caps)) if caps[d] > 0), default=Fraction(0))
        for row in cost
    ]
    return exact_progressive_filling(caps, weights, rows, want, dominant)


def exact_progressive_filling(
    caps: Sequence[Fraction],
    weights: Sequence[float],
    rows: Sequence[Mapping[int, Fraction]],
    want: Sequence[Fraction],
    dominant: Sequence[Fraction],
) -> list[Fraction]:
    """Weighted progressive filling over sparse constraints, exactly (fractions).

    The general form of :func:`exact_dominant_resource_fair`, for the ideal across windows
    (:func:`fairgate.sim.fairness.dominant_window_figures`): a *claimant* ``i`` (there: one key
    in one window) asks ``want[i]`` units, each taking ``rows[i][c]`` of constraint ``c``
    (capacity ``caps[c]``: a dimension in one window, a longer dimension over all the windows
    of one of its buckets, a key's cap over a bucket); ``dominant[i]`` is one unit's dominant
    share. Raise a level ``t``: every claimant holds ``t × weight / dominant`` units; one stops
    when its demand is met or any constraint it uses is full. Weight-0 claimants share what is
    left afterwards, max-min among themselves. Non-negative inputs, zero costs left out of
    ``rows``.

    Events are kept in a heap (a claimant's demand, a constraint's saturation, re-timed when a
    claimant using it stops), so the cost is O((claimants × constraints per claimant +
    constraints) × log) rather than a pass over every claimant at every event.
    """
    n = len(weights)
    if len(want) != n or len(rows) != n or len(dominant) != n:
        raise ValueError("weights, rows, demands and dominant shares must have the same length")
    alloc = [Fraction(0)] * n
    used = [Fraction(0)] * len(caps)
    weighted = {i: Fraction(weights[i]) for i in range(n) if weights[i] > 0}
    _heap_fill(caps, rows, dominant, weighted, want, alloc, used)
    unweighted = {i: Fraction(1) for i in range(n) if weights[i] <= 0}
    if unweighted:
        _heap_fill(caps, rows, dominant, unweighted, want, alloc, used)
    return alloc


def _heap_fill(
    caps: Sequence[Fraction],
    rows: Sequence[Mapping[int, Fraction]],
    dominant: Sequence[Fraction],
    weights: Mapping[int, Fraction],
    want: Sequence[Fraction],
    alloc: list[Fraction],
    used: list[Fraction],
) -> None:
    """One phase of :func:`exact_progressive_filling`: fill ``weights``' members into
    ``alloc`` from what ``used`` leaves of ``caps`` (both updated)."""
    rate: dict[int, Fraction] = {}
    for i, w in weights.items():
        if want[i] <= alloc[i] or any(used[c] >= caps[c] for c in rows[i]):
            continue
        if not rows[i]:  # costs nothing anywhere: it gets what it asks
            alloc[i] = want[i]
            continue
        if dominant[i] > 0:
            rate[i] = w / dominant[i]
    users: dict[int, list[int]] = {}
    c_rate: dict[int, Fraction] = {}
    for i, r in rate.items():
        for c, cost in rows[i].items():
            users.setdefault(c, []).append(i)
            c_rate[c] = c_rate.get(c, Fraction(0)) + r * cost
    since = dict.fromkeys(c_rate, Fraction(0))  # the level ``used[c]`` was last brought to
    version = dict.fromkeys(c_rate, 0)
    base = {i: alloc[i] for i in rate}
    # (level, kind, index, version): kind 0 a claimant's demand, 1 a constraint's saturation
    heap: list[tuple[Fraction, int, int, int]] = [
        (t, 0, i, 0) for i, r in rate.items() if (t := (want[i] - base[i]) / r) >= 0
    ]
    heap += [(s, 1, c, 0) for c, cr in c_rate.items() if (s := (caps[c] - used[c]) / cr) >= 0]
    heapq.heapify(heap)
    while heap and rate:
        level = heap[0][0]
        met: set[int] = set()
        while heap and heap[0][0] == level:
            _, kind, idx, ver = heapq.heappop(heap)
            if kind == 0 and idx in rate:
                met.add(idx)
            elif kind == 1 and ver == version[idx]:
                met.update(i for i in users[idx] if i in rate)
        for i in met:
            r = rate.pop(i)
            alloc[i] = base[i] + r * level
            for c, cost in rows[i].items():
                used[c] += c_rate[c] * (level - since[c])
                since[c] = level
                c_rate[c] -= r * cost
                version[c] += 1
                if c_rate[c] > 0:
                    heapq.heappush(
                        heap, (level + (caps[c] - used[c]) / c_rate[c], 1, c, version[c])
                    )
