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
from dataclasses import dataclass, field
from enum import StrEnum

from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Allocation, Dimension, ModelCap, Policy, Pool, ShareMode
from fairgate.quota.window import (
    Anchor,
    Count,
    bucket_index,
    ms_until_at_most,
    ms_until_under_line,
    window_end_ms,
)
from fairgate.records import record


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


class Scope(StrEnum):
    """What a counter counts against: the pool (its total and this key's count) or one
    (key, model) pair (a model cap: only this key's count for that model)."""

    POOL = "pool"
    MODEL = "model"


@record
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
    scope: Scope = Scope.POOL
    #: room this key must leave free when the request takes it above its fair share: what the
    #: keys waiting below their share are owed (``active`` mode, :func:`owed_reserve`); 0 = none
    reserve: float = 0.0
    #: the window anchored to the provider's reset (``fairgate.quota.window``); None = epoch
    anchor: Anchor | None = None
    #: ``active`` mode: the fair share is judged on this key's use of the current window (its
    #: current bucket), not its sliding count (:func:`standing`): what a key borrowed in an
    #: earlier window, while others were away, is not held against it in this one. False for a
    #: key refused without a break since before the window began, and in static mode
    window_share: bool = False


@record
class Verdict:
    """What :func:`evaluate` found: the outcome and, for a block, which check blocked and why."""

    outcome: Outcome
    reason: Reason | None = None
    index: int | None = None  # index of the blocking check


def evaluate(
    checks: Sequence[DimensionCheck],
    values: Sequence[tuple[float, float, float]],
    policy: Policy,
    threshold: float,
) -> Verdict:
    """Apply SPEC §3 to each check's ``(pool total, this key, this key's current window)``, in
    order: the sliding values of the pool and the key, and the key's current bucket, which a
    ``window_share`` check judges the fair share on (active mode, issue 17; the cap, the
    ceiling and borrowing up to the limit stay on the sliding counts).

    The first block wins; a soft penalty from any dimension is kept unless something blocks.
    """
    penalized = False
    for i, (check, (total, mine, window)) in enumerate(zip(checks, values, strict=True)):
        if check.scope == "model":
            if mine >= check.limit:
                return Verdict(Outcome.BLOCK, Reason.MODEL_CAP, i)
            continue
        if check.cap is not None and mine >= check.cap:
            return Verdict(Outcome.BLOCK, Reason.CAP_ABSOLUTE, i)
        limit = check.limit
        if total >= limit or total + check.cost > limit:
            return Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, i)
        if check.reserve > 0 and total + check.cost + check.reserve > limit:
            # into room owed to keys waiting further below their share: refused whatever the
            # policy (issue 45), so a soft key is served after the hard keys it would hold
            # back and a burst passes its share only while nobody below it is waiting
            return Verdict(Outcome.BLOCK, Reason.FAIR_SHARE, i)
        share_use = window if check.window_share else mine
        used = max(total / limit, check.signal)
        if used >= threshold:  # strict
            if policy is Policy.HARD and share_use >= check.fair_share:
                return Verdict(Outcome.BLOCK, Reason.FAIR_SHARE, i)
            if policy is Policy.SOFT and share_use >= check.fair_share:
                penalized = True
        else:  # generous: borrow up to the limit
            if policy is Policy.HARD and mine >= limit:
                return Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, i)
            if policy is Policy.SOFT and share_use >= check.fair_share:
                penalized = True
    return Verdict(Outcome.PENALIZE if penalized else Outcome.ALLOW)


def static_fair_share(pool: Pool, key_id: str, dim: Dimension) -> float:
    return dim.limit * pool.weight_of(key_id) / 100.0


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
        levels[dim.key] = water_fill_level(dim.limit, members)
    return levels


def dominant_levels(
    pool: Pool,
    active_keys: Sequence[str],
    demand: Mapping[str, Mapping[str, float]] | None = None,
    used: Mapping[str, Mapping[str, Count]] | None = None,
    now_ms: int = 0,
    pace: LongPace | None = None,
) -> dict[str, float]:
    """Water-filling levels per pool dimension that make the active-mode decision weighted
    dominant-resource-fair (issue 18): a key's standing is its dominant share, the largest of
    ``used / limit`` over the dimensions, and every dimension's level is ``t × limit`` for one
    dominant level ``t``.

    Why this is the DRF rule with :func:`evaluate` unchanged: a key's share of dimension ``d``
    is then ``t × weight × limit_d``, so "its count reaches its share in some dimension" is
    exactly "its dominant share reaches ``t × weight``". A key whose requests are huge reaches
    it in tokens while it holds few requests, and a chat key in requests while it holds few
    tokens; neither takes the other's budget. Still one fair share per check, O(1) per
    admission and the same atomic step on both drivers.

    ``t`` is the progressive-filling level at which the first dimension fills: every active
    key of weight > 0 holds ``min(t × weight, bound)`` of dominant share, spread over the
    dimensions by its *profile* (its share of each per unit of dominant share). A satisfied
    key (in ``demand``, from :func:`demand_bounds`) takes its profile and bound from its
    demand; a pressed one is unbounded, its profile from what it used (``used``), or, when
    it used nothing, the same share of every dimension (the most it could take). A cap bounds
    the dominant share at what reaches the cap. Per dimension that is water-filling of a
    capacity of 1 over ``(weight × profile, bound × profile)``, and ``t`` the lowest of those
    levels (:func:`water_fill_level`). With one dimension this is :func:`active_levels`.
    ``pace`` (:func:`long_budget_pace`): a paced longer dimension is left out (its level is
    infinite, its share its limit) and a shorter one is filled over its paced capacity.

    Worked example: 100 requests and 100,000 tokens an hour, equal weights; chat key A (500
    tokens a request) and research key B (10,000), both pressed. Profiles: A (1, 0.5), B
    (0.1, 1). Tokens fill first: ``50 t × (0.5 + 1) = 1`` → ``50 t = 2/3``, so the levels are
    66.7 requests and 66,667 tokens per 50 % of weight: A is held at 66.7 requests (33,333
    tokens), B at 66,667 tokens (6.7 requests). Per dimension on its own A would be held at
    50 requests and B at 50,000 tokens, leaving 25,000 tokens and 45 requests unused.
    """
    pace = pace or NO_PACE
    dims, limits = _dominant_dims(pool, pace)
    if not pace.held and len(dims) < 2:
        return active_levels(pool, active_keys, demand)
    if not dims:
        return dict.fromkeys(pace.paced, math.inf)
    members: list[tuple[float, dict[str, float], float | None]] = []
    for alloc in (pool.allocation(k) for k in dict.fromkeys(active_keys)):
        if alloc is None or pool.weight_of(alloc.key_id) <= 0:
            continue
        want = (demand or {}).get(alloc.key_id)
        bound: float | None = None
        if want is not None and all(d.key in want for d in dims):
            shares = {d.key: max(0.0, want[d.key]) / limits[d.key] for d in dims}
            bound = max(shares.values())
        else:
            counts = (used or {}).get(alloc.key_id, {})
            shares = {
                d.key: max(0.0, c.value(now_ms, d.window_ms)) / limits[d.key]
                if (c := counts.get(d.key)) is not None
                else 0.0
                for d in dims
            }
        top = max(shares.values())
        profile = {k: v / top for k, v in shares.items()} if top > 0 else dict.fromkeys(limits, 1.0)
        for d in dims:
            cap = alloc.cap_for(d.unit)
            if cap is not None and profile[d.key] > 0:
                at_cap = cap / (limits[d.key] * profile[d.key])
                bound = at_cap if bound is None else min(bound, at_cap)
        members.append((pool.weight_of(alloc.key_id), profile, bound))
    level = min(
        water_fill_level(
            1.0, [(w * p[d.key], None if b is None else b * p[d.key]) for w, p, b in members]
        )
        for d in dims
    )
    out = {d.key: math.inf if math.isinf(level) else level * limits[d.key] for d in dims}
    return {**dict.fromkeys(pace.paced, math.inf), **out}


