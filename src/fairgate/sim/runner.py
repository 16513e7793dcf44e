"""Run a scenario under every policy on the same workload and collect the figures.

The model of a client, tick by tick: a key's new requests join its queue (at most ``backlog``
wait; older ones are dropped); within a tick every queued request of every key is tried once, in
a seeded random interleaving spread evenly over the tick's simulated time, and a key that is
refused stops for the rest of the tick (it backs off, as a client does on a 429) and tries its
queue again next tick. Admitted requests are settled at once with their actual use, so the
counters hold real usage and overshoot is measured on it.

Determinism: the workload and the interleaving come from the seed only, the engine reads only
the :class:`~fairgate.clock.ManualClock`, and reservation ids do not influence decisions, so a
seed gives the same figures on every run and either driver.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
import time
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from rich.progress import Progress

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit
from fairgate.quota.ports import QuotaStore
from fairgate.quota.window import bucket_index
from fairgate.sim.fairness import (
    CapTimes,
    LongerWindow,
    Metrics,
    WindowFigures,
    dominant_window_figures,
    summarize,
)
from fairgate.sim.policies import (
    ENGINE_POLICIES,
    POLICY_NAMES,
    POOL,
    EnginePolicy,
    FcfsPolicy,
    FixedPolicy,
    Ledger,
    SimPolicy,
)
from fairgate.sim.scenario import Scenario
from fairgate.sim.workload import Request, Workload, generate

#: An hour-aligned instant; each run starts at the next boundary of its primary window, so the
#: measurement windows are the counters' own buckets.
EPOCH_MS = 1_700_000_000_000
#: Points per key in the usage-over-time series (for the chart).
SERIES_POINTS = 240

DRIVERS = ("sqlite", "redis")


class SimError(RuntimeError):
    """The simulation could not run (store unreachable, engine failing open)."""


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    metrics: Metrics
    #: sample times in hours since the start, and each key's sliding-window use of the primary
    #: dimension at those times
    times_h: list[float]
    usage: dict[str, list[float]]
    wall_s: float
    admissions: int
    windows: list[WindowFigures] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: Scenario
    seed: int
    driver: str
    windows: int
    capacity: float
    shares: dict[str, float]
    runs: dict[str, PolicyRun] = field(default_factory=dict)


def start_ms(scenario: Scenario) -> int:
    """The first instant after :data:`EPOCH_MS` on a boundary of every dimension's window
    (their least common multiple: 1 h for hourly dimensions, 840 h for 5-hour beside weekly),
    so the measurement windows are the counters' own buckets and a longer dimension's bucket
    starts with the run."""
    w = math.lcm(*(d.window.ms for d in scenario.pool.dimensions))
    return (EPOCH_MS // w + 1) * w


def measured_dimensions(scenario: Scenario) -> dict[str, Unit]:
    """The dimensions fairness and utilisation are measured on, by name: the primary one and
    every other of the same or a longer window (the dominant-resource-fair ideal spans them,
    a longer one across the windows of each of its buckets); a dimension of a shorter window
    (hourly beside a daily primary) is checked for overshoot only."""
    w = scenario.primary.window.ms
    return {
        f"{d.unit.value}/{d.window.value}": d.unit
        for d in scenario.pool.dimensions
        if d.window.ms >= w
    }


def longer_windows(scenario: Scenario, n_windows: int) -> dict[str, LongerWindow]:
    """The measured dimensions of a longer window than the primary's, with the bucket each
    measurement window starts in (:class:`~fairgate.sim.fairness.LongerWindow`)."""
    start, w = start_ms(scenario), scenario.primary.window.ms
    run = scenario.ticks * scenario.tick
    covers = [Fraction(max(0, min(w, run - i * w)), w) for i in range(n_windows)]
    return {
        f"{d.unit.value}/{d.window.value}": LongerWindow(
            buckets=[bucket_index(start + i * w, d.window.ms) for i in range(n_windows)],
            per_window=Fraction(w, d.window.ms),
            covers=covers,
        )
        for d in scenario.pool.dimensions
        if d.window.ms > w
    }


def window_count(scenario: Scenario) -> int:
    w = scenario.primary.window.ms
    return max(1, -(-scenario.ticks * scenario.tick // w))


async def _open_store(
    driver: str, data_dir: Path, name: str, redis_url: str | None
) -> tuple[QuotaStore, str | None]:
    """A store for one scenario (and the Redis prefix to clean up afterwards)."""
    if driver == "sqlite":
        from fairgate.store.sqlite import SqliteQuotaStore

        os.makedirs(data_dir, exist_ok=True)  # a blocking call, once per scenario
        return SqliteQuotaStore(data_dir / f"{name}.sqlite"), None
    if driver != "redis":
        raise SimError(f"unknown driver {driver!r} (use sqlite or redis)")
    from fairgate.store.redis import RedisQuotaStore

    url = redis_url or "redis://127.0.0.1:6379/0"
    prefix = f"fgsim-{uuid.uuid4().hex[:12]}"
    store = RedisQuotaStore(url, prefix=prefix)
    try:
        ok = await store.ping()
    except Exception:
        ok = False
    if not ok:
        await store.close()
        raise SimError(f"redis is not reachable at {url.rsplit('@', 1)[-1]}")
    return store, prefix


async def run_scenario(
    scenario: Scenario,
    *,
    seed: int = 1,
    driver: str = "sqlite",
    policies: Sequence[str] = POLICY_NAMES,
    data_dir: Path | None = None,
    redis_url: str | None = None,
    progress: Progress | None = None,
) -> ScenarioResult:
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        raise SimError(f"unknown policies {unknown} (known: {', '.join(POLICY_NAMES)})")
    workload = generate(scenario, seed)
    members = scenario.pool.members
    result = ScenarioResult(
        scenario=scenario,
        seed=seed,
        driver=driver,
        windows=window_count(scenario),
        capacity=scenario.primary.limit * members,
        shares={k.id: scenario.share_limit(k.id) for k in scenario.keys},
    )
    with tempfile.TemporaryDirectory(prefix="fairgate-sim-") as tmp:
        store: QuotaStore | None = None
        if any(p in ENGINE_POLICIES for p in policies):
            store, _prefix = await _open_store(
                driver, data_dir or Path(tmp), scenario.name, redis_url
            )
        try:
            for name in policies:
                policy: SimPolicy
                if name == "fcfs":
                    policy = FcfsPolicy(scenario)
                elif name == "fixed":
                    policy = FixedPolicy(scenario)
                else:
                    assert store is not None
                    policy = EnginePolicy(
                        name,
                        scenario,
                        store,
                        f"sim-{scenario.name}-{name}-{uuid.uuid4().hex[:6]}",
                        ManualClock(start_ms(scenario)),
                    )
                task = None
                if progress is not None:
                    task = progress.add_task(f"{scenario.name} · {name}", total=scenario.ticks)

                def advance(task_id: object = task) -> None:
                    if progress is not None and task_id is not None:
                        progress.advance(task_id)  # type: ignore[arg-type]

                try:
                    run = await run_policy(policy, workload, result, advance)
                finally:
                    await policy.close()
                if isinstance(policy, EnginePolicy) and policy.faults:
                    msg = (
                        f"{scenario.name}/{name}: the engine failed open or the store erred "
                        f"{policy.faults} times ({policy.engine.last_error}); not a measurement"
                    )
                    raise SimError(msg)
                result.runs[name] = run
        finally:
            if store is not None:
                await store.close()
    return result


def _enqueue(
    q: deque[tuple[int, Request]],
    new: Sequence[Request],
    t0: int,
    max_wait: int,
    backlog: int,
    key: str,
    dropped: dict[str, int],
    demand: dict[str, dict[str, float]],
    units: dict[str, Unit],
) -> None:
    """One key's arrivals of a tick: counted as demand (per measured dimension), queued; what
    waited longer than the key's patience or overflows its backlog is dropped (oldest first)."""
    for r in new:
        for name, unit in units.items():
            demand[name][key] += r.size(unit)
    while q and q[0][0] < t0 - max_wait:
        q.popleft()
        dropped[key] += 1
    q.extend((t0, r) for r in new)
    while len(q) > backlog:
        q.popleft()
        dropped[key] += 1


