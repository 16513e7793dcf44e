"""Deterministic demand: for each tick, each key's new requests and their token sizes.

The workload depends only on the scenario and the seed (each key draws from its own
``random.Random`` seeded by the run seed and the key id, so adding a key does not reshuffle the
others), and it is generated once and replayed identically under every policy: the policies are
compared on exactly the same requests.

Smooth patterns (steady, greedy, late, on/off, diurnal) accumulate their rate tick by tick and
emit whole requests, so a steady key really is steady; bursty keys draw a Poisson number of
bursts of exponential size. Token sizes are log-normal around the key's means.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fairgate.domain.units import Unit
from fairgate.sim.scenario import (
    HOUR_MS,
    Bursty,
    Diurnal,
    Greedy,
    KeySpec,
    Late,
    OnOff,
    Scenario,
    Steady,
)

#: Spread of token sizes around their mean (log-normal sigma).
TOKEN_SIGMA = 0.5


@dataclass(frozen=True, slots=True)
class Request:
    key: str
    prompt: int
    completion: int
    max_tokens: int

    def estimate(self) -> dict[Unit, float]:
        """What admission reserves: one request, the prompt plus the most it may generate."""
        return {Unit.REQUESTS: 1.0, Unit.TOKENS: float(self.prompt + self.max_tokens)}

    def actual(self) -> dict[Unit, float]:
        """What the request really used, charged at settle."""
        return {Unit.REQUESTS: 1.0, Unit.TOKENS: float(self.prompt + self.completion)}

    def size(self, unit: Unit) -> float:
        return self.actual().get(unit, 0.0)


@dataclass(frozen=True, slots=True)
class Workload:
    """``arrivals[key][tick]`` are the requests a key starts wanting at that tick."""

    scenario: Scenario
    seed: int
    arrivals: Mapping[str, Sequence[Sequence[Request]]]

    def total(self, key: str, unit: Unit) -> float:
        return sum(r.size(unit) for tick in self.arrivals[key] for r in tick)

    def count(self) -> int:
        return sum(len(t) for ticks in self.arrivals.values() for t in ticks)


def rate_per_hour(scenario: Scenario, key: KeySpec, t_ms: float) -> float:
    """The key's demand rate (requests per hour) at ``t_ms`` after the start of the run."""
    d = key.demand
    if t_ms < d.start or (d.stop is not None and t_ms >= d.stop):
        return 0.0
    if isinstance(d, Steady | Late | Bursty):
        return d.rate
    if isinstance(d, Greedy):
        window_ms = scenario.primary.window.ms
        per_window = d.factor * scenario.share_limit(key.id) / _primary_size(scenario, key)
        return per_window * HOUR_MS / window_ms
    if isinstance(d, OnOff):
        cycle = d.on + d.off
        return d.rate if (t_ms - d.phase) % cycle < d.on else 0.0
    if isinstance(d, Diurnal):
        period = d.period or scenario.duration
        return d.rate * (1 + d.amplitude * math.sin(2 * math.pi * (t_ms / period + d.phase)))
    raise AssertionError(f"unknown pattern {d!r}")  # pragma: no cover - pydantic forbids it


def _primary_size(scenario: Scenario, key: KeySpec) -> float:
    """Mean size of one request in the primary unit (to turn a share into a request rate)."""
    if scenario.primary.unit is Unit.TOKENS:
        return key.tokens.prompt + key.tokens.completion
    return 1.0


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:  # normal approximation; exact enough for burst counts this large
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _lognormal(rng: random.Random, mean: float) -> float:
    mu = math.log(mean) - TOKEN_SIGMA**2 / 2
    return rng.lognormvariate(mu, TOKEN_SIGMA)


def generate(scenario: Scenario, seed: int) -> Workload:
    tick = scenario.tick
    hours_per_tick = tick / HOUR_MS
    arrivals: dict[str, list[list[Request]]] = {}
    for key in scenario.keys:
        rng = random.Random(f"fairgate-sim:{seed}:{key.id}")
        ticks: list[list[Request]] = []
        acc = 0.0
        for i in range(scenario.ticks):
            mid = (i + 0.5) * tick
            rate = rate_per_hour(scenario, key, mid)
            if isinstance(key.demand, Bursty):
                bursts = _poisson(rng, rate * hours_per_tick / key.demand.burst)
                n = sum(max(1, round(rng.expovariate(1 / key.demand.burst))) for _ in range(bursts))
            else:
                acc += rate * hours_per_tick
                n = int(acc)
                acc -= n
            ticks.append([_request(rng, key) for _ in range(n)])
        arrivals[key.id] = ticks
    return Workload(scenario, seed, arrivals)


def _request(rng: random.Random, key: KeySpec) -> Request:
    t = key.tokens
    prompt = max(1, round(_lognormal(rng, t.prompt)))
    completion = max(1, min(t.max_tokens, round(_lognormal(rng, t.completion))))
    return Request(key.id, prompt, completion, t.max_tokens)
