"""Properties of the engine over a real SQLite store (hypothesis drives the sequences).

- the pool total never exceeds the limit by more than the last request's estimation error;
- with exact costs (requests) nothing ever overshoots, even with many requests in flight;
- an absolute cap always holds (to within the one request that crossed it);
- in ``active`` mode a lone active key can reach ≥ 99 % of the pool.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Policy, Pool, ShareMode
from fairgate.quota.outcomes import Ticket
from fairgate.quota.ports import CounterRef
from fairgate.quota.window import Count
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import make_pool

T0 = 1_700_002_800_000
HOUR = 3_600_000
KEYS = ("a", "b", "c")
PROFILE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _pool(
    limit_tokens: float,
    policies: list[Policy],
    weights: list[float],
    cap: float | None = None,
    mode: ShareMode = ShareMode.STATIC,
) -> Pool:
    allocs = tuple(
        Allocation(
            k,
            w,
            policy=p,
            cap_value=cap if k == "a" else None,
            cap_unit=Unit.TOKENS if cap else None,
        )
        for k, w, p in zip(KEYS, weights, policies, strict=True)
    )
    return make_pool(
        Dimension(Unit.TOKENS, Window.HOURLY, limit_tokens),
        Dimension(Unit.REQUESTS, Window.HOURLY, 50),
        allocations=allocs,
        id="prop",
        provider="mock",
        connections=("c1",),
        share_mode=mode,
    )


async def _total(engine: QuotaEngine, pool: Pool, key: str, now: int) -> float:
    dims = [CounterRef(d.key, d.window_ms) for d in pool.dimensions]
    usage = await engine.store.pool_usage(pool.id, [], dims, now)
    return usage.totals.get(key, Count()).value(now, HOUR)


step = st.tuples(
    st.sampled_from(KEYS),
    st.integers(1, 400),  # estimate (tokens)
    st.floats(0.0, 2.0),  # actual / estimate
    st.booleans(),  # fail (release) instead of settle
    st.integers(0, 600_000),  # ms until the next step
)


@asynccontextmanager
async def _engine() -> AsyncIterator[tuple[QuotaEngine, ManualClock]]:
    """An engine on a fresh SQLite store in a temporary directory, and its clock at ``T0``
    (one per hypothesis example: a pytest fixture would be shared across the examples)."""
    with tempfile.TemporaryDirectory() as tmp:
        clock = ManualClock(T0)
        store = SqliteQuotaStore(Path(tmp) / "q.sqlite")
        try:
            yield QuotaEngine(store, clock=clock), clock
        finally:
            await store.close()


@PROFILE
@given(
    steps=st.lists(step, min_size=1, max_size=60),
    policies=st.lists(st.sampled_from(list(Policy)), min_size=3, max_size=3),
    weights=st.lists(st.floats(0, 100), min_size=3, max_size=3),
    limit=st.integers(200, 5000),
)
def test_total_never_exceeds_limit_by_more_than_last_estimation_error(
    steps: list[tuple[str, int, float, bool, int]],
    policies: list[Policy],
    weights: list[float],
    limit: int,
) -> None:
    async def run() -> None:
        async with _engine() as (engine, clock):
            pool = _pool(limit, policies, weights)
            # the error of the last admitted request: an admission needs total + cost <= limit,
            # so only that request's under-estimate can have pushed the total past the limit
            error = 0.0
            for key, estimate, ratio, fail, gap in steps:
                adm = await engine.admit(pool, key, {Unit.TOKENS: estimate, Unit.REQUESTS: 1})
                assert not adm.fail_open
                if adm.allowed:
                    error = 0.0
                    actual = round(estimate * ratio)
                    if fail:
                        await engine.release(adm.ticket)
                    else:
                        await engine.settle(adm.ticket, {Unit.TOKENS: actual, Unit.REQUESTS: 1})
                        error = max(0.0, actual - estimate)
                now = clock.now_ms()
                assert await _total(engine, pool, "tokens/hourly", now) <= limit + error + 1e-6
                assert await _total(engine, pool, "requests/hourly", now) <= 50 + 1e-9
                clock.advance(gap)

    asyncio.run(run())


@PROFILE
@given(
    order=st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=5, max_size=120),
    policies=st.lists(st.sampled_from(list(Policy)), min_size=3, max_size=3),
)
def test_exact_costs_never_overshoot_with_requests_in_flight(
    order: list[tuple[str, bool]], policies: list[Policy]
) -> None:
    async def run() -> None:
        async with _engine() as (engine, clock):
            pool = _pool(1e9, policies, [50, 30, 20])
            in_flight: list[Ticket] = []
            for key, finish_one in order:
                adm = await engine.admit(pool, key, {Unit.REQUESTS: 1})
                if adm.ticket is not None:
                    in_flight.append(adm.ticket)
                if finish_one and in_flight:
                    await engine.settle(in_flight.pop(0), {Unit.REQUESTS: 1})
                total = await _total(engine, pool, "requests/hourly", clock.now_ms())
                assert total <= 50 + 1e-9
                clock.advance(1000)

    asyncio.run(run())


@PROFILE
@given(
    cap=st.integers(1, 2000),
    costs=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    policy=st.sampled_from(list(Policy)),
)
def test_cap_always_holds(cap: int, costs: list[int], policy: Policy) -> None:
    async def run() -> None:
        async with _engine() as (engine, clock):
            pool = _pool(1e9, [policy, Policy.HARD, Policy.HARD], [90, 5, 5], cap=cap)
            biggest = 0
            for cost in costs:
                before = await engine.store.peek(
                    pool.id, "a", [CounterRef("tokens/hourly", HOUR)], clock.now_ms()
                )
                used = before["tokens/hourly"].value(clock.now_ms(), HOUR)
                adm = await engine.admit(pool, "a", {Unit.TOKENS: cost, Unit.REQUESTS: 0})
                assert adm.allowed == (used < cap)
                if adm.allowed:
                    await engine.settle(adm.ticket, {Unit.TOKENS: cost})
                    biggest = max(biggest, cost)
                after = await engine.store.peek(
                    pool.id, "a", [CounterRef("tokens/hourly", HOUR)], clock.now_ms()
                )
                # only the one request that crossed the cap can take the key past it
                assert after["tokens/hourly"].value(clock.now_ms(), HOUR) < cap + biggest
                clock.advance(10)

    asyncio.run(run())


@PROFILE
@given(
    weights=st.lists(st.floats(1, 100), min_size=3, max_size=3),
    lone=st.sampled_from(KEYS),
    limit=st.integers(100, 400),
)
def test_active_mode_lone_key_reaches_99_percent(
    weights: list[float], lone: str, limit: int
) -> None:
    async def run() -> None:
        async with _engine() as (engine, clock):
            pool = make_pool(
                Dimension(Unit.REQUESTS, Window.HOURLY, limit),
                allocations=tuple(Allocation(k, w) for k, w in zip(KEYS, weights, strict=True)),
                id="act",
                provider="mock",
                connections=("c1",),
                share_mode=ShareMode.ACTIVE,
            )
            admitted = 0
            for _ in range(limit + 5):
                adm = await engine.admit(pool, lone, {Unit.REQUESTS: 1})
                if adm.allowed:
                    admitted += 1
                    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
                clock.advance(5)
            assert admitted >= 0.99 * limit

    asyncio.run(run())