def _dominant_dims(pool: Pool, pace: LongPace) -> tuple[list[Dimension], dict[str, float]]:
    """The dimensions a dominant standing is taken over and the capacity of each: every
    enforced one with a limit but a paced longer budget, a shorter one at its paced capacity."""
    dims = [d for d in pool.enforced_dimensions() if d.limit > 0 and d.key not in pace.paced]
    limits = {d.key: pace.capacities.get(d.key, d.limit) for d in dims}
    return dims, limits


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
        requests = _request_count(dims, used[key], now_ms)
        for dim in dims:
            count = used[key].get(dim.key)
            if count is None:
                continue
            # the first request's part of the count: the mean request's, in this unit
            first = max(0.0, count.value(now_ms, dim.window_ms)) / requests if requests else 0.0
            rate = demand_rate(count, now_ms, dim.window_ms, age_ms.get(key, 0), first)
            if math.isfinite(rate):
                mine[dim.key] = rate
        if mine:
            out[key] = mine
    return out


def _request_count(
    dims: Sequence[Dimension], counts: Mapping[str, Count], now_ms: int
) -> float | None:
    """How many requests a key made over the pool's shortest request window (None: the pool
    counts no requests, or the key made none): what :func:`demand_rate`'s ``first`` is the
    mean request of."""
    windows = sorted((d.window_ms, d.key) for d in dims if d.unit is Unit.REQUESTS)
    for w, key in windows:
        count = counts.get(key)
        if count is not None:
            n = max(0.0, count.value(now_ms, w))
            return n if n >= 1 else None
    return None


def demand_rate(
    count: Count, now_ms: int, window_ms: int, age_ms: int, first: float = 0.0
) -> float:
    """A key's demand per window, estimated from its two buckets and its time in the active set.

    - A key active for a whole window or longer: its sliding count, what it used over the last
      window.
    - A younger one: the count projected over a window, ``(count − first) × window / age``, and
      at least ``count``, so a key that has just started is not mistaken for a small one (11
      requests in its first 10 minutes of an hourly window project to 60; a key seen for no
      time at all projects to infinity). ``first`` is the part of the count of the request
      that made the key seen (its age counts from it): that request says nothing about the
      key's rate, it is why the key is there at all (a renewal process observed from one of
      its events: ``n − 1`` gaps in ``age``). Counted, one request a minute old projected to
      60 an hour: on a fresh pool where 200 keys of 4 requests an hour joined over the first
      hour, the young ones were held 1,000 requests of an hour's 1,200 they never asked for,
      and two heavy keys were refused from half past with a quarter of the hour left unused
      (``tiny-keys``: utilisation 95 %).
    - From a quarter into the current bucket, the current bucket's own rate
      ``curr × window / elapsed`` when lower: a key whose demand is falling is seen falling
      within the bucket instead of a window later (at 30 minutes, 300 in the previous hour
      and 90 since the hour began estimate 180, not 195). Earlier than a quarter the bucket is
      too short to say anything.

    Underestimates are cheap (the key meets the ceiling, is refused once and is then pressed
    until it is admitted); overestimates would keep unused share from the keys that want it,
    so the lower of the estimates wins.
    """
    value = max(0.0, count.value(now_ms, window_ms))
    if age_ms >= window_ms:
        est = value
    elif age_ms <= 0:
        return math.inf
    else:
        est = max(value, (value - first) * window_ms / age_ms)
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


def standing(count: Count, now_ms: int, window_ms: int, backlogged: bool) -> float:
    """A key's use of one dimension as ``active`` mode judges its share and its place in line
    (issue 17): its use of the current window, or its sliding count while it is *backlogged*
    there (refused without a break since before the window began).

    Why the window: the ideal a policy is measured against (and what a user expects of a share
    "per hour") gives every key its share of each window; a key that borrowed a lot in the
    previous window while others were away owes nothing for it in this one. On the sliding
    count it does: ``prev × (1 − elapsed/W)`` is charged against its share, so a light key
    that used 43 in a quiet hour and asks 9 at the start of a busy one is refused until half
    past (``two-resource``: a window at 0.83 of the ideal). Why the sliding count for a
    backlogged key: a key that asks for more than it gets all the time is paced by it, as in
    the seeds' rule; judged on the window alone it would start every window owed its whole
    share and race the returning keys for the slots that open first.
    """
    return count.value(now_ms, window_ms) if backlogged else count.curr


