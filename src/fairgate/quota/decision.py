"""The fair-share decision (SPEC §3) as a pure function over plain numbers.

Both store drivers evaluate exactly this rule inside their atomic step: the SQLite driver calls
:func:`evaluate` inside its transaction, the Redis driver runs ``store/lua/admit.lua``, which
mirrors it line for line (a parity test holds them together). Everything that does not depend on the
counters (fair share, cap, cost, the provider's signal) is compiled beforehand into
:class:`DimensionCheck` values by :func:`compile_checks`, so the atomic step is small.

Worked example (static mode, threshold 0.5): a pool of 100 requests/hour, key A weight 50 %.
Pool total 60 → used 0.6 ≥ 0.5, strict. A has used 50 = its fair share (100 × 50 %) → a hard key is
blocked (``fair-share``), a soft key is allowed but penalised, a burst key passes. At total 30 the
pool is generous: A may borrow up to the whole pool minus what the others used.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from fairgate.quota.model import Allocation, Dimension, Policy, Pool, ShareMode
from fairgate.quota.units import Unit, Window
from fairgate.quota.window import Count, bucket_index, ms_until_at_most


class Outcome(StrEnum):
    ALLOW = "allow"
    PENALIZE = "penalize"  # allowed, but the target is deprioritised (soft policy)
    BLOCK = "block"


class Reason(StrEnum):
    CAP_ABSOLUTE = "cap-absolute"
    GLOBAL_SATURATED = "global-saturated"
    FAIR_SHARE = "fair-share"
    MODEL_CAP = "model-cap"


#: Integer codes shared with the Lua script (index into this tuple).
REASON_CODES: tuple[Reason | None, ...] = (
    None,
    Reason.CAP_ABSOLUTE,
    Reason.GLOBAL_SATURATED,
    Reason.FAIR_SHARE,
    Reason.MODEL_CAP,
)
POLICY_CODES: dict[Policy, int] = {Policy.HARD: 0, Policy.SOFT: 1, Policy.BURST: 2}


@dataclass(frozen=True, slots=True)
class DimensionCheck:
    """One counter the admission must read, with every number the rule needs but the counts.

    ``scope`` is ``pool`` for a pool dimension (pool total and this key's count) or ``model``
    for a per-(key, model) cap (only this key's count for that model matters).
    """

    key: str
    unit: Unit
    window_ms: int
    limit: float
    fair_share: float
    cap: float | None
    cost: float
    signal: float = 0.0
    scope: str = "pool"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`evaluate` found: the outcome and, for a block, which check blocked and why."""

    outcome: Outcome
    reason: Reason | None = None
    index: int | None = None  # index of the blocking check


def evaluate(
    checks: Sequence[DimensionCheck],
    values: Sequence[tuple[float, float]],
    policy: Policy,
    threshold: float,
) -> Verdict:
    """Apply SPEC §3 to the sliding values ``(pool total, this key)`` of each check, in order.

    The first block wins; a soft penalty from any dimension is kept unless something blocks.
    """
    penalized = False
    for i, (check, (total, mine)) in enumerate(zip(checks, values, strict=True)):
        if check.scope == "model":
            if mine >= check.limit:
                return Verdict(Outcome.BLOCK, Reason.MODEL_CAP, i)
            continue
        if check.cap is not None and mine >= check.cap:
            return Verdict(Outcome.BLOCK, Reason.CAP_ABSOLUTE, i)
        limit = check.limit
        if total >= limit or total + check.cost > limit:
            return Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, i)
        used = max(total / limit, check.signal)
        if used >= threshold:  # strict
            if policy is Policy.HARD and mine >= check.fair_share:
                return Verdict(Outcome.BLOCK, Reason.FAIR_SHARE, i)
            if policy is Policy.SOFT and mine >= check.fair_share:
                penalized = True
        else:  # generous: borrow up to the limit
            if policy is Policy.HARD and mine >= limit:
                return Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, i)
            if policy is Policy.SOFT and mine >= check.fair_share:
                penalized = True
    return Verdict(Outcome.PENALIZE if penalized else Outcome.ALLOW)


def static_fair_share(pool: Pool, key_id: str, dim: Dimension) -> float:
    return pool.effective_limit(dim) * pool.weight_of(key_id) / 100.0


def water_fill_level(limit: float, members: Sequence[tuple[float, float | None]]) -> float:
    """The level λ of weighted water-filling: each member gets ``min(λ × weight, bound)``.

    ``members`` are ``(weight, demand bound)`` (None = unbounded). Members whose bound is below
    their weighted share are satisfied at the bound and their surplus is shared by the rest in
    proportion to weight. Returns ``inf`` when every member is bounded and the bounds fit.
    """
    live = [(w, b) for w, b in members if w > 0]
    if not live:
        return math.inf
    remaining = limit
    weight_left = sum(w for w, _ in live)
    bounded = sorted((b / w, w, b) for w, b in live if b is not None)
    for ratio, w, b in bounded:
        if ratio * weight_left <= remaining:
            remaining -= b
            weight_left -= w
        else:
            break
    if weight_left <= 0:
        return math.inf
    return max(0.0, remaining) / weight_left


