"""The quota engine: admit → (the caller executes) → settle or release, failing open.

The engine is the thin orchestration between the pure decision (``decision.py``) and a
``QuotaStore``. It owns no counters itself; what it keeps in memory (the active-set cache and the
burn-rate samples) is bounded per pool and only an optimisation or a view.

Fail-open: quota sharing exists to keep clients served, so an engine or store fault must never turn
into an outage. Any exception in ``admit`` allows the request, logs a warning and counts it in
``fail_open_count``; settle/release faults are logged and counted in ``store_errors``.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.quota.burn import BurnSeries
from fairgate.quota.decision import (
    DimensionCheck,
    Outcome,
    Reason,
    active_levels,
    compile_checks,
    retry_after_ms,
)
from fairgate.quota.model import Allocation, Policy, Pool, ShareMode
from fairgate.quota.settings import QuotaSettings
from fairgate.quota.units import Unit
from fairgate.quota.usage import PoolUsage, build_usage
from fairgate.quota.window import Count, bucket_index
from fairgate.store.base import AdmitRequest, CounterRef, QuotaStore, UsageItem

log = logging.getLogger("fairgate.quota")

SignalSource = Callable[[Pool], Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class Ticket:
    """What settle/release need to find the reservation again."""

    pool_id: str
    key_id: str
    reservation_id: str
    checks: tuple[DimensionCheck, ...]


@dataclass(frozen=True, slots=True)
class DimensionStatus:
    """The key's standing on one counter, for ``x-ratelimit-*`` headers."""

    key: str
    unit: str
    limit: float
    remaining: float
    reset_ms: int


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: Outcome
    reason: Reason | None = None
    dimension: str | None = None
    retry_after_ms: int | None = None
    ticket: Ticket | None = None
    status: tuple[DimensionStatus, ...] = ()
    fail_open: bool = False

    @property
    def allowed(self) -> bool:
        return self.outcome is not Outcome.BLOCK

    @property
    def penalized(self) -> bool:
        return self.outcome is Outcome.PENALIZE


ALLOW_UNGOVERNED = Admission(Outcome.ALLOW)


def _status(
    checks: tuple[DimensionCheck, ...],
    totals: tuple[Count, ...],
    mine: tuple[Count, ...],
    now_ms: int,
    threshold: float,
    reserved: bool,
) -> tuple[DimensionStatus, ...]:
    """Remaining = what this key could still use now: its share in strict mode, the pool's free
    room in generous mode (never more than the pool has left)."""
    out: list[DimensionStatus] = []
    for c, t, m in zip(checks, totals, mine, strict=True):
        w = c.window_ms
        total = t.value(now_ms, w) + (c.cost if reserved and c.scope == "pool" else 0.0)
        used = m.value(now_ms, w) + (c.cost if reserved else 0.0)
        if c.scope == "model":
            limit, remaining = c.limit, c.limit - used
        else:
            strict = max(total / c.limit, c.signal) >= threshold
            limit = c.fair_share if strict else c.limit
            remaining = min(c.limit - total, limit - used)
            if c.cap is not None:
                limit, remaining = min(limit, c.cap), min(remaining, c.cap - used)
        reset = (bucket_index(now_ms, w) + 1) * w - now_ms
        out.append(DimensionStatus(c.key, c.unit.value, limit, max(0.0, remaining), reset))
    return tuple(out)


def _id_source() -> Callable[[], str]:
    """Reservation ids: a random per-engine prefix and a counter. Unique across processes and
    restarts (the prefix), and a tenth of the cost of a uuid4 per admission."""
    prefix = uuid.uuid4().hex[:16]
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):x}"