@dataclass(frozen=True, slots=True)
class Fall:
    """How a reserve falls with time alone (a pacing line): ``per_ms`` until ``until_ms``."""

    per_ms: float
    until_ms: int


@dataclass(frozen=True, slots=True)
class Reserves:
    """Room each key must leave free per dimension for waiting keys (``active`` mode).

    ``per_key`` holds the reserve of every key seen at the refresh; a key not in it (a
    newcomer) must leave ``default``, the whole of what the waiting keys are owed.
    """

    per_key: Mapping[str, Mapping[str, float]]
    default: Mapping[str, float]
    #: per key (and for a newcomer), per dimension: how the reserve falls with time and no new
    #: use where it holds a pacing line's room (:func:`pace_reserves`, :func:`with_pace`);
    #: elsewhere a reserve falls only as the waiting keys are served. What a block's
    #: ``Retry-After`` counts on (:func:`retry_after_ms`)
    falls: Mapping[str, Mapping[str, Fall]] = field(default_factory=dict)
    default_falls: Mapping[str, Fall] = field(default_factory=dict)

    def for_key(self, key_id: str) -> Mapping[str, float]:
        return self.per_key.get(key_id, self.default)

    def falls_for(self, key_id: str) -> Mapping[str, Fall]:
        return self.falls.get(key_id, self.default_falls)


NO_RESERVES = Reserves({}, {})


#: The room held for waiting keys fades out over the last 1/RESERVE_FADE of each window (2
#: minutes of an hour): room still free when a bucket rolls over is lost for good (the count at
#: the boundary is the whole window's use), while a waiting key served a minute later, at the
#: start of the next window, has lost nothing. Measured on ``many-keys``: utilisation 96 % →
#: 99 % with the same fairness.
RESERVE_FADE = 30


def reserve_fade(now_ms: int, window_ms: int) -> float:
    """1 for most of a window, falling linearly to 0 at its end (see :data:`RESERVE_FADE`)."""
    left = window_ms - (now_ms - bucket_index(now_ms, window_ms) * window_ms)
    return min(1.0, left * RESERVE_FADE / window_ms)


#: A fresh window's pace reaches the limit this fraction of the window before its end (5
#: minutes of an hour), so room still held at the end is never lost to the rollover.
PACE_LEAD = 1 / 12