def active_levels(
    pool: Pool,
    active_keys: Sequence[str],
    demand: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, float]:
    """Water-filling level λ per pool dimension over the keys active recently.

    Keys that sent nothing within ``active_window`` hold no share, so a lone active key may use
    the whole pool; an absolute cap in the dimension's unit bounds a key's demand and its surplus
    flows to the others. Computed when the active set is refreshed, not per request: a key's
    share is then ``min(limit, λ × weight)``, O(1) on the hot path.

    ``demand`` (optional, from :func:`demand_bounds`) bounds a key's claim further: per key, per
    dimension key, what the key is known to want. A key absent from it is bounded only by its
    cap. The bound never lowers the key's own share (that stays ``λ × weight``); it only stops
    a share the key is not using from being held back from the others.
    """
    levels: dict[str, float] = {}
    allocs = [a for a in (pool.allocation(k) for k in dict.fromkeys(active_keys)) if a]
    for dim in pool.enforced_dimensions():
        members = [(pool.weight_of(a.key_id), _demand_bound(a, dim, demand)) for a in allocs]
        levels[dim.key] = water_fill_level(pool.effective_limit(dim), members)
    return levels


def demand_bounds(
    pool: Pool,
    active_keys: Sequence[str],
    used: Mapping[str, Mapping[str, Count]],
    now_ms: int,
    age_ms: Mapping[str, int],
    pressed: Collection[str] = (),
) -> dict[str, dict[str, float]]:
    """How much each *satisfied* active key wants, per dimension (``active`` mode).

    A key is satisfied when nothing refused it lately (it is not ``pressed``): whatever it asked
    for, it got, so its use is its demand. Its bound is that demand as estimated by
    :func:`demand_rate` from its two counter buckets (``used``) and how long it has been active
    (``age_ms``). Water-filling with these bounds (:func:`active_levels`) leaves each satisfied
    key what it uses and shares the rest among the pressed keys by weight: weighted max-min
    fairness over demand, which is work-conserving where the plain weighted shares are not.
    Pressed keys, and keys with no estimate yet, are bounded only by weight and cap. A key
    whose estimate is above its weighted level is not held back by its bound either: in the
    water-filling it counts as unbounded.

    Worked example: 300 requests/hour, keys A, B, C of equal weight, all active for over an
    hour. A is refused all the time; B and C used 50 each in the last hour and were not
    refused. Plain shares are 100 each and 100 requests an hour would go unused while A is
    refused (utilisation 2/3). With the bounds, B and C are satisfied at 50, λ = (300 − 100) /
    1 = 200: A may use 200 and the pool is fully used. If B's demand then grows, B meets the
    pool ceiling and is refused, so it is pressed (unbounded) at the next refresh: λ =
    (300 − 50) / 2 = 125, A is held at 125 and B takes what A's decaying count frees, up to 125:
    the max-min split of the 250 left between two keys that both want more.
    """
    out: dict[str, dict[str, float]] = {}
    dims = pool.enforced_dimensions()
    for key in dict.fromkeys(active_keys):
        if key in pressed or key not in used or pool.allocation(key) is None:
            continue
        mine: dict[str, float] = {}
        for dim in dims:
            count = used[key].get(dim.key)
            if count is None:
                continue
            rate = demand_rate(count, now_ms, dim.window_ms, age_ms.get(key, 0))
            if math.isfinite(rate):
                mine[dim.key] = rate
        if mine:
            out[key] = mine
    return out


def demand_rate(count: Count, now_ms: int, window_ms: int, age_ms: int) -> float:
    """A key's demand per window, estimated from its two buckets and its time in the active set.

    - A key active for a whole window or longer: its sliding count, what it used over the last
      window.
    - A younger one: the count projected over a window, ``count × window / age``, so a key that
      has just started is not mistaken for a small one (10 requests in its first 10 minutes of
      an hourly window project to 60; a key seen for no time at all projects to infinity).
    - From a quarter into the current bucket, the current bucket's own rate
      ``curr × window / elapsed`` when lower: a key whose demand is falling is seen falling
      within the bucket instead of a window later (at 30 minutes, 300 in the previous hour
      and 90 since the hour began estimate 180, not 195). Earlier than a quarter the bucket is
      too short to say anything.

    Underestimates are cheap (the key meets the ceiling, is refused once and is then pressed
    until it is admitted); overestimates would keep unused share from the keys that want it,
    so the lower of the estimates wins.
    """
    if age_ms <= 0:
        return math.inf
    span = min(age_ms, window_ms)
    est = max(0.0, count.value(now_ms, window_ms)) * window_ms / span
    elapsed = now_ms - bucket_index(now_ms, window_ms) * window_ms
    if elapsed * 4 >= window_ms and age_ms >= elapsed:
        est = min(est, max(0.0, count.curr) * window_ms / elapsed)
    return est