class QuotaEngine:
    def __init__(
        self,
        store: QuotaStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        settings: QuotaSettings | None = None,
        signals: SignalSource | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings or QuotaSettings()
        self.signals = signals
        self._new_id = new_id or _id_source()
        self._active: dict[str, tuple[int, frozenset[str], dict[str, float]]] = {}
        self._burn: dict[tuple[str, str], BurnSeries] = {}
        self.fail_open_count = 0
        self.store_errors = 0
        self.last_error: str | None = None

    # -- hot path -------------------------------------------------------------------------

    async def admit(
        self,
        pool: Pool,
        key_id: str,
        cost: Mapping[Unit, float],
        *,
        model: str | None = None,
    ) -> Admission:
        try:
            return await self._admit(pool, key_id, cost, model)
        except Exception as exc:  # fail-open is the contract, whatever broke
            self.fail_open_count += 1
            self.last_error = type(exc).__name__
            log.warning(
                "quota admit failed; allowing (fail-open)",
                extra={"pool": pool.id, "error": type(exc).__name__},
            )
            return Admission(Outcome.ALLOW, fail_open=True)

    async def _admit(
        self, pool: Pool, key_id: str, cost: Mapping[Unit, float], model: str | None
    ) -> Admission:
        alloc = pool.allocation(key_id) or Allocation(key_id, 0.0, policy=Policy.HARD)
        now = self.clock.now_ms()
        levels = None
        if pool.share_mode is ShareMode.ACTIVE:
            levels = await self._active_levels(pool, key_id, now)
        signals = self.signals(pool) if self.signals else None
        checks = compile_checks(pool, alloc, cost, model=model, signals=signals, levels=levels)
        if not checks:
            return ALLOW_UNGOVERNED
        threshold = self.settings.saturation_threshold
        req = AdmitRequest(
            pool_id=pool.id,
            key_id=key_id,
            checks=checks,
            policy=alloc.policy,
            threshold=threshold,
            reservation_id=self._new_id(),
            now_ms=now,
            lease_ms=self.settings.lease_ms,
        )
        res = await self.store.admit(req)
        status = _status(checks, res.totals, res.mine, now, threshold, res.reserved)
        v = res.verdict
        if v.outcome is Outcome.BLOCK:
            assert v.reason is not None
            assert v.index is not None
            check = checks[v.index]
            wait = retry_after_ms(
                check, v.reason, res.totals[v.index], res.mine[v.index], now, threshold
            )
            return Admission(v.outcome, v.reason, check.key, wait, None, status)
        ticket = Ticket(pool.id, key_id, req.reservation_id, checks)
        return Admission(v.outcome, ticket=ticket, status=status)

    async def settle(self, ticket: Ticket | None, actual: Mapping[Unit, float]) -> None:
        if ticket is None:
            return
        now = self.clock.now_ms()
        usage = [
            UsageItem(c.key, c.window_ms, float(actual.get(c.unit, 0.0)), c.scope)
            for c in ticket.checks
        ]
        try:
            await self.store.settle(
                ticket.pool_id, ticket.key_id, ticket.reservation_id, usage, now
            )
            await self._maybe_sample(ticket.pool_id, ticket.checks, now)
        except Exception as exc:
            self._store_error("settle", exc)

    async def release(self, ticket: Ticket | None) -> None:
        if ticket is None:
            return
        try:
            await self.store.release(ticket.pool_id, ticket.reservation_id, self.clock.now_ms())
        except Exception as exc:
            self._store_error("release", exc)

    async def record(self, pool: Pool, key_id: str, amounts: Mapping[Unit, float]) -> None:
        """Charge use that had no reservation (percent attribution after a provider reading)."""
        usage = [
            UsageItem(d.key, d.window_ms, float(amounts[d.unit]))
            for d in pool.enforced_dimensions()
            if amounts.get(d.unit)
        ]
        if not usage:
            return
        try:
            await self.store.record(pool.id, key_id, usage, self.clock.now_ms())
        except Exception as exc:
            self._store_error("record", exc)

    # -- views ----------------------------------------------------------------------------

    async def usage(self, pool: Pool) -> PoolUsage:
        now = self.clock.now_ms()
        refs = [CounterRef(d.key, d.window_ms) for d in pool.dimensions]
        counts = await self.store.pool_usage(
            pool.id, [a.key_id for a in pool.allocations], refs, now
        )
        await self._sample(pool.id, [d.key for d in pool.dimensions], now)
        rates = {
            d.key: self._burn[(pool.id, d.key)].rate()
            for d in pool.dimensions
            if (pool.id, d.key) in self._burn
        }
        signals = self.signals(pool) if self.signals else None
        return build_usage(
            pool,
            counts.totals,
            counts.per_key,
            now,
            self.settings.saturation_threshold,
            rates,
            signals,
        )

    def burn_samples(self, pool_id: str, counter: str) -> BurnSeries | None:
        return self._burn.get((pool_id, counter))

    async def forget_pool(self, pool_id: str) -> None:
        """Pool deleted: drop its counters and everything cached about it."""
        await self.store.clear(pool_id)
        self._active.pop(pool_id, None)
        for k in [k for k in self._burn if k[0] == pool_id]:
            del self._burn[k]

    async def gc(self) -> int:
        return await self.store.gc(self.clock.now_ms(), self.settings.retention_ms)

    # -- internals ------------------------------------------------------------------------

    async def _active_levels(self, pool: Pool, key_id: str, now: int) -> dict[str, float]:
        """The active set changes slowly; refresh it (and its water-filling levels) at most once
        per ``active_refresh_ms`` so the hot path stays O(checks), not O(active keys). A key not
        in the cached set forces a refresh: its arrival changes everyone's share."""
        cached = self._active.get(pool.id)
        if (
            cached is not None
            and now - cached[0] < self.settings.active_refresh_ms
            and key_id in cached[1]
        ):
            return cached[2]
        keys = set(await self.store.active_keys(pool.id, now - pool.active_window_ms))
        keys.add(key_id)
        levels = active_levels(pool, sorted(keys))
        self._active[pool.id] = (now, frozenset(keys), levels)
        return levels

    async def _maybe_sample(
        self, pool_id: str, checks: tuple[DimensionCheck, ...], now: int
    ) -> None:
        keys = [c.key for c in checks if c.scope == "pool"]
        if any(self._series(pool_id, k).due(now) for k in keys):
            await self._sample(pool_id, keys, now)

    async def _sample(self, pool_id: str, keys: list[str], now: int) -> None:
        values = await self.store.cumulative(pool_id, keys)
        for k in keys:
            self._series(pool_id, k).add(now, values.get(k, 0.0))

    def _series(self, pool_id: str, key: str) -> BurnSeries:
        s = self._burn.get((pool_id, key))
        if s is None:
            s = self._burn[(pool_id, key)] = BurnSeries()
        return s

    def _store_error(self, op: str, exc: Exception) -> None:
        self.store_errors += 1
        self.last_error = type(exc).__name__
        log.warning("quota %s failed", op, extra={"error": type(exc).__name__})