def pace_reserves(
    pool: Pool,
    keys: Collection[str],
    used: Mapping[str, Mapping[str, Count]],
    totals: Mapping[str, Count],
    now_ms: int,
    threshold: float,
    base: Reserves,
) -> Reserves:
    """Pace borrowing in a window that follows a quiet one (``active`` mode).

    In steady state the sliding window itself paces the pool: with a full previous bucket,
    room frees at ``limit / window`` and the current bucket can hold at most ``limit ×
    elapsed / window``. After a quiet window (its pool total below ``threshold × limit``, as
    on a fresh pool or after a night) nothing paces it: the keys present fill the pool in
    minutes, and a key that arrives later in the window finds it full until the bucket rolls
    over (``many-keys``: the first window's Jain index was 0.71). So a key using more of this
    window than its static share (``limit × weight / Σ weights`` of every allocation: what it
    would get if all were present) must also leave free ``(limit − prev) × (1 − elapsed /
    window − PACE_LEAD)``: its borrowing follows the pace a full previous window would have
    set, and the room ahead of the pace is there for the keys below their static share, the
    late ones among them. Keys within their static share and a lone key (SPEC: a lone active
    key may use the whole pool) are not paced.

    Why also while every key is present (issue 45, fresh pools): a key present but asking
    slowly, or one that has just come, cannot take its share of the hour in its first minutes;
    without the pace the keys that ask fastest (a soft key only penalised above its share, a
    burst key) filled a fresh pool in 35 minutes and a hard key that came at minute 20 got
    0.83 of its ideal (``policy-mix``: Jain 0.9885, worst window 0.945 on seed 1; paced,
    0.9996 and 0.987). Why this window's use, not the sliding count: what a key borrowed in
    the quiet window before is no claim on this one (:func:`standing`).
    """
    weights = sum(pool.weight_of(a.key_id) for a in pool.allocations)
    present = set(keys)
    if weights <= 0 or len(present) < 2:
        return base  # a lone key may use the whole pool (SPEC §3, active mode)
    per_key = {k: dict(v) for k, v in base.per_key.items()}
    falls = {k: dict(v) for k, v in base.falls.items()}
    for dim in pool.enforced_dimensions():
        total = totals.get(dim.key)
        limit = dim.limit
        if total is None or max(0.0, total.prev) >= threshold * limit:
            continue
        w = dim.window_ms
        frac = 1.0 - (now_ms - bucket_index(now_ms, w) * w) / w - PACE_LEAD
        room = limit - max(0.0, total.prev)
        held = room * max(0.0, frac)
        if held <= 0:
            continue
        # the line rises as the window goes on and reaches the limit PACE_LEAD before its end
        line = Fall(room / w, now_ms + round(frac * w))
        for k in keys:
            count = used.get(k, {}).get(dim.key)
            mine = 0.0 if count is None else max(0.0, count.curr)
            if mine > limit * pool.weight_of(k) / weights:
                row = per_key.setdefault(k, {})
                row[dim.key] = row.get(dim.key, 0.0) + held
                falls.setdefault(k, {})[dim.key] = line
    return Reserves(per_key, base.default, falls, base.default_falls)


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the reserves for waiting keys are computed from at one refresh of a pool:
    :func:`waiting_reserves` and :func:`dominant_waiting_reserves` take the same view (the
    dominant one hands it on when there is one dimension), so it travels as one value.

    ``levels``: the pool's fair levels per dimension; ``keys``: the active keys; ``waiting``:
    the keys refused lately (the engine's pressed keys); ``used``: per key, its counts as
    :func:`standing` has them, by ``backlogged`` (per key, the dimensions it is backlogged
    in; None: the sliding count everywhere); ``asks``: per waiting key and dimension, what
    its refused request costs.
    """

    pool: Pool
    levels: Mapping[str, float]
    keys: Collection[str]
    waiting: Collection[str]
    used: Mapping[str, Mapping[str, Count]]
    now_ms: int
    backlogged: Mapping[str, Collection[str]] | None = None
    asks: Mapping[str, Mapping[str, float]] | None = None


def waiting_reserves(view: Waiting) -> Reserves:
    """The room each key must leave free for the keys waiting below their share (``active``).

    A key is *waiting* when the ceiling or its share refused it lately and nothing admitted it
    since (the engine's pressed keys). It is owed, per dimension, what it lacks of its fair
    share: ``owed_j = min(λ × weight, cap) − used`` (0 when it has its share). Comparing use
    per unit of weight (``x = used / weight``), a key ``k`` must leave free, for every waiting
    key ``j`` further below (``x_j < x_k``), what ``j`` lacks to catch up with it, and at
    least the request ``j`` was refused for (``asks``: per key and dimension, its cost), at
    most what ``j`` is owed: ``Σ min(owed_j, max(ask_j, w_j × (x_k − x_j)))``
    (:func:`catch_up_reserves`). A
    greedy key far ahead leaves room for all they are owed, a returning key that used nothing
    leaves room for none, and keys at about the same level (greedy keys served in turn) hold
    next to nothing back from each other: room they held for each other was left unused and,
    near a window's end, lost at the rollover (``many-keys`` utilisation 97.7 % → ≥ 98.8 %
    over seeds 1-10). ``evaluate`` then refuses a request when ``total + cost + reserve >
    limit``; the key's own count plays no part, so the rule holds even where λ is off.

    Why: work conservation lends an idle key's share to the others, and the sliding window
    fills to the limit; without this a key coming back finds the pool full and races every
    greedy key for each slot the window frees (and loses: its requests time out). With it
    the slots freed go first to whoever is owed most, until it stops being refused.

    Bounded: the owed amount ends when the key is admitted again or stops asking (the
    pressure hold), so idle keys hold nothing back. Computed at the cached refresh over the
    active keys (one sorted sweep), never per request; per request it is one number per
    dimension in the atomic step, like the fair share.

    ``used`` is taken as :func:`standing` has it: per key, its sliding count in the dimensions
    ``backlogged`` names for it, its current window's use elsewhere (None: the sliding count
    everywhere).
    """
    pool, levels, keys, used, now_ms = view.pool, view.levels, view.keys, view.used, view.now_ms
    backlogged, asks = view.backlogged, view.asks or {}
    per_key: dict[str, dict[str, float]] = {k: {} for k in keys}
    default: dict[str, float] = {}
    for dim in pool.enforced_dimensions():
        dkey, wms = dim.key, dim.window_ms
        level = levels.get(dkey, math.inf)
        # use per unit of weight of every key, once (inf for a weight of 0: last in line)
        use: dict[str, float] = {}
        for k in keys:
            count = used.get(k, {}).get(dkey)
            back = backlogged is None or dkey in backlogged.get(k, ())
            use[k] = 0.0 if count is None else max(0.0, standing(count, now_ms, wms, back))
        owed: list[tuple[float, float, float]] = []  # (use per weight, owed, weight), waiting
        lumps: list[float] = []  # what each was refused for
        for k in view.waiting:
            alloc = pool.allocation(k)
            w = pool.weight_of(k)
            if alloc is None or w <= 0 or k not in used:
                continue
            share = _share_at_level(pool, k, dim, level)
            cap = alloc.cap_for(dim.unit)
            if cap is not None:
                share = min(share, cap)
            due = share - use[k]
            if due > 0:
                owed.append((use[k] / w, due, w))
                lumps.append(asks.get(k, {}).get(dkey, 0.0))
        if not owed:
            continue
        fade = reserve_fade(now_ms, wms)
        default[dkey] = sum(o for _, o, _ in owed) * fade
        xs = {k: (use[k] / w if (w := pool.weight_of(k)) > 0 else math.inf) for k in keys}
        for k, r in catch_up_reserves(owed, xs, lumps).items():
            per_key[k][dkey] = r * fade
    return Reserves(per_key, default)


def dominant_waiting_reserves(view: Waiting, pace: LongPace | None = None) -> Reserves:
    """:func:`waiting_reserves` by dominant share, for the levels of :func:`dominant_levels`
    (with the same ``pace``).

    A waiting key is owed what it lacks of its fair *dominant* share (``t × weight``, or what
    reaches its cap), spread over the dimensions by the profile of what it used: a summariser
    of huge requests below its share is owed tokens and the few requests that go with them,
    not the request share it would never use (per dimension on its own it would be owed its
    whole request share, and a chat key beside it would have to leave those requests free).
    A key must leave free, for every waiting key further below than itself (comparing dominant
    share per unit of weight), what that key lacks to catch up with it, and at least the
    request it was refused for (``asks``, in each dimension), at most what it is owed
    (:func:`dominant_catch_up`): keys served in turn at about the same standing hold nothing
    back from each other. With one dimension this is :func:`waiting_reserves`.
    """
    pool, keys, used = view.pool, view.keys, view.used
    now_ms, backlogged = view.now_ms, view.backlogged
    pace = pace or NO_PACE
    dims, limits = _dominant_dims(pool, pace)
    if not dims:
        return NO_RESERVES
    if not pace.held and len(dims) < 2:
        return waiting_reserves(view)
    first = dims[0]
    level = view.levels.get(first.key, math.inf)
    t = level / limits[first.key]  # the dominant level, per unit of weight

    def shares(k: str) -> dict[str, float]:
        counts = used.get(k, {})
        back = None if backlogged is None else backlogged.get(k, ())
        return {
            d.key: max(0.0, standing(c, now_ms, d.window_ms, back is None or d.key in back))
            / limits[d.key]
            if (c := counts.get(d.key)) is not None
            else 0.0
            for d in dims
        }

    asks = view.asks or {}
    owed: list[tuple[float, float, float, dict[str, float]]] = []  # (x_j, due_j, w_j, profile)
    lumps: list[Mapping[str, float]] = []  # what each was refused for, per dimension
    for k in view.waiting:
        alloc = pool.allocation(k)
        w = pool.weight_of(k)
        if alloc is None or w <= 0 or k not in used:
            continue
        mine = shares(k)
        top = max(mine.values())
        profile = {d: v / top for d, v in mine.items()} if top > 0 else dict.fromkeys(limits, 1.0)
        fair = min(1.0, t * w)
        for d in dims:
            cap = alloc.cap_for(d.unit)
            if cap is not None and profile[d.key] > 0:
                fair = min(fair, cap / (limits[d.key] * profile[d.key]))
        if fair > top:
            owed.append((top / w, fair - top, w, profile))
            lumps.append(asks.get(k, {}))
    if not owed:
        return NO_RESERVES
    xs = {
        k: (max(shares(k).values()) / w if (w := pool.weight_of(k)) > 0 else math.inf) for k in keys
    }
    return Reserves(*dominant_catch_up(owed, xs, limits, now_ms, dims, lumps))


def dominant_catch_up(
    owed: Sequence[tuple[float, float, float, Mapping[str, float]]],
    xs: Mapping[str, float],
    limits: Mapping[str, float],
    now_ms: int,
    dims: Sequence[Dimension],
    lumps: Sequence[Mapping[str, float]] = (),
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The catch-up reserve (:func:`catch_up_reserves`) by dominant share: per key ``k`` and
    dimension ``d``, ``Σ min(due_j, w_j × (x_k − x_j)) × limit_d × profile_j(d)`` over the
    waiting ``j = (x_j, due_j, w_j, profile_j)`` with ``x_j < x_k``, where ``x`` is dominant
    share per unit of weight and ``due_j`` the dominant share ``j`` lacks of its fair one; and
    at least, in each dimension, what ``j``'s refused request costs there (``lumps``, aligned
    with ``owed``), at most what it is owed there.

    A waiting key is owed by every key further along only what it lacks to catch up with that
    key (in dominant share), spread over the dimensions by its own profile: keys at about the
    same dominant share per weight hold nothing back from each other. Per dimension this is
    :func:`catch_up_reserves` with ``due`` and ``w`` scaled by ``limit_d × profile_j(d)``
    (``min(a c, b c) = c min(a, b)``), so the same sorted sweep.
    """
    per_key: dict[str, dict[str, float]] = {k: {} for k in xs}
    default: dict[str, float] = {}
    for d in dims:
        scaled: list[tuple[float, float, float]] = []
        asked: list[float] = []
        for j, (x, due, w, p) in enumerate(owed):
            if p[d.key] > 0:
                scaled.append((x, due * limits[d.key] * p[d.key], w * limits[d.key] * p[d.key]))
                asked.append(lumps[j].get(d.key, 0.0) if j < len(lumps) else 0.0)
        if not scaled:
            continue
        fade = reserve_fade(now_ms, d.window_ms)
        default[d.key] = sum(o for _, o, _ in scaled) * fade
        for k, r in catch_up_reserves(scaled, xs, asked).items():
            per_key[k][d.key] = r * fade
    return per_key, default


