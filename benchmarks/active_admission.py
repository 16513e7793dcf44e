"""Active-mode admission cost: µs per admit+settle on SQLite with keys waiting, and the cost of
one refresh's reserves (issue 17). Prints figures; asserts nothing.

Run: ``python benchmarks/active_admission.py``. A pool of N keys in ``active`` mode with a tight
limit, so keys are refused (pressed) and room is held for them; the clock advances 1 ms per
admission, so the active set is refreshed once per 1,000 admissions, as at 1,000 requests a
second. The refresh row times the pure reserve computation alone (``waiting_reserves`` and
``pace_reserves``, where present) over N keys, half of them waiting.
"""

from __future__ import annotations

import asyncio
import importlib
import random
import statistics
import tempfile
import time
from pathlib import Path

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Pool, ShareMode
from fairgate.quota.window import Count
from fairgate.store.sqlite.store import SqliteQuotaStore

T0 = 1_700_002_800_000
COST = {Unit.REQUESTS: 1.0}


def make_pool(n: int) -> Pool:
    return Pool(
        id=f"active{n}",
        name="active",
        provider="mock",
        connections=("c",),
        dimensions=(Dimension(Unit.REQUESTS, Window.HOURLY, 20 * n),),
        allocations=tuple(Allocation(f"k{i}", 1 + i % 10) for i in range(n)),
        share_mode=ShareMode.ACTIVE,
    )


async def bench_admit(n: int, ops: int) -> tuple[float, float]:
    pool = make_pool(n)
    rng = random.Random(3)
    keys = [a.key_id for a in pool.allocations]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteQuotaStore(Path(tmp) / "q.sqlite")
        clock = ManualClock(T0 + 1000)
        engine = QuotaEngine(store, clock=clock)
        samples: list[float] = []
        for _ in range(ops):
            key = rng.choice(keys)
            t = time.perf_counter_ns()
            adm = await engine.admit(pool, key, COST)
            if adm.allowed:
                await engine.settle(adm.ticket, COST)
            samples.append((time.perf_counter_ns() - t) / 1000)
            clock.advance(1)
        await store.close()
    samples.sort()
    return statistics.fmean(samples), samples[int(len(samples) * 0.99) - 1]


def bench_refresh(n: int, reps: int) -> float | None:
    decision = importlib.import_module("fairgate.quota.decision")
    waiting_reserves = getattr(decision, "waiting_reserves", None)
    if waiting_reserves is None:
        return None
    pace = getattr(decision, "pace_reserves", None)
    view = getattr(decision, "Waiting", None)
    pool = make_pool(n)
    keys = [a.key_id for a in pool.allocations]
    dim = pool.dimensions[0].key
    rng = random.Random(4)
    used = {k: {dim: Count(prev=0.0, curr=float(rng.randint(0, 40)))} for k in keys}
    totals = {dim: Count(prev=0.0, curr=sum(u[dim].curr for u in used.values()))}
    waiting = set(keys[::2])
    start = time.perf_counter_ns()
    for _ in range(reps):
        args = (pool, {dim: 3.0}, keys, waiting, used, T0 + 600_000)
        # since the Waiting view, the arguments travel as one value; older trees take them apart
        r = waiting_reserves(view(*args)) if view is not None else waiting_reserves(*args)
        if pace is not None:
            pace(pool, keys[: n - 1], used, totals, T0 + 600_000, 0.5, r)
    return (time.perf_counter_ns() - start) / reps / 1000


async def main() -> None:
    print(f"{'path':<34} {'keys':>6} {'mean µs':>9} {'p99 µs':>9}")
    for n in (40, 1000):
        mean, p99 = await bench_admit(n, 4000)
        print(f"{'sqlite active admit+settle':<34} {n:>6} {mean:9.1f} {p99:9.1f}")
        per = bench_refresh(n, 20)
        if per is not None:
            print(f"{'reserves, one refresh (pure)':<34} {n:>6} {per:9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