def _demand_bound(
    alloc: Allocation, dim: Dimension, demand: Mapping[str, Mapping[str, float]] | None
) -> float | None:
    """The tightest known bound on a key's use of one dimension: its cap, its recent demand."""
    cap = alloc.cap_for(dim.unit)
    want = None if demand is None else demand.get(alloc.key_id, {}).get(dim.key)
    if want is None:
        return cap
    want = max(0.0, want)
    return want if cap is None else min(cap, want)


def active_fair_share(
    pool: Pool,
    key_id: str,
    dim: Dimension,
    active_keys: Sequence[str],
    demand: Mapping[str, Mapping[str, float]] | None = None,
) -> float:
    """Fair share in ``active`` mode; the requesting key always counts as active."""
    keys = [*active_keys, key_id]
    level = active_levels(pool, keys, demand).get(dim.key, math.inf)
    return _share_at_level(pool, key_id, dim, level)


def _share_at_level(pool: Pool, key_id: str, dim: Dimension, level: float) -> float:
    limit = pool.effective_limit(dim)
    if math.isinf(level):
        return limit
    return min(limit, level * pool.weight_of(key_id))


def compile_checks(
    pool: Pool,
    alloc: Allocation,
    cost: Mapping[Unit, float],
    *,
    model: str | None = None,
    signals: Mapping[str, float] | None = None,
    levels: Mapping[str, float] | None = None,
) -> tuple[DimensionCheck, ...]:
    """Turn a pool, an allocation and a request's cost into the checks of one admission.

    Unknown-limit dimensions are skipped. ``signals`` maps a dimension key to the provider's
    reported used fraction for it. ``levels`` are the water-filling levels of ``active`` mode
    (from :func:`active_levels`; computed over an active set that includes this key).
    """
    out: list[DimensionCheck] = []
    for dim in pool.enforced_dimensions():
        if pool.share_mode is ShareMode.ACTIVE and levels is not None:
            share = _share_at_level(pool, alloc.key_id, dim, levels.get(dim.key, math.inf))
        else:
            share = static_fair_share(pool, alloc.key_id, dim)
        out.append(
            DimensionCheck(
                key=dim.key,
                unit=dim.unit,
                window_ms=dim.window_ms,
                limit=pool.effective_limit(dim),
                fair_share=share,
                cap=alloc.cap_for(dim.unit),
                cost=float(cost.get(dim.unit, 0.0)),
                signal=float((signals or {}).get(dim.key, 0.0)),
            )
        )
    for mc in alloc.model_cap(model):
        out.append(
            DimensionCheck(
                key=mc.key,
                unit=mc.unit,
                window_ms=Window.HOURLY.ms,
                limit=mc.limit,
                fair_share=mc.limit,
                cap=None,
                cost=float(cost.get(mc.unit, 0.0)),
                scope="model",
            )
        )
    return tuple(out)


def retry_after_ms(
    check: DimensionCheck,
    reason: Reason,
    total: Count,
    mine: Count,
    now_ms: int,
    threshold: float,
) -> int | None:
    """When the blocking count will have decayed enough for this request to pass (no new use).

    A fair-share block also ends when the pool leaves strict mode, whichever comes first; a
    provider-reported saturation keeps strict mode on for an unknown time, so it is not counted.
    """
    w = check.window_ms
    eps = 1e-9
    if reason is Reason.CAP_ABSOLUTE and check.cap is not None:
        return ms_until_at_most(mine, check.cap - eps, now_ms, w)
    if reason is Reason.MODEL_CAP:
        return ms_until_at_most(mine, check.limit - eps, now_ms, w)
    if reason is Reason.GLOBAL_SATURATED:
        target = min(check.limit - check.cost, check.limit - eps)
        t_total = ms_until_at_most(total, target, now_ms, w)
        if total.value(now_ms, w) + check.cost <= check.limit:
            # blocked by its own usage ≥ limit (generous hard rule)
            return ms_until_at_most(mine, check.limit - eps, now_ms, w)
        return t_total
    if reason is Reason.FAIR_SHARE:
        t_mine = ms_until_at_most(mine, check.fair_share - eps, now_ms, w)
        t_mode: int | None = None
        if check.signal < threshold:
            t_mode = ms_until_at_most(total, threshold * check.limit - eps, now_ms, w)
        options = [t for t in (t_mine, t_mode) if t is not None]
        return min(options) if options else None
    return None