@dataclass(frozen=True, slots=True)
class LongPace:
    """How the budgets of longer windows are paced (``active`` mode, :func:`long_budget_pace`).

    ``capacities``: per shorter dimension of the same unit, the capacity its fair levels are
    computed on (what the pace lets the pool hold in that window); ``paced``: the longer
    dimensions being paced, left out of the dominant standing (their fair share is their limit:
    the pool-wide pace and the shorter window's levels share them); ``held``: per paced
    dimension, the room the pool keeps for the rest of its window (a reserve of every key).
    """

    capacities: Mapping[str, float]
    paced: frozenset[str]
    held: Mapping[str, float]
    #: per paced dimension, the shorter dimensions of its unit whose levels it paces
    shorter: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: per paced dimension, how ``held`` falls: ``(limit − prev) / W`` until the window ends
    falls: Mapping[str, Fall] = field(default_factory=dict)


NO_PACE = LongPace({}, frozenset(), {})


def longer_budgets(pool: Pool) -> frozenset[str]:
    """The pool's budgets whose window is longer than its shortest one (a weekly beside 5-hour
    windows): the ones :func:`long_budget_pace` paces, and whose refusals make no run of
    refusals (the engine's ``_note_pressure``). Only enforced dimensions with a limit count."""
    dims = [d for d in pool.enforced_dimensions() if d.limit > 0]
    if len(dims) < 2:
        return frozenset()
    shortest = min(d.window_ms for d in dims)
    return frozenset(d.key for d in dims if d.window_ms > shortest)


