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
from fairgate.quota.decision import Reason
from fairgate.quota.hold import Waiter, dominant_share, next_waiter
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
    HELD_ENGINE,
    POLICY_NAMES,
    POOL,
    REFERENCE_NAMES,
    EnginePolicy,
    FcfsPolicy,
    FixedPolicy,
    Ledger,
    SimPolicy,
)
from fairgate.sim.reference import HeldScheduler, reference
from fairgate.sim.scenario import Scenario
from fairgate.sim.workload import Request, Workload, generate

#: An hour-aligned instant; each run starts at the next boundary of its primary window, so the
#: measurement windows are the counters' own buckets.
EPOCH_MS = 1_700_000_000_000
#: Points per key in the usage-over-time series (for the chart).
SERIES_POINTS = 240
#: Instants per tick at which a held run hands out the room the sliding counters freed (at
#: most one a second): 1 s apart with 30 s ticks, finer than any key's request rate.
HELD_STEPS = 30

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
        from fairgate.store.sqlite.store import SqliteQuotaStore

        os.makedirs(data_dir, exist_ok=True)  # a blocking call, once per scenario
        return SqliteQuotaStore(data_dir / f"{name}.sqlite"), None
    if driver != "redis":
        raise SimError(f"unknown driver {driver!r} (use sqlite or redis)")
    from fairgate.store.redis.store import RedisQuotaStore

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
                task = None
                if progress is not None:
                    task = progress.add_task(f"{scenario.name} · {name}", total=scenario.ticks)

                def advance(task_id: object = task) -> None:
                    if progress is not None and task_id is not None:
                        progress.advance(task_id)  # type: ignore[arg-type]

                if name in REFERENCE_NAMES:
                    result.runs[name] = run_held(
                        reference(name, scenario), workload, result, advance
                    )
                    continue
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
                try:
                    if name == HELD_ENGINE:
                        assert isinstance(policy, EnginePolicy)
                        run = await run_engine_held(policy, workload, result, advance)
                    else:
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


