"""The live views a combo's strategy orders by, gathered for one request.

Strategies are pure functions of a :class:`~fairgate.routing.RouteInput`; this module fills
it from the running gateway, O(targets) per request:

- **quota**: per target, this key's standing in the target's pool (what an admission would
  decide now, the tightest counter's remaining fraction, reset time, headroom against this
  request's cost, time to exhaustion at the pool's burn rate), one counter read per distinct
  pool; for a target without a pool, the provider's own account buckets (5 h / 7 d
  utilisation and reset from its rate-limit headers). ``fill-first``, ``headroom``,
  ``reset-aware``, ``reset-window`` and ``auto`` order by it, and every strategy puts
  soft-penalised targets behind the others.
- **health**: the provider's breaker, and whether the connection is cooling down or the model
  locked out, as this process last learned it (no store read, and never the half-open probe:
  the executor's check stays the authority).
- **task**: what the request needs (tools, vision, reasoning, a long context).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from fairgate.domain.connections import Connection
from fairgate.domain.units import Unit
from fairgate.quota.decision import Outcome
from fairgate.quota.model import Pool
from fairgate.quota.outcomes import Standing
from fairgate.quota.signals import BucketState
from fairgate.routing import HealthView, QuotaView, Target, TargetHealth, TargetQuota
from fairgate.snapshot import Registry

if TYPE_CHECKING:
    from fairgate.quota.engine import QuotaEngine
    from fairgate.resilience.manager import RateLimitManager

__all__ = ["health_view", "quota_view", "target_quota"]


def _connection(reg: Registry, t: Target) -> Connection | None:
    """The connection a target stands for: the named one, else the provider's first that
    serves the model (a provider-wide target shares that account's picture)."""
    if t.connection_id:
        return reg.connections.get(t.connection_id)
    for c in reg.by_provider.get(t.provider, ()):
        if c.serves(t.model):
            return c
    return None


def target_quota(standing: Standing) -> TargetQuota:
    """The strategies' picture of one standing: the tightest counter decides."""
    best: tuple[float, float, int] | None = None  # (remaining fraction, remaining, index)
    for i, st in enumerate(standing.status):
        if st.limit <= 0 or st.remaining is None:  # no limit, or not known (store unread)
            continue
        frac = max(0.0, min(1.0, st.remaining / st.limit))
        if best is None or frac < best[0]:
            best = (frac, st.remaining, i)
    blocked = standing.outcome is Outcome.BLOCK
    penalized = standing.outcome is Outcome.PENALIZE
    if best is None:
        return TargetQuota(soft_penalized=penalized, blocked=blocked)
    frac, remaining, i = best
    st, check, burn = standing.status[i], standing.checks[i], standing.burn_per_s[i]
    exhausts = None if burn <= 0 else int(remaining / burn * 1000)
    return TargetQuota(
        soft_penalized=penalized,
        blocked=blocked,
        remaining=frac,
        reset_in_ms=st.reset_ms,
        window_ms=check.window_ms,
        headroom=remaining,
        request_cost=check.cost,
        exhausts_in_ms=exhausts,
    )


def bucket_quota(buckets: Mapping[str, BucketState], now_ms: int) -> TargetQuota | None:
    """The provider's own picture of an account (no pool): its fullest window."""
    live = [b for b in buckets.values() if b.reset_ms is None or b.reset_ms > now_ms]
    if not live:
        return None
    worst = max(live, key=lambda b: b.used)
    remaining = max(0.0, 1.0 - worst.used)
    reset = None if worst.reset_ms is None else worst.reset_ms - now_ms
    return TargetQuota(blocked=worst.saturated, remaining=remaining, reset_in_ms=reset)


async def quota_view(
    engine: QuotaEngine,
    reg: Registry,
    buckets: Mapping[str, Mapping[str, BucketState]],
    key_id: str,
    cost: Callable[[Connection, str], Mapping[Unit, float]],
    targets: Sequence[Target],
    now_ms: int,
) -> QuotaView:
    """``buckets``: the provider's account buckets by connection id (only those it has);
    ``cost``: this request's estimated cost on a connection and model (as admission has it)."""
    standings: dict[tuple[str, str], Standing | None] = {}
    out: dict[str, TargetQuota] = {}
    for t in targets:
        conn = _connection(reg, t)
        if conn is None:
            continue
        pool: Pool | None = reg.pool_by_connection.get(conn.id)
        if pool is None:
            q = bucket_quota(buckets.get(conn.id, {}), now_ms)
            if q is not None:
                out[t.key] = q
            continue
        memo = (pool.id, t.model)
        if memo not in standings:
            standings[memo] = await engine.standing(
                pool, key_id, cost(conn, t.model), model=t.model
            )
        standing = standings[memo]
        if standing is not None:
            out[t.key] = target_quota(standing)
    return QuotaView(out)


def health_view(
    mgr: RateLimitManager | None, reg: Registry, targets: Sequence[Target]
) -> HealthView:
    if mgr is None:
        return HealthView()
    out: dict[str, TargetHealth] = {}
    for t in targets:
        conn = _connection(reg, t)
        cooling, locked = (
            (False, False) if conn is None else mgr.known_blocks(t.provider, conn.id, t.model)
        )
        out[t.key] = TargetHealth(
            breaker=mgr.breaker_state(t.provider), cooling=cooling, locked=locked
        )
    return HealthView(out)