def long_budget_pace(pool: Pool, totals: Mapping[str, Count], now_ms: int) -> LongPace:
    """Pace a budget whose window is longer than the pool's shortest (a weekly beside a
    5-hour one) when the pool could otherwise spend it before its window ends (``active``).

    Without it the longer budget goes as demand comes: the first days' shorter windows are
    shared at the shorter limit among the keys present, and the week runs out before its end,
    after which every key is refused (``subscription``: the last 7 of 34 windows refused whole
    on seed 1, while the ideal across windows gives every key the same level in every window).

    *When*: the pool's rate so far in the longer bucket (``curr / max(elapsed, W_s)``, ``W_s``
    the shortest window), or the rate a shorter window of the same unit allows at its limit
    if higher, continued to the bucket's end, passes the limit. Then:

    - *The pool follows the pace* (pool-wide, exact): every key leaves free ``held = (limit −
      prev) × (1 − elapsed / W)``, the line :func:`pace_reserves` draws after a quiet window:
      with an empty previous bucket the pool may have spent ``limit × elapsed / W`` so far;
      with a full one the sliding count paces itself. The ceiling check comes first, so the
      limit is exact.
    - *Each shorter window is shared at the pace*: a shorter dimension of the same unit gets
      its dominant levels over ``capacity = min(limit_s, max(limit × W_s / W, total_s +
      room))`` (``room``: what the pace lets the pool spend now), not over its whole limit, so
      what the pool may hold in that window is split by weight and demand, as the ideal across
      windows does (one level for every key and window), not by who asks most often.
    - The longer dimension leaves the dominant standing (its share is its limit): a key's use
      of the week so far is not held against it; the pace and the shorter window are.

    Worked example: 250 requests per 5 hours and 6,000 a week, an empty previous week, 24
    hours in; the pool has spent 900, 200 of them in the last 5 hours. A 5-hour window used to
    its limit would spend 8,400 a week: paced. ``held = 6,000 × (1 − 24/168) = 5,143``, so the
    pool may reach 857 now and is at 900 (no room: every key is held until the line passes
    900, at 35.7 an hour, 25.2 hours in). The 5-hour levels are computed over ``max(6,000 ×
    5/168, 200 + 0) = 200``, not 250: four keys of equal weight that ask more are held at 50
    each in the 5-hour window, and one that asks 20 leaves 60 to each of the others.

    O(dimensions²) at the refresh from the pool totals it already reads; per admission
    nothing new (a reserve and a fair share per check, as before), so the same atomic step on
    both drivers.
    """
    longer = longer_budgets(pool)
    if not longer:
        return NO_PACE
    dims = [d for d in pool.enforced_dimensions() if d.limit > 0]
    shortest = min(d.window_ms for d in dims)
    capacities: dict[str, float] = {}
    held: dict[str, float] = {}
    falls: dict[str, Fall] = {}
    shorter: dict[str, tuple[str, ...]] = {}
    for dim in dims:
        w = dim.window_ms
        total = totals.get(dim.key)
        if dim.key not in longer or total is None:
            continue
        limit = dim.limit
        elapsed = w - (window_end_ms(now_ms, w, total.anchor) - now_ms)
        prev = 0.0 if total.anchor is not None else max(0.0, total.prev)
        curr = max(0.0, total.curr)
        rate = curr / max(elapsed, shortest)
        for short in dims:  # a shorter window of the same unit used to its limit
            if short.unit == dim.unit and short.window_ms < w:
                rate = max(rate, short.limit / short.window_ms)
        if curr + rate * (w - elapsed) <= limit:
            continue  # at this rate the budget lasts its window
        keep = (limit - prev) * max(0.0, 1.0 - elapsed / w)
        held[dim.key] = keep
        falls[dim.key] = Fall((limit - prev) / w, window_end_ms(now_ms, w, total.anchor))
        room = max(0.0, limit - max(0.0, total.value(now_ms, w)) - keep)
        for short in dims:
            s_total = totals.get(short.key)
            if short.unit != dim.unit or short.window_ms >= w or s_total is None:
                continue
            s_limit = short.limit
            hold = max(limit * short.window_ms / w, s_total.value(now_ms, short.window_ms) + room)
            capacities[short.key] = min(capacities.get(short.key, s_limit), s_limit, hold)
            shorter[dim.key] = (*shorter.get(dim.key, ()), short.key)
    return LongPace(capacities, frozenset(held), held, shorter, falls)


def with_pace(reserves: Reserves, keys: Collection[str], pace: LongPace) -> Reserves:
    """``reserves`` with the room a paced longer budget keeps (:func:`long_budget_pace`): every
    key, the newcomers too, leaves ``held`` free in that dimension, and on top of it what it
    leaves the waiting keys in the shorter dimensions the budget paces (their catch-up reserve,
    the same unit): while the week's line binds, the room the line frees goes first to the keys
    waiting behind, as the room a 5-hour window frees does. Without it a day user below its
    share raced two heavier users for each slot the line opened, and lost (``subscription``:
    windows at 0.75 of its ideal, key ratios 0.93-1.06; with it 0.94-1.05)."""
    if not pace.held:
        return reserves
    per_key = {k: dict(reserves.for_key(k)) for k in {*keys, *reserves.per_key}}
    default = dict(reserves.default)
    for row in (*per_key.values(), default):
        for d, keep in pace.held.items():
            owed = max((row.get(s, 0.0) for s in pace.shorter.get(d, ())), default=0.0)
            row[d] = max(row.get(d, 0.0), keep + owed)
    # every key's reserve in a paced dimension follows the line (the quiet window's pace, if
    # any, is a lower line of the same slope); nothing else is held there
    falls = {k: {**reserves.falls_for(k), **pace.falls} for k in per_key}
    return Reserves(per_key, default, falls, {**reserves.default_falls, **pace.falls})


def catch_up_reserves(
    owed: Sequence[tuple[float, float, float]],
    xs: Mapping[str, float],
    lumps: Sequence[float] = (),
) -> dict[str, float]:
    """Per key ``k`` (use per weight ``xs[k]``), the room it leaves for the waiting keys behind it:
    ``Σ min(due_j, max(a_j, w_j × (x_k − x_j)))`` over the waiting ``j = (x_j, due_j, w_j)``
    with ``x_j < x_k``, where ``a_j`` (``lumps``, 0 when absent) is the size of the request
    ``j`` was refused for. A key yields to a waiting one only as far as that one is behind it,
    so keys at about the same use per weight (greedy keys served in turn) hold nothing back
    from each other, while a key coming back with nothing used is owed up to the others' level.

    The lump is why a key of large requests is not starved by keys of small ones at about its
    level: room the window frees comes in slivers, and held back only as far as ``j`` is
    behind, each sliver fits a small request long before it adds up to ``j``'s large one.
    Every key ahead of ``j`` leaves at least room for that one request (at most what ``j`` is
    owed), so the slivers add up for it. Measured on ``two-resource`` (a research agent of
    12.8k-token requests beside chat keys): the agent's admitted requests were 5-28 % smaller
    than the ones it asked, and it got 0.88-0.96 of its ideal.

    One sweep over the keys in order of ``x``: O((keys + waiting) log) at the refresh. Each
    ``j``'s contribution is 0 up to ``x_j``, then ``a_j`` up to ``x_j + a_j / w_j``, then
    rising with slope ``w_j`` until ``x_j + due_j / w_j``, then ``due_j``: continuous past
    ``x_j``, so each stage change is applied once ``x`` is past its start.
    """
    events: list[tuple[float, int, int]] = []  # (where, stage entered, j)
    flats: list[float] = []
    for j, (x, due, w) in enumerate(owed):
        a = min(due, max(0.0, lumps[j] if j < len(lumps) else 0.0))
        flats.append(a)
        events += [(x, 1, j), (x + a / w, 2, j), (x + due / w, 3, j)]
    events.sort()
    out: dict[str, float] = {}
    i = 0
    flat = full = 0.0  # Σ a_j (stage 1), Σ due_j (stage 3)
    bw = bwx = 0.0  # Σ w_j and Σ w_j x_j of the keys rising (stage 2)
    for k, xk in sorted(xs.items(), key=lambda kv: kv[1]):
        while i < len(events) and events[i][0] < xk:
            _, stage, j = events[i]
            xj, due, wj = owed[j]
            if stage == 1:
                flat += flats[j]
            elif stage == 2:
                flat, bw, bwx = flat - flats[j], bw + wj, bwx + wj * xj
            else:
                full, bw, bwx = full + due, bw - wj, bwx - wj * xj
            i += 1
        if math.isfinite(xk):
            out[k] = full + max(0.0, flat) + max(0.0, bw * xk - bwx)
        else:  # a key of weight 0: last in line, it leaves room for every waiting key
            out[k] = sum(due for _, due, _ in owed)
    return out


