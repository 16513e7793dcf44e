"""Admission cost: µs per admit+settle for the pure decision, the SQLite driver in both modes
(``transactional``: a transaction per call; ``memory``: counters in memory, written behind) and
the Redis driver, and how it changes from 10 to 100,000 keys in a pool. Prints figures and the
memory mode's measured durability window (how long a change waited for its commit: what a
``kill -9`` could have lost); asserts nothing.

Run: ``make bench`` (or ``python benchmarks/admission.py [--quick]``). Uses the Redis at
``FAIRGATE_TEST_REDIS_URL`` (else 127.0.0.1:6379) under a unique key prefix it deletes afterwards.
Absolute numbers are this machine's; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import compile_checks, evaluate
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import QuotaStore, UsageItem
from fairgate.store.redis.store import SlowReply
from fairgate.store.sqlite.store import MAX_FLUSH_MS, SqliteQuotaStore

T0 = 1_700_002_800_000
COST = {Unit.REQUESTS: 1.0, Unit.TOKENS: 500.0}


def make_pool(n_keys: int) -> Pool:
    allocs = tuple(
        Allocation(f"k{i}", 100 / n_keys, policy=(Policy.HARD, Policy.SOFT, Policy.BURST)[i % 3])
        for i in range(n_keys)
    )
    return Pool(
        id=f"bench{n_keys}",
        name="bench",
        provider="kimi",
        connections=("c1",),
        dimensions=(
            Dimension(Unit.REQUESTS, Window.HOURLY, 1e12),
            Dimension(Unit.TOKENS, Window.FIVE_HOURS, 1e15),
        ),
        allocations=allocs,
    )


def bench_pure(pool: Pool, ops: int) -> float:
    rng = random.Random(1)
    keys = [a.key_id for a in pool.allocations]
    values = [(1e6, 10.0, 10.0), (1e9, 1e4, 1e4)]  # (pool total, key, key this window)
    start = time.perf_counter_ns()
    for _ in range(ops):
        alloc = pool.allocation(rng.choice(keys))
        assert alloc is not None
        checks = compile_checks(pool, alloc, COST)
        evaluate(checks, values, alloc.policy, 0.5)
    return (time.perf_counter_ns() - start) / ops / 1000


#: Records in flight during the prefill: the Redis store's pool size. More only queue (the
#: store admits as many calls as it has connections), and 100,000 coroutines at once would
#: each wait in that queue.
PREFILL_CONCURRENCY = 32
#: Tries of one prefill record whose reply this process read too late (``SlowReply``).
PREFILL_ATTEMPTS = 3


async def prefill(store: QuotaStore, pool: Pool) -> None:
    """One recorded use per key, so the counters of every key exist (as in a busy pool).

    The store's connections are opened first (``warm``), as the gateway does at start: the
    100,000-key prefill used to open a storm of connections at once and died in it with
    "Timeout connecting to server". On a busy host a batch of records can also come back
    later than the store waits (``SlowReply``, seen once in the 100,000-key prefill on a
    2-vCPU VM): such a record is sent again, and a prefill counted twice changes nothing
    that is measured."""
    await store.warm()
    sem = asyncio.Semaphore(PREFILL_CONCURRENCY)

    async def one(key: str) -> None:
        usage = [UsageItem(d.key, d.window_ms, 1.0) for d in pool.dimensions]
        async with sem:
            for attempt in range(1, PREFILL_ATTEMPTS + 1):
                try:
                    await store.record(pool.id, key, usage, T0)
                    return
                except SlowReply:  # this process read the reply late (a busy host): again
                    if attempt == PREFILL_ATTEMPTS:
                        raise

    await asyncio.gather(*(one(a.key_id) for a in pool.allocations))


#: CPU µs per admit+settle of the last :func:`bench_store` run (process-wide: every thread,
#: user and kernel time, so the write-behind commits and the WAL writes count). Less sensitive
#: to a busy host than wall-clock µs: time waiting for a core is not in it.
last_cpu_us = {"us": float("nan")}


async def bench_store(store: QuotaStore, pool: Pool, ops: int) -> tuple[float, float]:
    """Returns (mean µs per admit+settle, p99 µs) measured sequentially on one event loop;
    sets :data:`last_cpu_us`."""
    clock = ManualClock(T0 + 1000)
    engine = QuotaEngine(store, clock=clock)
    rng = random.Random(2)
    keys = [a.key_id for a in pool.allocations]
    samples: list[float] = []
    cpu0 = time.process_time()
    for _ in range(ops):
        key = rng.choice(keys)
        t = time.perf_counter_ns()
        adm = await engine.admit(pool, key, COST)
        await engine.settle(adm.ticket, COST)
        samples.append((time.perf_counter_ns() - t) / 1000)
        clock.advance(1)
        # the event loop turns between two requests, as in the gateway, where every request
        # waits on a socket: its timers (the memory mode's commit) run here, outside the
        # timed span but inside the CPU figure
        await asyncio.sleep(0)
    if hasattr(store, "flush"):
        await store.flush()  # the write-behind of these operations is their cost too
    last_cpu_us["us"] = (time.process_time() - cpu0) / ops * 1e6
    assert engine.fail_open_count == 0, "the benchmark must not measure fail-open"
    samples.sort()
    return statistics.fmean(samples), samples[int(len(samples) * 0.99) - 1]


async def redis_round_trips(url: str, prefix: str, pool: Pool, ops: int) -> tuple[float, float]:
    """(EVALSHA calls per admit = round trips, commands run inside the script per admit), from
    the server's INFO commandstats deltas."""
    import redis.asyncio as aioredis

    from fairgate.store.redis.store import RedisQuotaStore

    probe = aioredis.Redis.from_url(url)

    async def calls() -> tuple[int, int]:
        info = await probe.info("commandstats")
        total = sum(int(v["calls"]) for v in info.values() if isinstance(v, dict))
        return int(info.get("cmdstat_evalsha", {}).get("calls", 0)), total

    store = RedisQuotaStore(url, prefix=prefix)
    engine = QuotaEngine(store, clock=ManualClock(T0))
    await engine.admit(pool, pool.allocations[0].key_id, COST)  # load scripts first
    before = await calls()
    for i in range(ops):
        await engine.admit(pool, pool.allocations[i % len(pool.allocations)].key_id, COST)
    after = await calls()
    await store.close()
    await probe.aclose()
    evalsha = (after[0] - before[0]) / ops
    inside = (after[1] - before[1] - 1 - (after[0] - before[0])) / ops  # minus INFO and EVALSHA
    return evalsha, inside