def _cap_times(
    sc: Scenario,
    workload: Workload,
    queues: Mapping[str, deque[tuple[int, Request]]],
    start: int,
    n_windows: int,
) -> CapTimes | None:
    """When each capped key asked (:class:`~fairgate.sim.fairness.CapTimes`), without the
    requests still waiting when the run ended (not demand either)."""
    window = sc.primary.window.ms
    asked: dict[str, list[list[tuple[int, float]]]] = {}
    for k in sc.keys:
        if k.cap is None:
            continue
        rows: list[list[tuple[int, float]]] = [[] for _ in range(n_windows)]
        left = Counter(at for at, _ in queues[k.id])  # undecided at the end
        for i, tick in enumerate(workload.arrivals[k.id]):
            t0 = start + i * sc.tick
            w = min(n_windows - 1, (t0 - start) // window)
            for r in tick:
                if left[t0] > 0:
                    left[t0] -= 1
                else:
                    rows[w].append((t0 - start - w * window, r.size(k.cap.unit)))
        asked[k.id] = rows
    if not asked:
        return None
    return CapTimes(window, asked, {k.id: k.max_wait for k in sc.keys})


async def run_policy(
    policy: SimPolicy,
    workload: Workload,
    result: ScenarioResult,
    on_tick: Callable[[], None] | None = None,
) -> PolicyRun:
    sc = workload.scenario
    t_start = time.perf_counter()
    start = start_ms(sc)
    window = sc.primary.window.ms
    unit = sc.primary.unit
    primary_name = f"{unit.value}/{sc.primary.window.value}"
    n_windows = result.windows
    keys = [k.id for k in sc.keys]
    backlog = {k.id: k.backlog for k in sc.keys}
    limits = {
        f"{d.unit.value}/{d.window.value}": d.limit * sc.pool.members for d in sc.pool.dimensions
    }
    measured = measured_dimensions(sc)

    ledger = Ledger(sc)
    max_wait = {k.id: k.max_wait for k in sc.keys}
    queues: dict[str, deque[tuple[int, Request]]] = {k: deque() for k in keys}
    waits: dict[str, list[int]] = {k: [] for k in keys}
    demand_w: list[dict[str, dict[str, float]]] = [
        {d: defaultdict(float) for d in measured} for _ in range(n_windows)
    ]
    admitted_w: list[dict[str, dict[str, float]]] = [
        {d: defaultdict(float) for d in measured} for _ in range(n_windows)
    ]
    blocked: dict[str, int] = defaultdict(int)
    dropped: dict[str, int] = defaultdict(int)
    first_block: dict[str, int | None] = {}
    peak = dict.fromkeys(limits, 0.0)
    rng = random.Random(f"fairgate-sim-order:{workload.seed}")
    every = max(1, sc.ticks // SERIES_POINTS)
    times_h: list[float] = []
    usage: dict[str, list[float]] = {k: [] for k in keys}
    admissions = 0

    for i in range(sc.ticks):
        t0 = start + i * sc.tick
        w_idx = min(n_windows - 1, (t0 - start) // window)
        for k in keys:
            _enqueue(
                queues[k],
                workload.arrivals[k][i],
                t0,
                max_wait[k],
                backlog[k],
                k,
                dropped,
                demand_w[w_idx],
                measured,
            )
        order = [k for k in keys for _ in range(len(queues[k]))]
        rng.shuffle(order)
        stopped: set[str] = set()
        n = len(order)
        for j, k in enumerate(order):
            if k in stopped:
                continue
            now = t0 + (j * sc.tick) // n
            arrived, req = queues[k][0]
            admissions += 1
            if await policy.attempt(req, now):
                queues[k].popleft()
                waits[k].append(now - arrived)
                actual = req.actual()
                ledger.add(k, actual, now)
                # counted in the window the request was asked in, beside its demand: a burst
                # asked at 59 minutes and served at 61 was served for what it asked then
                got = admitted_w[min(n_windows - 1, (arrived - start) // window)]
                for d, u in measured.items():
                    got[d][k] += actual.get(u, 0.0)
                for _u, w, name in ledger.dimensions:
                    v = ledger.value(POOL, name, w, now)
                    peak[name] = max(peak[name], v)
            else:
                blocked[k] += 1
                if k not in first_block:
                    first_block[k] = now - start
                stopped.add(k)
        if i % every == 0 or i == sc.ticks - 1:
            t_end = t0 + sc.tick - 1
            times_h.append((t_end - start) / 3_600_000)
            for k in keys:
                usage[k].append(ledger.value(k, primary_name, window, t_end))
        if on_tick is not None:
            on_tick()

    # requests still waiting when the run ends were neither served nor given up: undecided,
    # so not demand either (else a burst in the run's last minute would count as refused)
    for k in keys:
        for arrived, r in queues[k]:
            for d, u in measured.items():
                demand_w[min(n_windows - 1, (arrived - start) // window)][d][k] -= r.size(u)
    windows = dominant_window_figures(
        {d: limits[d] for d in measured},
        {k.id: sc.weight_of(k.id) for k in sc.keys},
        {
            k.id: {d: k.cap.value for d, u in measured.items() if u is k.cap.unit}
            for k in sc.keys
            if k.cap is not None
        },
        demand_w,
        admitted_w,
        longer_windows(sc, n_windows),
        _cap_times(sc, workload, queues, start, n_windows),
    )
    overshoot = {name: max(0.0, peak[name] - lim) / lim for name, lim in limits.items()}
    metrics = summarize(
        windows,
        shares=result.shares,
        overshoot=overshoot,
        blocked=blocked,
        dropped=dropped,
        first_block_ms=first_block,
        waits_ms=waits,
    )
    return PolicyRun(
        policy=policy.name,
        metrics=metrics,
        times_h=times_h,
        usage=usage,
        wall_s=time.perf_counter() - t_start,
        admissions=admissions,
        windows=windows,
    )
