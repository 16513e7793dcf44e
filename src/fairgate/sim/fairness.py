"""Fairness and efficiency figures of one policy's run, against the exact ideal (pure).

Measured window by window (the primary dimension's own buckets, aligned to the epoch like the
counters) on every pool dimension of that window or a longer one: in each window the ideal is
the weighted dominant-resource-fair allocation of the window's capacities over what each key
asked in it (bounded by its cap), see :mod:`fairgate.sim.ideal`; a key's requests cost, per
dimension, what it asked there per request it asked. With one dimension, or several where one
binds, that is the weighted max-min fair allocation of that dimension (exactly: rational
arithmetic). A pool dimension of a longer window (a weekly budget beside 5-hour windows) is
measured too: its budget is shared over the windows of each of its buckets by one filling across
them (:func:`_across_windows`; docs/fairness.md, "Budgets of different windows"). Per-window
ideals follow demand that changes over time (a key that arrives late is owed nothing before it
arrives); summed over the run they give each key's ideal.

- **Jain's index** ``(Σx)² / (n Σx²)`` over the keys that had demand (the backlogged ones: a key
  that asked nothing is owed nothing and has no ratio), with ``x = admitted / ideal`` in the
  key's dominant dimension of each window (as shares of its capacity when that changes), summed
  over the run. 1 means every key got the same fraction of what it was owed; one key getting
  everything out of n gives 1/n. The worst single window is reported too.
- **Utilisation**: admitted ÷ what the ideal hands out (the most that demand allowed: per window
  ``min(capacity, Σ capped demand)`` with one dimension) in each window's bottleneck dimension
  (the one the ideal fills most), summed over the run; and the same per dimension. A
  work-conserving policy reaches 1; one that refuses requests while the pool has room does not.
- **Overshoot**: how far the pool's sliding-window count went above its limit, per dimension,
  as a fraction of the limit (0 is the promise).
- **Blocked**: refusals per key; **time to first block** of each well-behaved key (one whose
  demand never exceeded its weighted share in any window), None when it was never refused;
  and how long admitted requests waited (refused, then retried), 95th percentile per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from fairgate.sim.ideal import (
    exact_dominant_resource_fair,
    exact_progressive_filling,
    max_min_fair,
)


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index; 1.0 for an empty or all-zero input (nothing to be unfair about)."""
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    if sq <= 0:
        return 1.0
    return s * s / (len(xs) * sq)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One window: what each key asked, its ideal and what it got, per measured dimension.

    ``capacity``/``demand``/``ideal``/``admitted`` are the primary dimension's (the first of
    the pool); the ``*_by_dim`` tables hold every measured dimension (the primary's included)
    by name, and ``dominant`` names each key's dominant dimension in the window (the one a
    request of its takes the largest share of, by what it asked): its ratio is measured there.
    """

    index: int
    capacity: float
    demand: dict[str, float]
    ideal: dict[str, float]
    admitted: dict[str, float]
    capacities: dict[str, float] = field(default_factory=dict)
    demand_by_dim: dict[str, dict[str, float]] = field(default_factory=dict)
    ideal_by_dim: dict[str, dict[str, float]] = field(default_factory=dict)
    admitted_by_dim: dict[str, dict[str, float]] = field(default_factory=dict)
    dominant: dict[str, str] = field(default_factory=dict)

    @property
    def bottleneck(self) -> str:
        """The dimension the ideal fills most (as a share of its capacity); first on ties."""
        best, most = next(iter(self.capacities)), -1.0
        for d, cap in self.capacities.items():
            used = sum(self.ideal_by_dim[d].values()) / cap if cap > 0 else 0.0
            if used > most:
                best, most = d, used
        return best

    @property
    def allowed(self) -> float:
        """The most demand allowed in this window (what the ideal hands out), in the
        bottleneck dimension."""
        return sum(self.ideal_by_dim[self.bottleneck].values())

    def ratio_parts(self, key: str) -> tuple[str, float, float] | None:
        """(dominant dimension, admitted, ideal) of a key owed something, else None."""
        d = self.dominant.get(key)
        if d is None:
            return None
        ideal = self.ideal_by_dim[d].get(key, 0.0)
        if ideal <= 0:
            return None
        return d, self.admitted_by_dim[d].get(key, 0.0), ideal

    def jain(self) -> float | None:
        """Jain's index of this window alone, None when fewer than two keys had demand."""
        xs = [p[1] / p[2] for k in self.ideal if (p := self.ratio_parts(k)) is not None]
        return jain(xs) if len(xs) >= 2 else None