def _share_at_level(pool: Pool, key_id: str, dim: Dimension, level: float) -> float:
    limit = dim.limit
    if math.isinf(level):
        return limit
    return min(limit, level * pool.weight_of(key_id))


@dataclass(frozen=True, slots=True)
class _DimPlan:
    """What a pool dimension's check takes from configuration only (pool, allocation)."""

    dim: Dimension
    window_ms: int
    limit: float
    static_share: float
    cap: float | None
    anchored: bool
    key: str
    unit: Unit


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """The part of an admission's checks that depends on configuration only: the pool's
    enforced dimensions with their limits, the key's static fair share and cap, and the
    model's caps. Built once per (pool snapshot, key, model) by the engine, so an admission
    adds only what changes per request (cost, signals, active levels, reserves, anchors)."""

    dims: tuple[_DimPlan, ...]
    model_caps: tuple[ModelCap, ...]
    #: whether any dimension follows a provider's anchored window (else no anchors are read)
    anchored: bool
    #: each model cap's counter name (``ModelCap.key`` formats it at every read)
    model_cap_keys: tuple[str, ...] = ()


def check_plan(pool: Pool, alloc: Allocation, model: str | None = None) -> CheckPlan:
    dims = tuple(
        _DimPlan(
            dim,
            dim.window_ms,
            dim.limit,
            static_fair_share(pool, alloc.key_id, dim),
            alloc.cap_for(dim.unit),
            dim.provider_anchored,
            dim.key,
            dim.unit,
        )
        for dim in pool.enforced_dimensions()
    )
    caps = alloc.model_cap(model)
    return CheckPlan(dims, caps, any(p.anchored for p in dims), tuple(mc.key for mc in caps))


_NOTHING: Mapping[str, float] = {}


def compile_checks(
    pool: Pool,
    alloc: Allocation,
    cost: Mapping[Unit, float],
    *,
    model: str | None = None,
    signals: Mapping[str, float] | None = None,
    levels: Mapping[str, float] | None = None,
    reserves: Mapping[str, float] | None = None,
    anchors: Mapping[str, Anchor] | None = None,
    plan: CheckPlan | None = None,
    backlogged: Collection[str] = (),
) -> tuple[DimensionCheck, ...]:
    """Turn a pool, an allocation and a request's cost into the checks of one admission.

    Unknown-limit dimensions are skipped. ``signals`` maps a dimension key to the provider's
    reported used fraction for it. ``levels`` are the water-filling levels of ``active`` mode
    (from :func:`active_levels`; computed over an active set that includes this key).
    ``anchors``: the pool's provider-anchored windows by dimension key; dimensions that are not
    :attr:`~fairgate.quota.model.Dimension.provider_anchored` (``window_anchor: epoch``, other
    units) and model caps stay epoch-aligned whatever the store holds. ``plan``: what
    :func:`check_plan` gives for this pool, allocation and model (computed here when absent).
    In ``active`` mode the share is judged on the key's current window
    (``DimensionCheck.window_share``) but in the dimensions named in ``backlogged``, where the
    key has been refused without a break since before the window began (:func:`standing`).
    """
    if plan is None:
        plan = check_plan(pool, alloc, model)
    active = levels is not None and pool.share_mode is ShareMode.ACTIVE
    out: list[DimensionCheck] = []
    sig = signals or _NOTHING
    if not (active or reserves or anchors):
        # the common case (a static pool, no anchored window; a provider reading or none): all
        # but the cost and the signal comes from the plan, and the other fields keep their
        # defaults (no reserve, no anchor), as the loop below would set them
        for p in plan.dims:
            out.append(
                DimensionCheck(
                    p.key,
                    p.unit,
                    p.window_ms,
                    p.limit,
                    p.static_share,
                    p.cap,
                    float(cost.get(p.unit, 0.0)),
                    float(sig.get(p.key, 0.0)),
                )
            )
        return _with_model_caps(out, plan, cost)
    owed = reserves or _NOTHING
    for p in plan.dims:
        dim = p.dim
        key = dim.key
        if active:
            assert levels is not None
            share = _share_at_level(pool, alloc.key_id, dim, levels.get(key, math.inf))
        else:
            share = p.static_share
        out.append(
            DimensionCheck(
                key=key,
                unit=dim.unit,
                window_ms=p.window_ms,
                limit=p.limit,
                fair_share=share,
                cap=p.cap,
                cost=float(cost.get(dim.unit, 0.0)),
                signal=float(sig.get(key, 0.0)),
                reserve=max(0.0, float(owed.get(key, 0.0))),
                anchor=anchors.get(key) if anchors and p.anchored else None,
                window_share=active and key not in backlogged,
            )
        )
    return _with_model_caps(out, plan, cost)


