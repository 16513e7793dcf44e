"""Provider-anchored windows on the hot path: µs per admit+settle of a Codex-like pool
(``percent/5h`` and ``percent/weekly``) whose windows follow the provider's reset, against the
same pool with ``window_anchor: epoch`` (issue 12). Prints figures; asserts nothing.

Run: ``python benchmarks/anchored_admission.py`` (add ``REDIS_URL=redis://…`` for the Redis
driver too; ``BENCH_N``, ``BENCH_ROUNDS`` and ``BENCH_ONLY=sqlite:provider`` for instruction
counts under ``valgrind --tool=callgrind``, one case per process, the difference of two ``N``
removing the start-up). The clock advances 1 ms per admission, so the engine re-reads the
pool's anchors once per ``active_refresh_ms`` (1 s), i.e. once per 1,000 admissions, as at
1,000 requests a second. Also counted: the store calls per admission (an anchored admission
adds none).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window, WindowAnchor
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Pool
from fairgate.quota.ports import QuotaStore
from fairgate.store.sqlite.store import SqliteQuotaStore

T0 = 1_782_297_000_000
N = int(os.environ.get("BENCH_N", "3000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
#: ``sqlite:epoch`` and the like: run that case alone (one process per case under callgrind)
ONLY = os.environ.get("BENCH_ONLY")
COST = {Unit.PERCENT: 0.001, Unit.REQUESTS: 1.0}


def make_pool(anchor: WindowAnchor) -> Pool:
    return Pool(
        id=f"codex-{anchor.value}",
        name="codex",
        provider="codex",
        connections=("codex-1", "codex-2"),
        dimensions=(
            Dimension(Unit.PERCENT, Window.FIVE_HOURS, 100, anchor),
            Dimension(Unit.PERCENT, Window.WEEKLY, 100, anchor),
        ),
        allocations=tuple(Allocation(f"k{i}", 0) for i in range(3)),
    )


class Counting:
    """Counts the store calls the engine makes (a transparent proxy)."""

    def __init__(self, inner: QuotaStore) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kw)

        return call


async def run(store: QuotaStore, anchor: WindowAnchor) -> tuple[float, dict[str, int]]:
    clock = ManualClock(T0)
    counting = Counting(store)
    engine = QuotaEngine(counting, clock=clock)
    pool = make_pool(anchor)
    for counter, w in (("percent/5h", Window.FIVE_HOURS.ms), ("percent/weekly", Window.WEEKLY.ms)):
        await engine.anchor(pool, counter, w, T0 + w // 3, "codex-1")
    counting.calls.clear()
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for i in range(N):
            adm = await engine.admit(pool, f"k{i % 3}", COST)
            await engine.settle(adm.ticket, {Unit.PERCENT: 0.0, Unit.REQUESTS: 1.0})
            clock.advance(1)
        times.append((time.perf_counter() - t) / N * 1e6)
    return statistics.median(times), dict(counting.calls)


async def main() -> None:
    stores: list[tuple[str, Any]] = []
    tmp = tempfile.mkdtemp()
    stores.append(("sqlite", lambda: SqliteQuotaStore(Path(tmp) / "q.sqlite")))
    url = os.environ.get("REDIS_URL")
    if url:
        from fairgate.store.redis.store import RedisQuotaStore

        stores.append(("redis", lambda: RedisQuotaStore(url, prefix=f"bench{os.getpid()}")))
    print(f"admit+settle, {N} × {ROUNDS} rounds, median µs per admission")
    print(f"{'driver':8} {'windows':9} {'µs':>8}  store calls per admission")
    for name, make in stores:
        for anchor in (WindowAnchor.EPOCH, WindowAnchor.PROVIDER):
            if ONLY and f"{name}:{anchor.value}" != ONLY:
                continue
            store = make()
            try:
                us, calls = await run(store, anchor)
                if name == "redis":
                    await store.clear(make_pool(anchor).id)
            finally:
                await store.close()
            total = N * ROUNDS
            per = ", ".join(f"{k} {v / total:.4f}" for k, v in sorted(calls.items()))
            print(f"{name:8} {anchor.value:9} {us:8.1f}  {per}")


if __name__ == "__main__":
    asyncio.run(main())