async def cleanup(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    batch = [k async for k in r.scan_iter(match=f"{prefix}:*", count=2000)]
    for i in range(0, len(batch), 1000):
        await r.delete(*batch[i : i + 1000])
    await r.aclose()


Row = tuple[str, int, float, float]  # (path, keys, mean µs, p99 µs or nan)

SQLITE_TX = "sqlite admit+settle"
SQLITE_MEMORY = "sqlite memory a+s"


async def warm(store: QuotaStore, pool: Pool) -> None:
    """One admit+settle per key, untimed: the memory mode loads a key's buckets from the file
    on its first use, so the timed loop measures the steady state (as the transactional path's
    pages are already in SQLite's cache after the prefill)."""
    engine = QuotaEngine(store, clock=ManualClock(T0 + 500))
    for a in pool.allocations:
        adm = await engine.admit(pool, a.key_id, COST)
        await engine.settle(adm.ticket, COST)


async def redis_available(url: str) -> bool:
    try:
        from fairgate.store.redis.store import RedisQuotaStore

        probe = RedisQuotaStore(url, prefix=f"fgbench:{uuid.uuid4().hex[:8]}")
        ok = await probe.ping()
        await probe.close()
    except Exception:
        return False
    return bool(ok)


async def measure(
    sizes: list[int],
    ops: int,
    url: str,
    progress: bool = True,
    lags: list[tuple[int, dict[str, float]]] | None = None,
    cpu: dict[tuple[str, int], float] | None = None,
) -> tuple[list[Row], tuple[float, float] | None]:
    """Every row of the table, and Redis round trips per admit (None: Redis not reachable);
    ``lags`` receives the memory mode's durability figures per size, ``cpu`` the CPU µs per
    admit+settle of both SQLite modes per (path, keys).

    Callable from ``benchmarks/run_all.py``; nothing is printed but progress."""
    prefix = f"fgbench:{uuid.uuid4().hex[:8]}"
    have_redis = await redis_available(url)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            pool = make_pool(n)
            rows.append(("pure decision", n, bench_pure(pool, ops * 10), float("nan")))
            sqlite = SqliteQuotaStore(Path(tmp) / f"q{n}.sqlite", mode="transactional")
            await prefill(sqlite, pool)
            # the prefill is a burst of one transaction per key; give the background WAL
            # checkpoint a moment so we measure the steady state, not the burst's backlog
            await asyncio.sleep(1.0)
            mean, p99 = await bench_store(sqlite, pool, ops)
            rows.append((SQLITE_TX, n, mean, p99))
            if cpu is not None:
                cpu[(SQLITE_TX, n)] = last_cpu_us["us"]
            await sqlite.close()
            memory = SqliteQuotaStore(Path(tmp) / f"m{n}.sqlite", mode="memory")
            assert memory.mode == "memory"
            await prefill(memory, pool)
            await warm(memory, pool)
            await memory.flush()
            await asyncio.sleep(1.0)  # as above: the burst's checkpoint is not the steady state
            memory.durability(reset=True)
            mean, p99 = await bench_store(memory, pool, ops)
            rows.append((SQLITE_MEMORY, n, mean, p99))
            if cpu is not None:
                cpu[(SQLITE_MEMORY, n)] = last_cpu_us["us"]
            await asyncio.sleep(0.05)  # let the last rounds commit: their lag counts too
            if lags is not None:
                lags.append((n, memory.durability()))
            await memory.close()
            if have_redis:
                from fairgate.store.redis.store import RedisQuotaStore

                redis_store = RedisQuotaStore(url, prefix=prefix)
                await prefill(redis_store, pool)
                mean, p99 = await bench_store(redis_store, pool, ops)
                rows.append(("redis admit+settle", n, mean, p99))
                await redis_store.close()
            if progress:
                print(f"  measured {n:,} keys", flush=True)
        trips = await redis_round_trips(url, prefix, make_pool(10), 200) if have_redis else None
    if have_redis:
        await cleanup(url, prefix)
    return rows, trips


def _voluntary_switches(native_id: int) -> int:
    """How many times a thread of this process went to sleep (Linux ``/proc``)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


async def idle_and_handover(rounds: int = 5, idle_s: float = 2.0) -> tuple[float, list[float]]:
    """The memory mode's cost at rest and its handover latency: (wakeups per second of the
    write-behind watcher while nothing happens, measured from the kernel's count of the
    thread's sleeps; ms from a second opener's start until it has the file, one per round,
    the owner idle meanwhile). Wall-clock ms: noisy on a busy host, a ceiling more than a
    figure."""
    pool = make_pool(10)
    wakeups = float("nan")
    handovers: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(rounds):
            path = Path(tmp) / f"h{i}.sqlite"
            owner = SqliteQuotaStore(path, mode="memory")
            await warm(owner, pool)
            await owner.flush()
            await asyncio.sleep(0.1)
            if i == 0:
                (watcher,) = [t for t in threading.enumerate() if t.name == "fairgate-sqlite-flush"]
                assert watcher.native_id is not None
                before = _voluntary_switches(watcher.native_id)
                await asyncio.sleep(idle_s)
                wakeups = (_voluntary_switches(watcher.native_id) - before) / idle_s
            t0 = time.perf_counter()
            other = await asyncio.to_thread(SqliteQuotaStore, path, mode="transactional")
            handovers.append((time.perf_counter() - t0) * 1000.0)
            assert owner.mode == "transactional"
            await other.close()
            await owner.close()
    return wakeups, handovers


async def run_ops(mode: str, n_keys: int, ops: int) -> None:
    """(Under callgrind) prefill, warm, then ``ops`` admit+settle on one SQLite mode."""
    pool = make_pool(n_keys)
    with tempfile.TemporaryDirectory() as tmp:
        # Under valgrind the program runs ~50x slower, so a 5 ms write-behind would commit
        # after every operation or two instead of every ~100 as at full speed: commit once a
        # second instead (and at the close), i.e. the commit amortized over the run. The WAL
        # checkpoint thread (every second, slowed the same way) is left out; the writers'
        # own checkpoints stay.
        store = SqliteQuotaStore(
            Path(tmp) / "q.sqlite", mode=mode, flush_ms=MAX_FLUSH_MS, checkpoint_interval_s=0
        )
        await prefill(store, pool)
        await warm(store, pool)
        if ops:
            await bench_store(store, pool, ops)
        await store.close()


#: The two run lengths whose instruction counts are subtracted: what is left is the cost of
#: (high - low) admit+settle, start-up, prefill and the close cancelled out.
CALLGRIND_OPS = (200, 1200)


def instructions_per_op(mode: str, n_keys: int) -> float | None:
    """Instructions per admit+settle (all threads: the write-behind commits count too), from
    two callgrind runs; None without valgrind. Load-independent, unlike wall-clock µs."""
    if shutil.which("valgrind") is None:
        return None
    counts: list[int] = []
    for ops in CALLGRIND_OPS:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--run-ops",
            mode,
            str(n_keys),
            str(ops),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            return None
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (CALLGRIND_OPS[1] - CALLGRIND_OPS[0])


def print_instructions(sizes: list[int]) -> None:
    print("\ninstructions per admit+settle (callgrind, all threads):")
    for n in sizes:
        tx = instructions_per_op("transactional", n)
        mem = instructions_per_op("memory", n)
        if tx is None or mem is None:
            print("  valgrind not installed: not measured")
            return
        print(f"  {n:>7,} keys: transactional {tx:>10,.0f}, memory {mem:>9,.0f} ({tx / mem:.1f}x)")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer ops and keys (a smoke run)")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="also count instructions per SQLite admit+settle (valgrind; minutes)",
    )
    ap.add_argument("--run-ops", nargs=3, metavar=("MODE", "KEYS", "OPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_ops:
        mode, n_keys, n_ops = args.run_ops
        await run_ops(mode, int(n_keys), int(n_ops))
        return
    sizes = [10, 1000, 10_000] if args.quick else [10, 1000, 100_000]
    ops = 500 if args.quick else 3000
    url = os.environ.get("FAIRGATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
    lags: list[tuple[int, dict[str, float]]] = []
    cpu: dict[tuple[str, int], float] = {}
    rows, trips = await measure(sizes, ops, url, lags=lags, cpu=cpu)

    print()
    print(f"{'path':<22} {'keys':>8} {'mean µs':>9} {'p99 µs':>9} {'vs 10 keys':>11}")
    base: dict[str, float] = {}
    for name, n, mean, p99 in rows:
        base.setdefault(name, mean)
        p99s = "" if math.isnan(p99) else f"{p99:9.1f}"
        print(f"{name:<22} {n:>8,} {mean:9.1f} {p99s:>9} {mean / base[name]:10.2f}x")
    by = {(name, n): mean for name, n, mean, _ in rows}
    print()
    for n in sizes:
        tx, mem = by[(SQLITE_TX, n)], by[(SQLITE_MEMORY, n)]
        ctx, cmem = cpu[(SQLITE_TX, n)], cpu[(SQLITE_MEMORY, n)]
        print(
            f"sqlite at {n:>7,} keys: transactional {tx:7.1f} µs ({ctx:6.1f} µs CPU), "
            f"memory {mem:6.1f} µs ({cmem:5.1f} µs CPU): {tx / mem:.1f}x wall, "
            f"{ctx / cmem:.1f}x CPU"
        )
    for n, d in lags:
        print(
            f"memory mode at {n:>7,} keys: a change waited for its commit "
            f"p50 {d['p50_lag_ms']:.1f} ms, p99 {d['p99_lag_ms']:.1f} ms, "
            f"max {d['max_lag_ms']:.1f} ms over {d['commits']:.0f} commits "
            f"(flush interval 5 ms; failed commits {d['failed_commits']:.0f})"
        )
    wakeups, handovers = await idle_and_handover()
    handovers.sort()
    print(
        f"memory mode at rest: the write-behind watcher wakes {wakeups:.1f} times a second; "
        f"a second process gets the file in {statistics.median(handovers):.1f} ms median, "
        f"{handovers[-1]:.1f} ms max over {len(handovers)} handovers"
    )
    if trips is not None:
        print(
            f"\nredis round trips (EVALSHA) per admit: {trips[0]:.2f}; "
            f"commands run inside the script per admit: {trips[1]:.1f}"
        )
    else:
        print("\nredis: not reachable, driver not measured")
    print(
        "targets: pure ≤ 20 µs, sqlite admit+settle ≤ 150 µs (memory mode ≤ 60 µs), "
        "redis 1 round trip per admit, "
        "100,000 keys within 1.3x of 10 keys"
    )
    if args.callgrind:
        print_instructions([10, 1000])


if __name__ == "__main__":
    asyncio.run(main())