def _with_model_caps(
    out: list[DimensionCheck], plan: CheckPlan, cost: Mapping[Unit, float]
) -> tuple[DimensionCheck, ...]:
    """``out`` (the pool's checks) and a check per model cap of the plan, as a tuple."""
    for mc, key in zip(plan.model_caps, plan.model_cap_keys, strict=True):
        out.append(
            DimensionCheck(
                key=key,
                unit=mc.unit,
                window_ms=Window.HOURLY.ms,
                limit=mc.limit,
                fair_share=mc.limit,
                cap=None,
                cost=float(cost.get(mc.unit, 0.0)),
                scope=Scope.MODEL,
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
    fall: Fall | None = None,
) -> int | None:
    """When the blocking count will have decayed enough for this request to pass (no new use).

    A fair-share block also ends when the pool leaves strict mode, whichever comes first; a
    provider-reported saturation keeps strict mode on for an unknown time, so it is not counted.
    ``fall`` (:meth:`Reserves.falls_for`): how the room this key must leave falls with time
    alone (a pacing line); a block by that room ends when the falling room and the decaying
    total meet (a weekly pace frees a request in minutes where the total alone decays in days;
    the morning's pace after a quiet night in seconds, not at the next hour).
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
    held = check.reserve > 0 and total.value(now_ms, w) + check.cost + check.reserve > check.limit
    if reason is Reason.FAIR_SHARE and held:
        # blocked by room held for waiting keys: when the pool has room beyond it (the
        # reserve also shrinks as those keys are served, so this is the longest wait)
        target = check.limit - check.cost - check.reserve
        if fall is not None:
            paced = ms_until_under_line(total, target, fall.per_ms, now_ms, w, fall.until_ms)
            if paced is not None:
                return paced
        return ms_until_at_most(total, target, now_ms, w)
    if reason is Reason.FAIR_SHARE:
        if check.window_share:  # judged on the current window: it frees when the window turns
            t_mine: int | None = window_end_ms(now_ms, w, check.anchor) - now_ms
        else:
            t_mine = ms_until_at_most(mine, check.fair_share - eps, now_ms, w)
        t_mode: int | None = None
        if check.signal < threshold:
            t_mode = ms_until_at_most(total, threshold * check.limit - eps, now_ms, w)
        options = [t for t in (t_mine, t_mode) if t is not None]
        return min(options) if options else None
    return None


@dataclass(frozen=True, slots=True)
class Presence:
    """In how many of a paced longer window's shorter windows a key was active (``active``
    mode, :func:`week_levels`): counted from the first shorter window it was seen in within
    that longer window (``first``, a bucket index), ``last`` the latest one counted."""

    longer_end_ms: int
    first: int
    last: int
    windows: int


def note_presence(seen: Presence | None, longer_end_ms: int, short_index: int) -> Presence:
    """``seen`` after the key was active in the shorter window ``short_index`` of the longer
    window ending at ``longer_end_ms`` (a new longer window starts the count again)."""
    if seen is None or seen.longer_end_ms != longer_end_ms:
        return Presence(longer_end_ms, short_index, short_index, 1)
    if short_index == seen.last:
        return seen
    return Presence(longer_end_ms, seen.first, short_index, seen.windows + 1)


def week_levels(
    pool: Pool,
    pace: LongPace,
    totals: Mapping[str, Count],
    now_ms: int,
    presence: Mapping[str, Mapping[str, Presence]],
    demand: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, float]:
    """The level a paced longer budget allows each shorter window it paces (``active`` mode,
    issue 45): per shorter dimension, the most a key may hold per unit of weight in any one
    shorter window, so that room a window does not need is kept for the windows that do.

    Why: the pace (:func:`long_budget_pace`) spreads the week's room evenly over its 5-hour
    windows, and each window is shared among the keys present. A batch key that asks once a
    day then finds every window's room taken at the even pace: in the windows it is away a
    steady key takes what a third key left (123 of a 5-hour window where its ideal is 74),
    and in the batch's window the three share only the even pace (the batch got 0.57 of its
    week in ``daily-batch``). The ideal across windows gives every key the same level ``L``
    in every window (``min(demand, L × weight)``); this is its online estimate.

    *Estimate*: the room the week has left, plus what the pool used in the current shorter
    window, spread over the shorter windows left counting the current one, is the budget
    ``B`` of one window. Each key seen in this longer window is expected in the same fraction
    ``f`` of the windows to come as in those since it was first seen (``presence``: per paced
    dimension, per key, :class:`Presence`), asking
    its demand bound there if it is satisfied (:func:`demand_bounds`), more than its level
    otherwise. ``L`` fills ``B`` over ``(f × weight, f × demand)`` (:func:`water_fill_level`).
    Room saved in one window raises the budget of the next ones, so an estimate that is too low
    corrects itself before the week ends; one that is too high is the even pace's split.
    """
    out: dict[str, float] = {}
    for paced, shorter in pace.shorter.items():
        total = totals.get(paced)
        dim = next((d for d in pool.enforced_dimensions() if d.key == paced), None)
        if total is None or dim is None:
            continue
        left = window_end_ms(now_ms, dim.window_ms, total.anchor) - now_ms
        room = max(0.0, dim.limit - max(0.0, total.value(now_ms, dim.window_ms)))
        for short in pool.enforced_dimensions():
            s_total = totals.get(short.key)
            if short.key not in shorter or s_total is None:
                continue
            ws = short.window_ms
            end = window_end_ms(now_ms, ws, s_total.anchor)
            index = bucket_index(now_ms, ws, s_total.anchor)
            budget = (room + max(0.0, s_total.curr)) * ws / (left + ws - (end - now_ms))
            members: list[tuple[float, float | None]] = []
            week_end = window_end_ms(now_ms, dim.window_ms, total.anchor)
            for key, seen in presence.get(paced, {}).items():
                alloc = pool.allocation(key)
                if alloc is None or seen.longer_end_ms != week_end:
                    continue
                f = seen.windows / max(1, index - seen.first + 1)
                want = (demand or {}).get(key, {}).get(short.key)
                bound = _demand_bound(alloc, short, {key: {short.key: want}} if want else None)
                members.append((pool.weight_of(key) * f, None if bound is None else bound * f))
            out[short.key] = water_fill_level(budget, members)
    return out