class _Recorder:
    """What every run measures, whatever decides its admissions: the per-key queues (with
    the clients' patience and backlog), demand and admissions per window and measured
    dimension, refusals, waits, the pool's peak per dimension and the usage series; and at
    the end the figures against the ideal (:meth:`finish`). One place, so the engine's runs
    and the reference schedulers' are measured identically."""

    def __init__(self, workload: Workload, result: ScenarioResult) -> None:
        sc = workload.scenario
        self.workload = workload
        self.result = result
        self.sc = sc
        self.t_start = time.perf_counter()
        self.start = start_ms(sc)
        self.window = sc.primary.window.ms
        self.primary_name = f"{sc.primary.unit.value}/{sc.primary.window.value}"
        self.n_windows = result.windows
        self.keys = [k.id for k in sc.keys]
        self.backlog = {k.id: k.backlog for k in sc.keys}
        self.limits = {
            f"{d.unit.value}/{d.window.value}": d.limit * sc.pool.members
            for d in sc.pool.dimensions
        }
        self.measured = measured_dimensions(sc)
        self.ledger = Ledger(sc)
        self.max_wait = {k.id: k.max_wait for k in sc.keys}
        self.queues: dict[str, deque[tuple[int, Request]]] = {k: deque() for k in self.keys}
        self.waits: dict[str, list[int]] = {k: [] for k in self.keys}
        self.demand_w: list[dict[str, dict[str, float]]] = [
            {d: defaultdict(float) for d in self.measured} for _ in range(self.n_windows)
        ]
        self.admitted_w: list[dict[str, dict[str, float]]] = [
            {d: defaultdict(float) for d in self.measured} for _ in range(self.n_windows)
        ]
        #: requests asked per window and key (the small-key allowance counts them)
        self.asked_n: list[dict[str, int]] = [defaultdict(int) for _ in range(self.n_windows)]
        self.blocked: dict[str, int] = defaultdict(int)
        self.dropped: dict[str, int] = defaultdict(int)
        self.first_block: dict[str, int | None] = {}
        self.peak = dict.fromkeys(self.limits, 0.0)
        self.every = max(1, sc.ticks // SERIES_POINTS)
        self.times_h: list[float] = []
        self.usage: dict[str, list[float]] = {k: [] for k in self.keys}
        self.admissions = 0

    def tick_start(self, i: int) -> int:
        """Tick ``i`` begins: every key's arrivals join its queue; its start instant."""
        t0 = self.start + i * self.sc.tick
        w_idx = min(self.n_windows - 1, (t0 - self.start) // self.window)
        for k in self.keys:
            self.asked_n[w_idx][k] += len(self.workload.arrivals[k][i])
            _enqueue(
                self.queues[k],
                self.workload.arrivals[k][i],
                t0,
                self.max_wait[k],
                self.backlog[k],
                k,
                self.dropped,
                self.demand_w[w_idx],
                self.measured,
            )
        return t0

    def admitted(self, k: str, now: int) -> None:
        """Key ``k``'s oldest waiting request was admitted at ``now`` (and settled)."""
        arrived, req = self.queues[k].popleft()
        self.waits[k].append(now - arrived)
        actual = req.actual()
        self.ledger.add(k, actual, now)
        # counted in the window the request was asked in, beside its demand: a burst
        # asked at 59 minutes and served at 61 was served for what it asked then
        got = self.admitted_w[min(self.n_windows - 1, (arrived - self.start) // self.window)]
        for d, u in self.measured.items():
            got[d][k] += actual.get(u, 0.0)
        for _u, w, name in self.ledger.dimensions:
            v = self.ledger.value(POOL, name, w, now)
            self.peak[name] = max(self.peak[name], v)

    def refused(self, k: str, now: int) -> None:
        self.blocked[k] += 1
        if k not in self.first_block:
            self.first_block[k] = now - self.start

    def tick_end(self, i: int, t0: int) -> None:
        if i % self.every == 0 or i == self.sc.ticks - 1:
            t_end = t0 + self.sc.tick - 1
            self.times_h.append((t_end - self.start) / 3_600_000)
            for k in self.keys:
                self.usage[k].append(self.ledger.value(k, self.primary_name, self.window, t_end))

    def finish(self, name: str) -> PolicyRun:
        sc, start, window, n_windows = self.sc, self.start, self.window, self.n_windows
        # requests still waiting when the run ends were neither served nor given up:
        # undecided, so not demand either (else a burst in the run's last minute would
        # count as refused)
        for k in self.keys:
            for arrived, r in self.queues[k]:
                w = min(n_windows - 1, (arrived - start) // window)
                self.asked_n[w][k] -= 1
                for d, u in self.measured.items():
                    self.demand_w[w][d][k] -= r.size(u)
        windows = dominant_window_figures(
            {d: self.limits[d] for d in self.measured},
            {k.id: sc.weight_of(k.id) for k in sc.keys},
            {
                k.id: {d: k.cap.value for d, u in self.measured.items() if u is k.cap.unit}
                for k in sc.keys
                if k.cap is not None
            },
            self.demand_w,
            self.admitted_w,
            longer_windows(sc, n_windows),
            _cap_times(sc, self.workload, self.queues, start, n_windows),
        )
        overshoot = {d: max(0.0, self.peak[d] - lim) / lim for d, lim in self.limits.items()}
        metrics = summarize(
            windows,
            shares=self.result.shares,
            overshoot=overshoot,
            blocked=self.blocked,
            dropped=self.dropped,
            first_block_ms=self.first_block,
            waits_ms=self.waits,
            asked_n=self.asked_n,
        )
        return PolicyRun(
            policy=name,
            metrics=metrics,
            times_h=self.times_h,
            usage=self.usage,
            wall_s=time.perf_counter() - self.t_start,
            admissions=self.admissions,
            windows=windows,
        )


async def run_policy(
    policy: SimPolicy,
    workload: Workload,
    result: ScenarioResult,
    on_tick: Callable[[], None] | None = None,
) -> PolicyRun:
    """The clients retry: within a tick every queued request of every key is tried once, in
    a seeded random interleaving, and a refused key backs off until the next tick."""
    rec = _Recorder(workload, result)
    sc = rec.sc
    rng = random.Random(f"fairgate-sim-order:{workload.seed}")
    for i in range(sc.ticks):
        t0 = rec.tick_start(i)
        order = [k for k in rec.keys for _ in range(len(rec.queues[k]))]
        rng.shuffle(order)
        stopped: set[str] = set()
        n = len(order)
        for j, k in enumerate(order):
            if k in stopped:
                continue
            now = t0 + (j * sc.tick) // n
            _arrived, req = rec.queues[k][0]
            rec.admissions += 1
            if await policy.attempt(req, now):
                rec.admitted(k, now)
            else:
                rec.refused(k, now)
                stopped.add(k)
        rec.tick_end(i, t0)
        if on_tick is not None:
            on_tick()
    return rec.finish(policy.name)


def run_held(
    scheduler: HeldScheduler,
    workload: Workload,
    result: ScenarioResult,
    on_tick: Callable[[], None] | None = None,
) -> PolicyRun:
    """The clients are held: a request that does not fit waits in its key's queue (up to the
    key's patience and backlog, as under the engine), and at :data:`HELD_STEPS` instants a
    tick, while the pool's sliding counters have room, the oldest request of the waiting key
    ``scheduler`` puts first is admitted. When that request does not fit, nothing else is
    admitted at that instant: the room freeing is held for the key owed it, not taken by a
    smaller request behind it. A key at its absolute cap is passed over until it has room."""
    rec = _Recorder(workload, result)
    sc, ledger = rec.sc, rec.ledger
    dims = [(u, w, name, rec.limits[name]) for u, w, name in ledger.dimensions]
    caps: dict[str, list[tuple[Unit, int, str, float]]] = {
        k.id: [(u, w, name, k.cap.value) for u, w, name, _lim in dims if u is k.cap.unit]
        for k in sc.keys
        if k.cap is not None
    }
    steps = max(1, min(HELD_STEPS, sc.tick // 1000))
    waiting: set[str] = set()

    def fits(owner: str, req: Request, bounds: Sequence[tuple[Unit, int, str, float]]) -> bool:
        est = req.estimate()
        return all(
            ledger.value(owner, name, w, now) + est.get(u, 0.0) <= lim
            for u, w, name, lim in bounds
            if est.get(u, 0.0) > 0
        )

    for i in range(sc.ticks):
        t0 = rec.tick_start(i)
        before = set(waiting)
        for k in rec.keys:
            if rec.queues[k] and k not in waiting:
                scheduler.backlogged(k, before)
                waiting.add(k)
            elif not rec.queues[k] and k in waiting:
                scheduler.idle(k)
                waiting.discard(k)
        for s in range(steps):
            now = t0 + (s * sc.tick) // steps
            while waiting:
                room = [(u, lim - ledger.value(POOL, name, w, now)) for u, w, name, lim in dims]
                if not any(
                    all(r >= q[0][1].estimate().get(u, 0.0) for u, r in room)
                    for q in (rec.queues[k] for k in waiting)
                ):
                    break  # a full pool: no waiting request fits, whoever is first
                eligible = [k for k in waiting if fits(k, rec.queues[k][0][1], caps.get(k, ()))]
                if not eligible:
                    break
                k = min(
                    eligible,
                    key=lambda k: scheduler.order(k, rec.queues[k][0][0], ledger, now),
                )
                req = rec.queues[k][0][1]
                if not fits(POOL, req, dims):
                    break
                rec.admissions += 1
                rec.admitted(k, now)
                scheduler.served(k, req)
                if not rec.queues[k]:
                    scheduler.idle(k)
                    waiting.discard(k)
        rec.tick_end(i, t0)
        if on_tick is not None:
            on_tick()
    return rec.finish(scheduler.name)


async def run_engine_held(
    policy: EnginePolicy,
    workload: Workload,
    result: ScenarioResult,
    on_tick: Callable[[], None] | None = None,
) -> PolicyRun:
    """fairgate with ``admission: hold``: the clients are held as under :func:`run_held`
    (the same queues, patience, backlog and :data:`HELD_STEPS` instants a tick), and at each
    instant the room goes to the waiter :func:`fairgate.quota.hold.next_waiter` puts first
    (the least dominant share of the current window per weight, oldest first), through the
    real engine and store. A waiter refused because the pool is full holds the room for itself
    (nothing behind it is admitted at that instant: the store would refuse the jump); one
    refused for its own share or a cap is owed nothing and the next waiter is tried."""
    rec = _Recorder(workload, result)
    sc, ledger = rec.sc, rec.ledger
    dims = [(w, name, rec.limits[name]) for _u, w, name in ledger.dimensions]
    weights = {k.id: sc.weight_of(k.id) for k in sc.keys}
    steps = max(1, min(HELD_STEPS, sc.tick // 1000))
    for i in range(sc.ticks):
        t0 = rec.tick_start(i)
        for s in range(steps):
            now = t0 + (s * sc.tick) // steps
            passed: set[str] = set()
            while True:
                waiters = [
                    Waiter(
                        k,
                        k,
                        rec.queues[k][0][0],
                        now + 1,
                        dominant_share(
                            ((ledger.value(k, name, w, now), lim) for w, name, lim in dims),
                            weights[k],
                        ),
                    )
                    for k in rec.keys
                    if rec.queues[k] and k not in passed
                ]
                head = next_waiter(waiters, now)
                if head is None:
                    break
                k = head.key_id
                rec.admissions += 1
                adm = await policy.admit(rec.queues[k][0][1], now)
                if adm.allowed:
                    rec.admitted(k, now)
                    continue
                if adm.reason is Reason.GLOBAL_SATURATED:
                    break  # the pool is full: the room that frees is held for this key
                passed.add(k)  # refused for its own share: owed nothing this instant
        rec.tick_end(i, t0)
        if on_tick is not None:
            on_tick()
    return rec.finish(policy.name)