def window_figures(
    capacity: float,
    weights: Mapping[str, float],
    caps: Mapping[str, float | None],
    demand: Sequence[Mapping[str, float]],
    admitted: Sequence[Mapping[str, float]],
) -> list[WindowFigures]:
    """One dimension: the weighted max-min ideal of every window, beside what was asked and
    admitted in it (:func:`dominant_window_figures` with that dimension alone)."""
    keys = list(weights)
    out: list[WindowFigures] = []
    for i, (want, got) in enumerate(zip(demand, admitted, strict=True)):
        bounded = [_bounded(want.get(k, 0.0), caps.get(k)) for k in keys]
        ideal = dict(
            zip(keys, max_min_fair(capacity, [weights[k] for k in keys], bounded), strict=True)
        )
        asked = {k: want.get(k, 0.0) for k in keys}
        took = {k: got.get(k, 0.0) for k in keys}
        out.append(
            WindowFigures(
                index=i,
                capacity=capacity,
                demand=asked,
                ideal=ideal,
                admitted=took,
                capacities={"": capacity},
                demand_by_dim={"": asked},
                ideal_by_dim={"": ideal},
                admitted_by_dim={"": took},
                dominant={k: "" for k in keys if asked[k] > 0},
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class LongerWindow:
    """A measured dimension whose window is longer than the measurement windows (a weekly
    budget beside 5-hour ones): its budget spans the windows of each of its buckets."""

    #: the dimension's bucket of each measurement window (the one the window starts in)
    buckets: Sequence[int]
    #: a measurement window's length over the dimension's window (5 h / 168 h): the share of
    #: the budget one window sustains, which a key's dominant share is measured against
    per_window: Fraction
    #: how much of a whole measurement window each one covers (1, but the run's last window
    #: when the run ends inside it): a window sustains its length's share of the budget, so
    #: a run's last 3 hours of a 5-hour window are owed 3/5 of a whole window's part of the week
    covers: Sequence[Fraction] = ()


@dataclass(frozen=True, slots=True)
class CapTimes:
    """When each capped key asked, so that the ideal holds its cap the way the engine counts
    it (:func:`sliding_cap_room`): per key and measurement window, ``(ms from the window's
    start, size in the cap's unit)`` of every request it asked there, and how long the key
    waits for a slot (``patience_ms``)."""

    window_ms: int
    asked: Mapping[str, Sequence[Sequence[tuple[int, float]]]]
    patience_ms: Mapping[str, int]


def sliding_cap_room(
    asked: Sequence[tuple[int, float]],
    prev: float,
    cap: float,
    patience_ms: int,
    window_ms: int,
) -> float:
    """The most of one window's requests a key can get under its cap, counted as the engine
    counts it (SPEC §2-3: refused once ``prev × (1 − elapsed/W) + curr`` reaches the cap,
    ``prev`` its use of the previous window): each request no earlier than it was asked, no
    later than its patience allows or the window ends, in the order asked and each as early
    as the cap allows (with the cap the only constraint, that serves the most: the count
    only rises at an admission).

    Why: a cap of 30 requests an hour is 30 in any sliding hour, not 30 per calendar hour. A
    key that used 12 in the last minutes of one hour can take only ``30 − 12 × (1 −
    elapsed/W)`` early in the next, so one whose on-phase ends 28 minutes into it gets about
    24, not 28. Bounding each calendar window at the cap owed a capped key up to twice its cap
    within an hour across a boundary, which no policy that keeps the cap can give.
    """
    curr = 0.0
    for at, size in sorted(asked):
        if curr >= cap:
            break
        earliest = 0.0
        if prev > 0 and prev + curr >= cap:
            earliest = window_ms * (1.0 - (cap - curr) / prev)
        if max(at, earliest) <= min(at + patience_ms, window_ms):
            curr += size
    return curr


def dominant_window_figures(
    capacities: Mapping[str, float],
    weights: Mapping[str, float],
    caps: Mapping[str, Mapping[str, float]],
    demand: Sequence[Mapping[str, Mapping[str, float]]],
    admitted: Sequence[Mapping[str, Mapping[str, float]]],
    longer: Mapping[str, LongerWindow] | None = None,
    cap_times: CapTimes | None = None,
) -> list[WindowFigures]:
    """The weighted dominant-resource-fair ideal of every window
    (:func:`~fairgate.sim.ideal.dominant_resource_fair`), beside what was asked and admitted
    in it, per dimension.

    ``capacities`` by dimension name, the first the primary; ``demand[w][dim][key]`` and
    ``admitted[w][dim][key]`` in each dimension's unit; ``caps[key]`` a key's cap per
    dimension it applies to. A key's requests in a window cost, per dimension, what it asked
    there divided by what it asked in the primary one (its average request, e.g. 1 request
    and 3,400 tokens), so the ideal is in primary units and multiplied back out per
    dimension. With one dimension it is the max-min ideal of :func:`window_figures`, exactly
    (the arithmetic is rational); with several where only one binds, too.

    Dimensions named in ``longer`` (their capacity is the whole budget of one of their
    buckets) make the ideal one across windows: :func:`_across_windows`. Without them every
    window is filled on its own, as before, to the last bit.

    ``cap_times``: a capped key's cap in a dimension of the measurement window bounds it at
    what the cap lets it take of what it asked, given when it asked and what the ideal gave
    it in the previous window (:func:`sliding_cap_room`), instead of at the cap itself; the
    windows are then filled in order. (Across windows, with a longer dimension, the cap
    still bounds each window at the cap.)
    """
    dims = list(capacities)
    primary = dims[0]
    keys = list(weights)
    longer = longer or {}
    per_window_w = [
        {
            d: Fraction(capacities[d])
            * (longer[d].per_window * _covers(longer[d], w) if d in longer else 1)
            for d in dims
        }
        for w in range(len(demand))
    ]
    asked_w: list[dict[str, dict[str, float]]] = []
    took_w: list[dict[str, dict[str, float]]] = []
    costs_w: list[list[list[Fraction]]] = []
    bounds_w: list[list[Fraction]] = []
    for want, got in zip(demand, admitted, strict=True):
        asked = {d: {k: want.get(d, {}).get(k, 0.0) for k in keys} for d in dims}
        asked_w.append(asked)
        took_w.append({d: {k: got.get(d, {}).get(k, 0.0) for k in keys} for d in dims})
        costs: list[list[Fraction]] = []
        bounds: list[Fraction] = []
        for k in keys:
            n = Fraction(max(0.0, asked[primary][k]))
            row = [Fraction(max(0.0, asked[d][k])) / n if n > 0 else Fraction(0) for d in dims]
            costs.append(row)
            bound = n
            for d, cap in caps.get(k, {}).items():
                per = row[dims.index(d)] if d in capacities and d not in longer else 0
                if per > 0:
                    bound = min(bound, Fraction(max(0.0, cap)) / per)
            bounds.append(bound)
        costs_w.append(costs)
        bounds_w.append(bounds)
    if longer:
        allocs = _across_windows(capacities, weights, caps, costs_w, bounds_w, longer, per_window_w)
    else:
        allocs = []
        for w, (costs, bounds) in enumerate(zip(costs_w, bounds_w, strict=True)):
            held = bounds
            if cap_times is not None:
                held = _sliding_cap_bounds(w, dims, keys, caps, costs_w, allocs, bounds, cap_times)
            allocs.append(
                exact_dominant_resource_fair(
                    [Fraction(max(0.0, capacities[d])) for d in dims],
                    [weights[k] for k in keys],
                    costs,
                    held,
                )
            )
    out: list[WindowFigures] = []
    for i, (asked, took, costs, alloc) in enumerate(
        zip(asked_w, took_w, costs_w, allocs, strict=True)
    ):
        ideal = {
            d: {k: float(a * costs[j][x]) for j, (k, a) in enumerate(zip(keys, alloc, strict=True))}
            for x, d in enumerate(dims)
        }
        per_window = per_window_w[i]
        dominant = {}
        for j, k in enumerate(keys):
            if asked[primary][k] > 0:
                shares = [costs[j][x] / per_window[d] for x, d in enumerate(dims)]
                dominant[k] = dims[shares.index(max(shares))]
        out.append(
            WindowFigures(
                index=i,
                capacity=capacities[primary],
                demand=asked[primary],
                ideal=ideal[primary],
                admitted=took[primary],
                capacities={d: float(per_window[d]) for d in dims},
                demand_by_dim=asked,
                ideal_by_dim=ideal,
                admitted_by_dim=took,
                dominant=dominant,
            )
        )
    return out


def _covers(spec: LongerWindow, w: int) -> Fraction:
    return spec.covers[w] if w < len(spec.covers) else Fraction(1)


def _sliding_cap_bounds(
    w: int,
    dims: Sequence[str],
    keys: Sequence[str],
    caps: Mapping[str, Mapping[str, float]],
    costs_w: Sequence[Sequence[Sequence[Fraction]]],
    allocs: Sequence[Sequence[Fraction]],
    bounds: Sequence[Fraction],
    cap_times: CapTimes,
) -> list[Fraction]:
    """Window ``w``'s demand bounds with each capped key held to :func:`sliding_cap_room`
    (in primary units); its previous use is the ideal's own allocation of window ``w − 1``."""
    out = list(bounds)
    for j, k in enumerate(keys):
        asked = cap_times.asked.get(k)
        if asked is None or w >= len(asked):
            continue
        for d, cap in caps.get(k, {}).items():
            x = dims.index(d)
            per = costs_w[w][j][x]
            if per <= 0:
                continue
            prev = float(allocs[w - 1][j] * costs_w[w - 1][j][x]) if w > 0 else 0.0
            room = sliding_cap_room(
                asked[w], prev, cap, cap_times.patience_ms.get(k, 0), cap_times.window_ms
            )
            out[j] = min(out[j], Fraction(room) / per)
    return out


def _across_windows(
    capacities: Mapping[str, float],
    weights: Mapping[str, float],
    caps: Mapping[str, Mapping[str, float]],
    costs_w: Sequence[Sequence[Sequence[Fraction]]],
    bounds_w: Sequence[Sequence[Fraction]],
    longer: Mapping[str, LongerWindow],
    per_window_w: Sequence[Mapping[str, Fraction]],
) -> list[list[Fraction]]:
    """The ideal across windows: one progressive filling over every (key, window) pair of
    the run (:func:`~fairgate.sim.ideal.exact_progressive_filling`).

    A pair asks what the key asked in the window (bounded by its cap there); its requests
    take, per window, their cost of that window's own dimensions and, per longer dimension,
    of that dimension's budget over the bucket the window belongs to (and of the key's cap
    over that bucket, where it has one). A pair's dominant share is its largest cost over
    the window's capacity, a longer dimension's counted at the share of its budget one
    window sustains (``per_window``). Raising one level for every pair at once shares a
    weekly budget over the windows by the same rule that shares each window over the keys:
    no pair can get more without taking from one whose dominant share, per weight, is no
    larger. A window whose dimensions all share its window is independent of the others, so
    without longer dimensions this is every window filled on its own.
    """
    dims = list(capacities)
    keys = list(weights)
    short = [x for x, d in enumerate(dims) if d not in longer]
    constraint: dict[tuple[object, ...], int] = {}
    limits: list[Fraction] = []

    def index(name: tuple[object, ...], cap: float) -> int:
        if name not in constraint:
            constraint[name] = len(limits)
            limits.append(Fraction(max(0.0, cap)))
        return constraint[name]

    pairs: list[tuple[int, int]] = []
    rows: list[dict[int, Fraction]] = []
    dominant: list[Fraction] = []
    for w, (costs, bounds) in enumerate(zip(costs_w, bounds_w, strict=True)):
        for j, k in enumerate(keys):
            if bounds[j] <= 0:
                continue
            row: dict[int, Fraction] = {}
            for x in short:
                if costs[j][x] > 0:
                    row[index(("dim", dims[x], w), capacities[dims[x]])] = costs[j][x]
            for d, spec in longer.items():
                c = costs[j][dims.index(d)]
                if c <= 0:
                    continue
                b = spec.buckets[w]
                row[index(("dim", d, b), capacities[d])] = c
                if d in caps.get(k, {}):
                    row[index(("cap", k, d, b), caps[k][d])] = c
            pairs.append((w, j))
            rows.append(row)
            dominant.append(
                max(
                    (
                        costs[j][x] / per_window_w[w][d]
                        for x, d in enumerate(dims)
                        if per_window_w[w][d] > 0
                    ),
                    default=Fraction(0),
                )
            )
    alloc = exact_progressive_filling(
        limits,
        [weights[keys[j]] for _, j in pairs],
        rows,
        [bounds_w[w][j] for w, j in pairs],
        dominant,
    )
    out = [[Fraction(0)] * len(keys) for _ in costs_w]
    for (w, j), a in zip(pairs, alloc, strict=True):
        out[w][j] = a
    return out


def _bounded(demand: float, cap: float | None) -> float:
    return demand if cap is None else min(demand, cap)


@dataclass(frozen=True, slots=True)
class Metrics:
    jain: float
    jain_worst_window: float
    jain_window_mean: float
    utilisation: float
    overshoot: dict[str, float]
    blocked: dict[str, int]
    dropped: dict[str, int]
    admitted: dict[str, float]
    ideal: dict[str, float]
    demand: dict[str, float]
    ratio: dict[str, float]
    well_behaved: list[str]
    first_block_ms: dict[str, int | None] = field(default_factory=dict)
    #: admitted ÷ what the ideal hands out, per measured dimension (``utilisation`` is that
    #: of each window's bottleneck dimension)
    utilisation_by_dim: dict[str, float] = field(default_factory=dict)
    #: 95th percentile of the time admitted requests waited (refused, retried), per key
    wait_p95_ms: dict[str, int] = field(default_factory=dict)
    #: per key, how far from 1 its ratio may be by one request in each window it asked in
    #: (the small-key allowance of issue 45's gate): ``Σ one request ÷ Σ ideal``, in the
    #: primary dimension over the windows it asked in; empty when the counts were not given
    slack: dict[str, float] = field(default_factory=dict)

    @property
    def blocked_total(self) -> int:
        return sum(self.blocked.values())

    @property
    def first_block_well_behaved_ms(self) -> int | None:
        """The earliest refusal of any well-behaved key (None: none was ever refused)."""
        times = [t for k in self.well_behaved if (t := self.first_block_ms.get(k)) is not None]
        return min(times) if times else None


def well_behaved_keys(windows: Sequence[WindowFigures], shares: Mapping[str, float]) -> list[str]:
    """Keys that asked something but never more than their weighted share in any window."""
    out = []
    for k, share in shares.items():
        asked = [w.demand.get(k, 0.0) for w in windows]
        if any(a > 0 for a in asked) and all(a <= share + 1e-9 for a in asked):
            out.append(k)
    return out


def summarize(
    windows: Sequence[WindowFigures],
    *,
    shares: Mapping[str, float],
    overshoot: Mapping[str, float],
    blocked: Mapping[str, int],
    dropped: Mapping[str, int],
    first_block_ms: Mapping[str, int | None],
    waits_ms: Mapping[str, Sequence[int]] | None = None,
    asked_n: Sequence[Mapping[str, int]] | None = None,
) -> Metrics:
    """The run's figures; ``asked_n[w][key]``: how many requests the key asked in window
    ``w`` (for the small-key allowance, :attr:`Metrics.slack`)."""
    keys = list(shares)
    admitted = {k: sum(w.admitted.get(k, 0.0) for w in windows) for k in keys}
    ideal = {k: sum(w.ideal.get(k, 0.0) for w in windows) for k in keys}
    demand = {k: sum(w.demand.get(k, 0.0) for w in windows) for k in keys}
    caps = windows[0].capacities if windows else {}
    ratio: dict[str, float] = {}
    for k in keys:
        parts = [p for w in windows if (p := w.ratio_parts(k)) is not None]
        if parts:
            ratio[k] = _share_ratio(parts, caps)
    per_window = [j for w in windows if (j := w.jain()) is not None]
    bottleneck = [
        (w.bottleneck, sum(w.admitted_by_dim[w.bottleneck].values()), w.allowed) for w in windows
    ]
    by_dim: dict[str, float] = {}
    for d in caps:
        got = sum(sum(w.admitted_by_dim[d].values()) for w in windows)
        owed = sum(sum(w.ideal_by_dim[d].values()) for w in windows)
        by_dim[d] = got / owed if owed > 0 else 1.0
    well = well_behaved_keys(windows, shares)
    slack: dict[str, float] = {}
    if asked_n is not None:
        for k in ratio:
            one = sum(
                w.demand.get(k, 0.0) / n[k]
                for w, n in zip(windows, asked_n, strict=True)
                if n.get(k, 0) > 0 and w.demand.get(k, 0.0) > 0
            )
            slack[k] = one / ideal[k] if ideal[k] > 0 else 0.0
    return Metrics(
        jain=jain(list(ratio.values())),
        jain_worst_window=min(per_window) if per_window else 1.0,
        jain_window_mean=sum(per_window) / len(per_window) if per_window else 1.0,
        utilisation=_share_ratio(bottleneck, caps) if bottleneck else 1.0,
        utilisation_by_dim=by_dim,
        overshoot=dict(overshoot),
        blocked={k: int(blocked.get(k, 0)) for k in keys},
        dropped={k: int(dropped.get(k, 0)) for k in keys},
        admitted=admitted,
        ideal=ideal,
        demand=demand,
        ratio=ratio,
        well_behaved=well,
        first_block_ms={k: first_block_ms.get(k) for k in well},
        wait_p95_ms={k: _p95(v) for k, v in (waits_ms or {}).items()},
        slack=slack,
    )


def _share_ratio(parts: Sequence[tuple[str, float, float]], caps: Mapping[str, float]) -> float:
    """Σ got ÷ Σ owed over ``(dimension, got, owed)`` parts, as shares of each dimension's
    capacity when the parts span several dimensions (in one, the plain quotient: the
    single-dimension figures, to the last bit)."""
    if len({d for d, _, _ in parts}) == 1:
        got = sum(g for _, g, _ in parts)
        owed = sum(o for _, _, o in parts)
    else:
        got = sum(g / caps[d] for d, g, _ in parts)
        owed = sum(o / caps[d] for d, _, o in parts)
    return got / owed if owed > 0 else 1.0


def _p95(xs: Sequence[int]) -> int:
    if not xs:
        return 0
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * 0.95))]
