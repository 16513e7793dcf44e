"""Online reference schedulers: the bar fairgate's ``active`` mode is gated against (issue 45).

The hindsight ideal (:mod:`fairgate.sim.ideal`) says what each key was owed; it does not say
how close an online rule can come. These three do, on the same requests and the same seed: a
request that does not fit *waits* in its key's queue up to its patience (the key's
``max_wait``, then it is abandoned, as under the engine), and whenever the pool's sliding
counters have room it goes to the waiting key the rule puts first, oldest request first. They
know nothing fairgate could not (what was asked, when, and what was admitted) but they hold
clients instead of refusing them. Every key is treated as hard (its policy is ignored), an
absolute cap is kept, and none has a tuned parameter: they are a bar, not a competitor.

- ``las``: causal water-filling. The waiting key with the least use of the current sliding
  window per unit of weight (its dominant share over the pool's dimensions) goes first.
- ``sfq``: start-time fair queueing (Goyal, Vin and Cheng, 1996). Each key's head request
  carries a start tag ``max(v, F)`` (``v`` the start tag of the last request served, ``F`` the
  key's last finish tag); the least start tag goes first; serving a request of cost ``c``
  sets the key's finish tag to ``start + c / weight``.
- ``vtc``: a weighted virtual token counter (Sheng et al., "Fairness in Serving Large Language
  Models", OSDI 2024). A counter per key of the service it got, in the pool's cost units per
  unit of weight; the waiting key with the least counter goes first; a key that starts waiting
  again has its counter lifted to the least counter of the keys waiting (or, when none is, to
  the counter of the last key that stopped waiting), so time away earns it no credit.

The cost of a request, for ``sfq`` and ``vtc``, is its dominant share of the pool: the largest
over the pool's dimensions of what it used there divided by the dimension's limit (one request
of a 600-request pool: 1/600; with a token dimension beside it, whichever is larger).

The scheduling loop itself (the queues, the instants at which room is handed out, the
bookkeeping) is :func:`fairgate.sim.runner.run_held`: these classes only order the keys.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from fairgate.sim.policies import REFERENCE_NAMES, Ledger
from fairgate.sim.scenario import Scenario
from fairgate.sim.workload import Request

__all__ = ["REFERENCE_NAMES", "HeldScheduler", "reference"]


class HeldScheduler:
    """Orders the waiting keys; told when a key starts and stops waiting and what it got.

    Subclasses override :meth:`order` and, where they keep state, the three notifications.
    """

    name = "?"

    def __init__(self, scenario: Scenario) -> None:
        members = scenario.pool.members
        #: (unit, window ms, name, limit) of every pool dimension
        self.dims = [
            (d.unit, d.window.ms, f"{d.unit.value}/{d.window.value}", d.limit * members)
            for d in scenario.pool.dimensions
        ]
        self.weights = {k.id: scenario.weight_of(k.id) for k in scenario.keys}

    def cost(self, req: Request) -> float:
        """The request's dominant share of the pool (what it used, largest over dimensions)."""
        actual = req.actual()
        return max((actual.get(u, 0.0) / lim for u, _w, _n, lim in self.dims), default=0.0)

    def per_weight(self, key: str, amount: float) -> float:
        """``amount`` per unit of the key's weight (a key of weight 0 comes after every other)."""
        w = self.weights.get(key, 0.0)
        return amount / w if w > 0 else math.inf

    def order(
        self, key: str, arrived: int, ledger: Ledger, now: int
    ) -> tuple[float, int, str]:  # pragma: no cover - every reference overrides it
        raise NotImplementedError

    def backlogged(self, key: str, waiting: Collection[str]) -> None:
        """``key`` starts waiting; ``waiting``: the other keys waiting at that instant."""

    def served(self, key: str, req: Request) -> None:
        """``key``'s oldest request was admitted."""

    def idle(self, key: str) -> None:
        """``key`` has nothing left waiting (served or abandoned)."""


class LeastAttainedService(HeldScheduler):
    """``las``: the least dominant share of the current sliding window per weight first."""

    name = "las"

    def order(self, key: str, arrived: int, ledger: Ledger, now: int) -> tuple[float, int, str]:
        share = max(
            (ledger.value(key, name, w, now) / lim for _u, w, name, lim in self.dims),
            default=0.0,
        )
        return (self.per_weight(key, share), arrived, key)


class StartTimeFair(HeldScheduler):
    """``sfq``: the least start tag first."""

    name = "sfq"

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.v = 0.0  # virtual time: the start tag of the last request served
        self.max_finish = 0.0
        self.start: dict[str, float] = {}
        self.finish: dict[str, float] = {}

    def order(self, key: str, arrived: int, ledger: Ledger, now: int) -> tuple[float, int, str]:
        return (self.start[key], arrived, key)

    def backlogged(self, key: str, waiting: Collection[str]) -> None:
        if not waiting:  # a busy period begins: virtual time catches up with what was served
            self.v = max(self.v, self.max_finish)
        self.start[key] = max(self.v, self.finish.get(key, 0.0))

    def served(self, key: str, req: Request) -> None:
        s = self.start[key]
        self.v = s
        f = s + self.per_weight(key, self.cost(req))
        self.finish[key] = f
        self.max_finish = max(self.max_finish, f)
        self.start[key] = f  # its next request, if it has one waiting, starts where this ends


class VirtualTokenCounter(HeldScheduler):
    """``vtc``: the least counter of service per weight first."""

    name = "vtc"

    def __init__(self, scenario: Scenario) -> None:
        super().__init__(scenario)
        self.counter: dict[str, float] = {}
        self.last_left = 0.0

    def order(self, key: str, arrived: int, ledger: Ledger, now: int) -> tuple[float, int, str]:
        return (self.counter.get(key, 0.0), arrived, key)

    def backlogged(self, key: str, waiting: Collection[str]) -> None:
        floor = min((self.counter.get(k, 0.0) for k in waiting), default=self.last_left)
        self.counter[key] = max(self.counter.get(key, 0.0), floor)

    def served(self, key: str, req: Request) -> None:
        self.counter[key] = self.counter.get(key, 0.0) + self.per_weight(key, self.cost(req))

    def idle(self, key: str) -> None:
        self.last_left = self.counter.get(key, 0.0)


def reference(name: str, scenario: Scenario) -> HeldScheduler:
    """The reference scheduler called ``name`` (one of :data:`REFERENCE_NAMES`)."""
    kinds: dict[str, type[HeldScheduler]] = {
        "las": LeastAttainedService,
        "sfq": StartTimeFair,
        "vtc": VirtualTokenCounter,
    }
    return kinds[name](scenario)
