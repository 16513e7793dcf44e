"""The sharing policies compared side by side, behind one small interface.

- ``fcfs``: no sharing. A request is admitted whenever the pool has room for it (the ceiling,
  and a key's absolute cap): whoever asks first gets the pool.
- ``static``: the real :class:`~fairgate.quota.engine.QuotaEngine` in ``static`` share mode
  (the seeds' rules: fixed weighted shares once the pool is half used, borrowing below that).
- ``active``: the real engine in ``active`` share mode (weighted water-filling over the keys
  active recently, bounded by their recent demand).
- ``fixed``: a static per-key limit of ``weight × limit`` per window, never borrowing: the
  common alternative (a rate limit per API key).
- ``hold``: the real engine in ``active`` share mode with the pool's ``admission:
  hold`` (issue 45, item 1): a request that does not fit waits in its key's queue instead of
  being refused, and freed room goes to the waiting key of the least dominant share per weight
  (:mod:`fairgate.quota.hold`), oldest first (:func:`fairgate.sim.runner.run_engine_held`).
- ``las``, ``sfq``, ``vtc``: the online references of issue 45, which hold a request that does
  not fit instead of refusing it (:mod:`fairgate.sim.reference`).

The engine-backed policies run through a real store (SQLite or Redis) with a
:class:`~fairgate.clock.ManualClock` that the runner moves to each request's simulated time, so
what is measured is exactly what the gateway would decide. ``fcfs`` and ``fixed`` need no
engine: they are a few lines over the same two-bucket sliding counters (:class:`Ledger`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import ShareMode
from fairgate.quota.outcomes import Admission
from fairgate.quota.ports import QuotaStore
from fairgate.quota.settings import QuotaSettings
from fairgate.quota.window import bucket_index, sliding_value
from fairgate.sim.scenario import Scenario
from fairgate.sim.workload import Request

#: The online reference schedulers fairgate is gated against (:mod:`fairgate.sim.reference`):
#: they hold a request that does not fit in its key's queue instead of refusing it.
REFERENCE_NAMES = ("las", "sfq", "vtc")
#: The engine-backed policy whose clients are held (``admission: hold``), not refused.
HELD_ENGINE = "hold"
POLICY_NAMES = ("fcfs", "static", "active", HELD_ENGINE, "fixed", *REFERENCE_NAMES)
ENGINE_POLICIES = ("static", "active", HELD_ENGINE)


def parse_policies(text: str) -> tuple[str, ...]:
    """``"active"`` or ``"active,static"`` → those policies, in the order of
    :data:`POLICY_NAMES` (so tables and charts keep one order); a clear ValueError otherwise."""
    names = {p.strip() for p in text.split(",")}
    unknown = sorted(names - set(POLICY_NAMES))  # an empty text or item names '' here
    if unknown:
        bad = ", ".join(repr(u) for u in unknown)
        msg = f"--policies: unknown policy {bad} (known: {', '.join(POLICY_NAMES)})"
        raise ValueError(msg)
    return tuple(p for p in POLICY_NAMES if p in names)


#: Ledger owner id of the pool total.
POOL = "*"


class Ledger:
    """Two-bucket sliding counters per (owner, dimension), as the stores keep them (SPEC §2).

    The runner measures every policy with one of these (overshoot, usage over time), and the
    pure policies decide with one.
    """

    def __init__(self, scenario: Scenario) -> None:
        self._dims = [
            (d.unit, d.window.ms, f"{d.unit.value}/{d.window.value}")
            for d in scenario.pool.dimensions
        ]
        self._buckets: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)

    @property
    def dimensions(self) -> list[tuple[Unit, int, str]]:
        return self._dims

    def add(self, owner: str, amounts: Mapping[Unit, float], now_ms: int) -> None:
        for unit, w, name in self._dims:
            amount = amounts.get(unit, 0.0)
            if amount:
                for who in (owner, POOL):
                    b = self._buckets[(who, name)]
                    idx = bucket_index(now_ms, w)
                    b[idx] = b.get(idx, 0.0) + amount
                    if len(b) > 4:  # only the current and previous buckets ever count
                        for old in [i for i in b if i < idx - 1]:
                            del b[old]

    def value(self, owner: str, name: str, window_ms: int, now_ms: int) -> float:
        b = self._buckets.get((owner, name))
        if not b:
            return 0.0
        idx = bucket_index(now_ms, window_ms)
        return sliding_value(b.get(idx - 1, 0.0), b.get(idx, 0.0), now_ms, window_ms)


class SimPolicy(Protocol):
    name: str

    async def attempt(self, req: Request, now_ms: int) -> bool:
        """Admit (and, if admitted, settle with the actual use) one request at ``now_ms``."""
        ...

    async def close(self) -> None: ...


class _Limited:
    """Shared by ``fcfs`` and ``fixed``: admit when every per-dimension limit has room."""

    name = "?"

    def __init__(self, scenario: Scenario, per_key_share: bool) -> None:
        self._scenario = scenario
        self._ledger = Ledger(scenario)
        members = scenario.pool.members
        self._limits = {
            f"{d.unit.value}/{d.window.value}": d.limit * members for d in scenario.pool.dimensions
        }
        self._key_limits: dict[str, dict[str, float]] = {}
        for k in scenario.keys:
            lim: dict[str, float] = {}
            for unit, _w, name in self._ledger.dimensions:
                cap = k.cap.value if k.cap is not None and k.cap.unit is unit else None
                share = (
                    self._limits[name] * scenario.weight_of(k.id) / 100 if per_key_share else None
                )
                bounds = [b for b in (cap, share) if b is not None]
                if bounds:
                    lim[name] = min(bounds)
            self._key_limits[k.id] = lim

    async def attempt(self, req: Request, now_ms: int) -> bool:
        est = req.estimate()
        mine = self._key_limits.get(req.key, {})
        for unit, w, name in self._ledger.dimensions:
            cost = est.get(unit, 0.0)
            if self._ledger.value(POOL, name, w, now_ms) + cost > self._limits[name]:
                return False
            own = mine.get(name)
            if own is not None and self._ledger.value(req.key, name, w, now_ms) + cost > own:
                return False
        self._ledger.add(req.key, req.actual(), now_ms)
        return True

    async def close(self) -> None:
        return None


class FcfsPolicy(_Limited):
    name = "fcfs"

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario, per_key_share=False)


class FixedPolicy(_Limited):
    name = "fixed"

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario, per_key_share=True)


class EnginePolicy:
    """The real engine on a real store; the store is owned by the caller."""

    def __init__(
        self,
        name: str,
        scenario: Scenario,
        store: QuotaStore,
        pool_id: str,
        clock: ManualClock,
        settings: QuotaSettings | None = None,
    ) -> None:
        mode = ShareMode.ACTIVE if name in ("active", HELD_ENGINE) else ShareMode.STATIC
        self.name = name
        self.clock = clock
        self.store = store
        self.pool = scenario.to_pool(pool_id, mode)
        self.engine = QuotaEngine(store, clock=clock, settings=settings)

    async def attempt(self, req: Request, now_ms: int) -> bool:
        return (await self.admit(req, now_ms)).allowed

    async def admit(self, req: Request, now_ms: int) -> Admission:
        """One admission at ``now_ms``, settled at once with the actual use when allowed."""
        self.clock.set(now_ms)
        adm = await self.engine.admit(self.pool, req.key, req.estimate())
        if adm.allowed:
            await self.engine.settle(adm.ticket, req.actual())
        return adm

    @property
    def faults(self) -> int:
        """Fail-open admissions and store errors: a run with any is not a measurement."""
        return self.engine.fail_open_count + self.engine.store_errors

    async def close(self) -> None:
        await self.engine.forget_pool(self.pool.id)
