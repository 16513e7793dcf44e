"""The pool usage snapshot the dashboard and the admin API show (pure)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from fairgate.quota.burn import time_to_exhaustion_ms
from fairgate.quota.decision import static_fair_share
from fairgate.quota.model import Pool
from fairgate.quota.window import Anchor, Count, window_end_ms


@dataclass(frozen=True, slots=True)
class KeyUsage:
    key_id: str
    weight: float
    policy: str
    consumed: float
    fair_share: float
    surplus: float  # fair share minus consumed: > 0 unused, < 0 borrowed beyond the share
    borrowing: bool
    cap: float | None
    #: False for the one row of use by keys without an allocation (:data:`UNALLOCATED`)
    allocated: bool = True
    #: the key's largest ``consumed / limit`` over the pool's enforced dimensions (its
    #: standing in active mode, issue 18) and which dimension that is (None: it used nothing);
    #: the same in every dimension's row of the key
    dominant_share: float = 0.0
    dominant_dimension: str | None = None
    #: what the key used in the current window (its current bucket): what active mode judges its
    #: share on, unless it is backlogged there (issue 17)
    window_consumed: float = 0.0
    #: active mode: refused without a break since before the current window began, so its share
    #: is judged on ``consumed`` (the sliding count); as this process saw it
    backlogged: bool = False


#: The ``key_id`` of the row that sums the use of keys with no allocation in the pool (not a
#: valid key id, so it cannot be mistaken for one).
UNALLOCATED = "(unallocated)"


@dataclass(frozen=True, slots=True)
class DimensionUsage:
    key: str
    unit: str
    window: str
    limit: float
    enforced: bool
    total: float
    used_fraction: float
    strict: bool
    keys: tuple[KeyUsage, ...]
    burn_rate_per_s: float
    time_to_exhaustion_ms: int | None
    #: when the window's counts next roll over: the provider's reset for an anchored window,
    #: the turn of the epoch-aligned bucket otherwise
    resets_at_ms: int | None = None
    #: the connection whose reading anchors the window to the provider's reset (None: the
    #: window is epoch-aligned, no reading stated a reset yet or the unit is not anchored)
    anchor_source: str | None = None


@dataclass(frozen=True, slots=True)
class PoolUsage:
    pool_id: str
    at_ms: int
    dimensions: tuple[DimensionUsage, ...]


def build_usage(
    pool: Pool,
    totals: Mapping[str, Count],
    per_key: Mapping[str, Mapping[str, Count]],
    now_ms: int,
    threshold: float,
    rates: Mapping[str, float],
    signals: Mapping[str, float] | None = None,
    *,
    unallocated_allowed: bool = False,
    anchors: Mapping[str, Anchor] | None = None,
    backlogged: Mapping[str, Collection[str]] | None = None,
) -> PoolUsage:
    """``unallocated_allowed``: keys without an allocation may use the pool
    (``server.require_allocation`` off), so their row is shown even at 0; otherwise it is shown
    only when there is such use (from before the setting, or a combo's shadow copies).
    ``backlogged``: per key, the dimensions it is backlogged in (active mode, the engine's
    view)."""
    dims: list[DimensionUsage] = []
    rows: list[list[KeyUsage]] = []
    others: list[float] = []
    for dim in pool.dimensions:
        w = dim.window_ms
        anchor = (anchors or {}).get(dim.key)
        limit = dim.limit
        total = totals.get(dim.key, Count()).value(now_ms, w)
        used = total / limit if dim.known else 0.0
        used = max(used, (signals or {}).get(dim.key, 0.0))
        keys: list[KeyUsage] = []
        for alloc in pool.allocations:
            count = per_key.get(alloc.key_id, {}).get(dim.key, Count())
            consumed = count.value(now_ms, w)
            share = static_fair_share(pool, alloc.key_id, dim)
            keys.append(
                KeyUsage(
                    key_id=alloc.key_id,
                    weight=pool.weight_of(alloc.key_id),
                    policy=alloc.policy.value,
                    consumed=consumed,
                    fair_share=share,
                    surplus=share - consumed,
                    borrowing=dim.known and consumed > share,
                    cap=alloc.cap_for(dim.unit),
                    window_consumed=count.curr,
                    backlogged=dim.key in (backlogged or {}).get(alloc.key_id, ()),
                )
            )
        rate = rates.get(dim.key, 0.0)
        # the pool total counts every key; what the allocated keys do not account for is the
        # unallocated keys' (exact: the window arithmetic is linear in the buckets)
        rest = total - sum(k.consumed for k in keys)
        others.append(rest if rest > 1e-9 * max(1.0, total) else 0.0)
        rows.append(keys)
        dims.append(
            DimensionUsage(
                key=dim.key,
                unit=dim.unit.value,
                window=dim.window.value,
                limit=limit,
                enforced=dim.known,
                total=total,
                used_fraction=used,
                strict=dim.known and used >= threshold,
                keys=(),
                burn_rate_per_s=rate,
                time_to_exhaustion_ms=(
                    time_to_exhaustion_ms(limit - total, rate) if dim.known else None
                ),
                resets_at_ms=window_end_ms(now_ms, w, anchor),
                anchor_source=None if anchor is None else anchor.source,
            )
        )
    show = unallocated_allowed or any(o > 0 for o in others)
    dominant = dominant_shares(dims, rows)
    out = []
    for d, keys, other in zip(dims, rows, others, strict=True):
        keys[:] = [
            replace(
                k, dominant_share=dominant[k.key_id][1], dominant_dimension=dominant[k.key_id][0]
            )
            for k in keys
        ]
        if show:
            keys.append(_unallocated_row(other, d.enforced))
        out.append(replace(d, keys=tuple(keys)))
    return PoolUsage(pool.id, now_ms, tuple(out))


def dominant_shares(
    dims: Sequence[DimensionUsage], rows: Sequence[Sequence[KeyUsage]]
) -> dict[str, tuple[str | None, float]]:
    """Each key's dominant dimension and share: the largest ``consumed / limit`` over the
    enforced dimensions (the first on ties; None and 0 when it used nothing)."""
    out: dict[str, tuple[str | None, float]] = {}
    for d, keys in zip(dims, rows, strict=True):
        for k in keys:
            best = out.setdefault(k.key_id, (None, 0.0))
            if not d.enforced or d.limit <= 0:
                continue
            share = k.consumed / d.limit
            if share > best[1]:
                out[k.key_id] = (d.key, share)
    return out


def _unallocated_row(consumed: float, enforced: bool) -> KeyUsage:
    """Keys without an allocation count as weight 0, hard: no fair share, so all their use is
    borrowed (allowed only while the pool is generous)."""
    return KeyUsage(
        key_id=UNALLOCATED,
        weight=0.0,
        policy="hard",
        consumed=consumed,
        fair_share=0.0,
        surplus=-consumed,
        borrowing=enforced and consumed > 0,
        cap=None,
        allocated=False,
    )
