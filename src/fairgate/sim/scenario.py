"""Scenario files: a pool, the keys that share it and how each key's demand moves over time.

A scenario is YAML validated by pydantic, so a typo names its field instead of producing a
silently wrong run. Rates are requests per hour (independent of the pool's window); durations
are ``"30s"``, ``"15m"``, ``"6h"``, ``"2d"`` or a number of seconds. Fairness and utilisation
are measured on the pool's first dimension and every other of the same or a longer window,
against the weighted dominant-resource-fair ideal (:mod:`fairgate.sim.fairness`, across windows
where a longer one is measured); a dimension of a shorter window is checked for overshoot only.

Example::

    name: greedy
    duration: 6h
    tick: 30s
    pool:
      dimensions: [{unit: requests, window: hourly, limit: 600}]
    keys:
      - {id: hog, weight: 25, demand: {kind: greedy, factor: 10}}
      - {id: app, weight: 25, demand: {kind: steady, rate: 100}}
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Allocation, Dimension, Policy, Pool, ShareMode, pool_limits

HOUR_MS = 3_600_000

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": HOUR_MS, "d": 24 * HOUR_MS, None: 1000}


class ScenarioError(ValueError):
    """A scenario that cannot be run: unknown built-in, unreadable or invalid file."""


def parse_duration_ms(value: object) -> int:
    """``"90m"`` → 5,400,000. A bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '30s'")
    if isinstance(value, int | float):
        ms = float(value) * 1000
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        ms = float(m.group(1)) * _UNIT_MS[m.group(2)]
    else:
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 15m, 6h, 2d)")
    if not math.isfinite(ms) or ms <= 0:
        raise ValueError("a duration must be positive")
    return round(ms)


def _offset(value: object) -> int:
    """Like a duration, but 0 is allowed (no offset), with or without a unit (``0m``)."""
    if isinstance(value, str) and (m := _DURATION.match(value)) and float(m.group(1)) == 0:
        return 0
    if value in (0, "0", 0.0):
        return 0
    return parse_duration_ms(value)


Duration = Annotated[int, Field(gt=0)]
Offset = Annotated[int, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Timed(_Strict):
    """Every pattern may start late and stop early (offsets from the start of the run)."""

    start: Offset = 0
    stop: Duration | None = None

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, v: object) -> int:
        return _offset(v)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: object) -> int | None:
        return None if v is None else parse_duration_ms(v)


class Steady(_Timed):
    """Evenly spaced requests at ``rate`` per hour."""

    kind: Literal["steady"] = "steady"
    rate: float = Field(gt=0)


class Bursty(_Timed):
    """Random bursts averaging ``rate`` requests per hour, ``burst`` requests each on average."""

    kind: Literal["bursty"] = "bursty"
    rate: float = Field(gt=0)
    burst: float = Field(default=20, ge=1)


class OnOff(_Timed):
    """``rate`` per hour for ``on``, nothing for ``off``, repeating; ``phase`` shifts the cycle."""

    kind: Literal["on_off"] = "on_off"
    rate: float = Field(gt=0)
    on: Duration
    off: Duration
    phase: Offset = 0

    @field_validator("on", "off", mode="before")
    @classmethod
    def _dur(cls, v: object) -> int:
        return parse_duration_ms(v)

    @field_validator("phase", mode="before")
    @classmethod
    def _phase(cls, v: object) -> int:
        return _offset(v)


class Greedy(_Timed):
    """Asks ``factor`` times its weighted share of the pool's first dimension, steadily."""

    kind: Literal["greedy"] = "greedy"
    factor: float = Field(default=10, gt=0)


class Late(_Timed):
    """Steady at ``rate`` per hour from ``start`` on (a key that joins a busy pool)."""

    kind: Literal["late"] = "late"
    rate: float = Field(gt=0)

    @model_validator(mode="after")
    def _needs_start(self) -> Late:
        if self.start <= 0:
            raise ValueError("a late pattern needs a start > 0")
        return self


class Diurnal(_Timed):
    """A daily cycle: ``rate × (1 + amplitude × sin(2π (t / period + phase)))`` per hour.

    ``period`` defaults to the whole run (one compressed day); ``phase`` is a fraction of it.
    """

    kind: Literal["diurnal"] = "diurnal"
    rate: float = Field(gt=0)
    amplitude: float = Field(default=0.8, ge=0, le=1)
    period: Duration | None = None
    phase: float = 0.0

    @field_validator("period", mode="before")
    @classmethod
    def _period(cls, v: object) -> int | None:
        return None if v is None else parse_duration_ms(v)


Pattern = Annotated[Steady | Bursty | OnOff | Greedy | Late | Diurnal, Field(discriminator="kind")]


class Tokens(_Strict):
    """Token sizes of a key's requests (log-normal around these means)."""

    prompt: float = Field(default=600, gt=0)
    completion: float = Field(default=250, gt=0)
    max_tokens: int = Field(default=1024, gt=0)


class Cap(_Strict):
    value: float = Field(gt=0)
    unit: Unit


class KeySpec(_Strict):
    id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    weight: float = Field(default=0, ge=0, le=100)
    policy: Policy = Policy.HARD
    cap: Cap | None = None
    demand: Pattern
    tokens: Tokens = Tokens()
    #: a refused request is retried each tick until it is this old, then abandoned (a client's
    #: timeout); and at most ``backlog`` requests wait at once (older ones are abandoned)
    max_wait: Duration = 120_000
    backlog: int = Field(default=200, ge=1)

    @field_validator("max_wait", mode="before")
    @classmethod
    def _max_wait(cls, v: object) -> int:
        return parse_duration_ms(v)

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().lower() not in {p.value for p in Policy}:
            raise ValueError("policy must be hard, soft or burst")
        return v


class DimensionSpec(_Strict):
    unit: Unit
    window: Window
    limit: float = Field(gt=0)

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: Unit) -> Unit:
        # simulated requests carry a request count and token sizes, nothing priced or reported
        if v not in (Unit.REQUESTS, Unit.TOKENS):
            raise ValueError("the simulator models requests and tokens dimensions only")
        return v


class PoolSpec(_Strict):
    dimensions: list[DimensionSpec] = Field(min_length=1)
    members: int = Field(default=1, ge=1)
    active_window: Duration = 15 * 60_000

    @field_validator("active_window", mode="before")
    @classmethod
    def _aw(cls, v: object) -> int:
        return parse_duration_ms(v)


class Scenario(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    duration: Duration
    tick: Duration = 30_000
    pool: PoolSpec
    keys: list[KeySpec] = Field(min_length=1)

    @field_validator("duration", "tick", mode="before")
    @classmethod
    def _dur(cls, v: object) -> int:
        return parse_duration_ms(v)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        ids = [k.id for k in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError("key ids must be unique")
        if self.tick > self.duration:
            raise ValueError("tick must not be longer than the duration")
        if self.duration // self.tick > 200_000:
            raise ValueError("too many ticks (duration / tick > 200,000)")
        keys = {(d.unit, d.window) for d in self.pool.dimensions}
        if len(keys) != len(self.pool.dimensions):
            raise ValueError("pool dimensions must differ in unit or window")
        return self

    # -- derived ----------------------------------------------------------------------------

    @property
    def primary(self) -> DimensionSpec:
        """The first dimension: its window is the measurement window, its unit the one rates
        and greedy shares are in."""
        return self.pool.dimensions[0]

    @property
    def ticks(self) -> int:
        return max(1, self.duration // self.tick)

    def weight_of(self, key_id: str) -> float:
        """Weight in percent, with the pool rule: all weights 0 → 100/n each."""
        if all(k.weight <= 0 for k in self.keys):
            return 100.0 / len(self.keys)
        return next(k.weight for k in self.keys if k.id == key_id)

    def share_limit(self, key_id: str) -> float:
        """The key's static weighted share of the primary dimension's (effective) limit."""
        return self.primary.limit * self.pool.members * self.weight_of(key_id) / 100.0

    def with_duration(self, duration_ms: int) -> Scenario:
        return self.model_copy(update={"duration": duration_ms})

    def to_pool(self, pool_id: str, mode: ShareMode) -> Pool:
        """The engine's pool: a scenario's limits are per member connection, as a plan's."""
        dims, per_connection = pool_limits(
            (Dimension(d.unit, d.window, d.limit) for d in self.pool.dimensions),
            from_plan=True,
            members=self.pool.members,
        )
        return Pool(
            id=pool_id,
            name=self.name,
            provider="sim",
            connections=tuple(f"sim-{i}" for i in range(self.pool.members)),
            dimensions=dims,
            per_connection=per_connection,
            allocations=tuple(
                Allocation(
                    k.id,
                    k.weight,
                    cap_value=k.cap.value if k.cap else None,
                    cap_unit=k.cap.unit if k.cap else None,
                    policy=k.policy,
                )
                for k in self.keys
            ),
            share_mode=mode,
            active_window_ms=self.pool.active_window,
        )


# -- loading ------------------------------------------------------------------------------------


def _bool_key(node: object, where: str = "") -> str | None:
    """Where a mapping has a boolean key (YAML 1.1 read ``on:``/``off:`` as true/false)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, bool):
                return f"{where}.{k}".lstrip(".")
            found = _bool_key(v, f"{where}.{k}")
            if found:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _bool_key(v, f"{where}.{i}")
            if found:
                return found
    return None


def parse_scenario(data: object, source: str = "scenario") -> Scenario:
    trap = _bool_key(data)
    if trap is not None:
        raise ScenarioError(
            f"{source} is not a valid scenario:\n  {trap}: a key read as a boolean; YAML 1.1 "
            "reads on/off/yes/no as true/false, so write them quoted ('on': 20m) or load "
            "the file with fairgate (which reads only true/false as booleans)"
        )
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source} is not a valid scenario:"]
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ScenarioError("\n".join(lines)) from None


class _Loader(yaml.SafeLoader):
    """YAML with the 1.2 booleans: only ``true``/``false`` are booleans, so the on-off
    pattern's own ``on: 20m`` / ``off: 70m`` stay keys (YAML 1.1 reads on/off/yes/no as
    booleans, and the error would be a baffling "keys should be strings")."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{p} is not valid YAML: {exc}") from None
    return parse_scenario(data, str(p))


# -- built-ins ------------------------------------------------------------------------------------

#: One hour of 600 requests, keys weighted 40/30/20/10 (or equal), six hours, 30 s ticks: long
#: enough for several windows, short enough to run every policy in seconds.
_BASE_POOL = {
    "dimensions": [
        {"unit": "requests", "window": "hourly", "limit": 600},
        {"unit": "tokens", "window": "hourly", "limit": 2_000_000},
    ]
}

_BUILTIN_DATA: dict[str, dict[str, object]] = {
    "steady": {
        "description": "four keys at constant rates, two above their share and two below",
        "duration": "6h",
        "keys": [
            {"id": "alpha", "weight": 40, "demand": {"kind": "steady", "rate": 400}},
            {"id": "beta", "weight": 30, "demand": {"kind": "steady", "rate": 100}},
            {"id": "gamma", "weight": 20, "demand": {"kind": "steady", "rate": 200}},
            {
                "id": "delta",
                "weight": 10,
                "cap": {"value": 40, "unit": "requests"},
                "demand": {"kind": "steady", "rate": 30},
            },
        ],
    },
    "greedy": {
        "description": "one key asks ten times its share; three well-behaved keys stay below",
        "duration": "6h",
        "keys": [
            {"id": "hog", "weight": 25, "demand": {"kind": "greedy", "factor": 10}},
            {"id": "app1", "weight": 25, "demand": {"kind": "steady", "rate": 100}},
            {"id": "app2", "weight": 25, "demand": {"kind": "steady", "rate": 80}},
            {"id": "app3", "weight": 25, "demand": {"kind": "steady", "rate": 120}},
        ],
    },
    "bursty": {
        "description": "two keys send random bursts beside a steady and a greedy key",
        "duration": "6h",
        "keys": [
            {
                "id": "batch",
                "weight": 30,
                "max_wait": "15m",
                "demand": {"kind": "bursty", "rate": 240, "burst": 30},
            },
            {
                "id": "jobs",
                "weight": 20,
                "max_wait": "15m",
                "demand": {"kind": "bursty", "rate": 90, "burst": 15},
            },
            {"id": "web", "weight": 30, "demand": {"kind": "steady", "rate": 150}},
            {"id": "crawler", "weight": 20, "demand": {"kind": "greedy", "factor": 5}},
        ],
    },
    "on-off": {
        "description": "keys switch on and off for hours at a time, out of phase",
        "duration": "8h",
        "keys": [
            {
                "id": "east",
                "weight": 30,
                "demand": {"kind": "on_off", "rate": 500, "on": "2h", "off": "2h"},
            },
            {
                "id": "west",
                "weight": 30,
                "demand": {"kind": "on_off", "rate": 500, "on": "2h", "off": "2h", "phase": "2h"},
            },
            {"id": "ops", "weight": 20, "demand": {"kind": "steady", "rate": 150}},
            {"id": "etl", "weight": 20, "demand": {"kind": "greedy", "factor": 4}},
        ],
    },
    "late-arrival": {
        "description": "three keys fill the pool; a fourth joins after two hours",
        "duration": "6h",
        "keys": [
            {"id": "first", "weight": 25, "demand": {"kind": "greedy", "factor": 3}},
            {"id": "second", "weight": 25, "demand": {"kind": "greedy", "factor": 3}},
            {"id": "third", "weight": 25, "demand": {"kind": "steady", "rate": 100}},
            {
                "id": "newcomer",
                "weight": 25,
                "demand": {"kind": "late", "rate": 400, "start": "2h"},
            },
        ],
    },
    "diurnal": {
        "description": "a compressed day: demand swells and ebbs, peaks in different time zones",
        "duration": "8h",
        "keys": [
            {"id": "emea", "weight": 35, "demand": {"kind": "diurnal", "rate": 260, "phase": 0}},
            {"id": "amer", "weight": 35, "demand": {"kind": "diurnal", "rate": 260, "phase": 0.33}},
            {"id": "apac", "weight": 20, "demand": {"kind": "diurnal", "rate": 150, "phase": 0.66}},
            {"id": "cron", "weight": 10, "demand": {"kind": "steady", "rate": 40}},
        ],
    },
}


def _many_keys() -> list[dict[str, object]]:
    """40 keys of weights 1-10, a quarter each greedy (3, 10 or 30 times their share),
    steady, on-off (40 min on, 80 off, staggered by 12 min) and bursty (bursts of 20 jobs that
    wait up to 10 minutes for a slot, as in ``bursty``); every ninth key capped at 30 requests
    an hour. Rates scale with the key's share of 1,200 requests/hour."""
    keys: list[dict[str, object]] = []
    for i in range(40):
        kind = ("greedy", "steady", "on_off", "bursty")[i % 4]
        weight = 1 + (i * 7) % 10
        share = 1200 * weight / 100
        demand: dict[str, object]
        if kind == "greedy":
            demand = {"kind": "greedy", "factor": (3, 10, 30)[i // 4 % 3]}
        elif kind == "steady":
            demand = {"kind": "steady", "rate": round(share * 0.15 + 5)}
        elif kind == "on_off":
            demand = {
                "kind": "on_off",
                "rate": round(share * 0.6 + 10),
                "on": "40m",
                "off": "80m",
                "phase": (i // 4) * 12 * 60,
            }
        else:
            demand = {"kind": "bursty", "rate": round(share * 0.25 + 5), "burst": 20}
        key: dict[str, object] = {
            "id": f"{kind.replace('_', '')}-{i:02d}",
            "weight": weight,
            "demand": demand,
        }
        if kind == "bursty":
            key["max_wait"] = "10m"  # a burst of jobs waits for a slot (as in ``bursty``)
        if i % 9 == 0:
            key["cap"] = {"value": 30, "unit": "requests"}
        keys.append(key)
    return keys


_BUILTIN_DATA["many-keys"] = {
    "description": "40 keys, weights 1-10: greedy, steady, staggered on-off and bursty; caps",
    "duration": "6h",
    "pool": {"dimensions": [{"unit": "requests", "window": "hourly", "limit": 1200}]},
    "keys": _many_keys(),
}
_BUILTIN_DATA["token-mix"] = {
    "description": "a token-bound pool: 8k-token prompts beside chat, an on-off batch, a late key",
    "duration": "6h",
    "pool": {"dimensions": [{"unit": "tokens", "window": "hourly", "limit": 400_000}]},
    "keys": [
        {
            "id": "greedy",
            "demand": {"kind": "greedy", "factor": 5},
            "tokens": {"prompt": 8000, "completion": 500, "max_tokens": 1024},
        },
        {
            "id": "chatty",
            "demand": {"kind": "steady", "rate": 250},
            "tokens": {"prompt": 400, "completion": 200, "max_tokens": 512},
        },
        {
            "id": "batch",
            "max_wait": "15m",
            "demand": {"kind": "on_off", "rate": 200, "on": "30m", "off": "30m", "phase": "15m"},
            "tokens": {"prompt": 2000, "completion": 1500, "max_tokens": 2048},
        },
        {
            "id": "late",
            "demand": {"kind": "late", "rate": 100, "start": "2h"},
            "tokens": {"prompt": 1000, "completion": 400, "max_tokens": 1024},
        },
    ],
}

#: Issue 18's shape: two dimensions that both bind, keys whose requests differ 16-fold in size.
#: The research agent is a hard key whose jobs wait up to 15 minutes: the issue's soft key is
#: only penalised above its share, never held to it, so no policy could hold it to its ideal
#: (docs/fairness.md has both figures).
_BUILTIN_DATA["two-resource"] = {
    "description": "requests and tokens both bind: two teams, a CI bot, light keys, research",
    "duration": "8h",
    "pool": {
        "dimensions": [
            {"unit": "requests", "window": "hourly", "limit": 300},
            {"unit": "tokens", "window": "hourly", "limit": 600_000},
        ]
    },
    "keys": [
        {
            "id": "team-a",
            "weight": 25,
            "demand": {"kind": "diurnal", "rate": 130, "phase": 0},
            "tokens": {"prompt": 1200, "completion": 400, "max_tokens": 1024},
        },
        {
            "id": "team-b",
            "weight": 25,
            "demand": {"kind": "diurnal", "rate": 130, "phase": 0.5},
            "tokens": {"prompt": 1200, "completion": 400, "max_tokens": 1024},
        },
        {
            "id": "ci-bot",
            "weight": 20,
            "demand": {"kind": "late", "rate": 60, "start": "3h"},
            "tokens": {"prompt": 7000, "completion": 1000, "max_tokens": 2048},
        },
        {
            "id": "light-1",
            "weight": 5,
            "max_wait": "15m",
            "demand": {"kind": "bursty", "rate": 20, "burst": 8},
            "tokens": {"prompt": 600, "completion": 200, "max_tokens": 512},
        },
        {
            "id": "light-2",
            "weight": 5,
            "max_wait": "15m",
            "demand": {"kind": "bursty", "rate": 15, "burst": 6},
            "tokens": {"prompt": 600, "completion": 200, "max_tokens": 512},
        },
        {
            "id": "research",
            "weight": 20,
            "max_wait": "15m",
            "demand": {"kind": "on_off", "rate": 90, "on": "20m", "off": "70m"},
            "tokens": {"prompt": 11000, "completion": 1800, "max_tokens": 4096},
        },
    ],
}
#: A chat front-end (many small requests) beside a batch summariser (few huge ones) on an RPM
#: + TPM pool: requests are the chat's dominant dimension, tokens the summariser's.
_BUILTIN_DATA["chat-agent"] = {
    "description": "a chat front-end of small requests beside a summariser of huge ones",
    "duration": "6h",
    "pool": {
        "dimensions": [
            {"unit": "requests", "window": "hourly", "limit": 600},
            {"unit": "tokens", "window": "hourly", "limit": 1_200_000},
        ]
    },
    "keys": [
        {
            "id": "chat",
            "weight": 50,
            "demand": {"kind": "steady", "rate": 450},
            "tokens": {"prompt": 600, "completion": 250, "max_tokens": 512},
        },
        {
            "id": "summariser",
            "weight": 50,
            "max_wait": "15m",
            "demand": {"kind": "greedy", "factor": 0.5},
            "tokens": {"prompt": 9000, "completion": 1000, "max_tokens": 2048},
        },
    ],
}

#: A Codex-style subscription: a 5-hour and a weekly budget at once, modelled in requests (the
#: simulator's requests stand for the plan's percentages: one request, one step of each). A whole
#: week, so that a policy pacing the weekly budget to its end and the ideal across windows
#: (which hands out the run's budget in hindsight) agree on when the week ends: a heavy user,
#: two users with opposite daily rhythms, and a late joiner on day two. Every 5-hour window
#: binds, and asked first come first served the weekly budget runs out on day six.
_BUILTIN_DATA["subscription"] = {
    "description": "5-hour and weekly budgets: a heavy user spends the week, a late joiner",
    "duration": "7d",
    "tick": "5m",
    "pool": {
        "dimensions": [
            {"unit": "requests", "window": "5h", "limit": 250},
            {"unit": "requests", "window": "weekly", "limit": 6000},
        ]
    },
    "keys": [
        {
            "id": "heavy",
            "weight": 25,
            "max_wait": "15m",
            "demand": {"kind": "diurnal", "rate": 42, "amplitude": 0.5, "period": "24h"},
        },
        {
            "id": "day",
            "weight": 25,
            "max_wait": "15m",
            "demand": {"kind": "diurnal", "rate": 15, "amplitude": 0.9, "period": "24h"},
        },
        {
            "id": "night",
            "weight": 25,
            "max_wait": "15m",
            "demand": {
                "kind": "diurnal",
                "rate": 15,
                "amplitude": 0.9,
                "period": "24h",
                "phase": 0.5,
            },
        },
        {
            "id": "late",
            "weight": 25,
            "max_wait": "15m",
            "demand": {"kind": "late", "rate": 20, "start": "40h"},
        },
    ],
}


# -- issue 45: one built-in per kind of workload the gate found fairgate behind on ----------------

#: Coding agents (steady, far above their share) beside interactive developers (small bursts,
#: short patience), and a fourth developer who joins two hours in and asks more than its share:
#: the joining key must get its share back from keys that filled the pool, without more.
_BUILTIN_DATA["joining"] = {
    "description": "agents and interactive developers; a developer joins two hours in",
    "duration": "6h",
    "keys": [
        {"id": "agent-1", "weight": 20, "demand": {"kind": "greedy", "factor": 3}},
        {"id": "agent-2", "weight": 20, "demand": {"kind": "greedy", "factor": 2}},
        *(
            {
                "id": f"dev-{i}",
                "weight": 15,
                "max_wait": "1m",
                "demand": {"kind": "bursty", "rate": 70 + 15 * i, "burst": 4},
                "tokens": {"prompt": 1500, "completion": 400, "max_tokens": 1024},
            }
            for i in range(1, 4)
        ),
        {
            "id": "joiner",
            "weight": 15,
            "max_wait": "5m",
            "demand": {"kind": "late", "rate": 150, "start": "2h"},
        },
    ],
}

#: Keys of the three policies at once: a burst-policy key whose bursts may pass its share, a
#: soft key asking three times its share, and hard keys that must still get theirs.
_BUILTIN_DATA["policy-mix"] = {
    "description": "burst-, soft- and hard-policy keys together",
    "duration": "6h",
    "keys": [
        {
            "id": "burst",
            "weight": 25,
            "policy": "burst",
            "max_wait": "10m",
            "demand": {"kind": "bursty", "rate": 200, "burst": 40},
        },
        {"id": "soft", "weight": 25, "policy": "soft", "demand": {"kind": "greedy", "factor": 3}},
        {"id": "hard-1", "weight": 25, "demand": {"kind": "greedy", "factor": 2}},
        {"id": "hard-2", "weight": 15, "demand": {"kind": "steady", "rate": 100}},
        {
            "id": "hard-3",
            "weight": 10,
            "max_wait": "10m",
            "demand": {"kind": "on_off", "rate": 150, "on": "30m", "off": "50m", "phase": "20m"},
        },
    ],
}

#: Requests and tokens both bind all the time: many small chat requests (requests dominant)
#: beside long-context jobs (tokens dominant), both asking more than their share, and a key
#: that switches between them.
_BUILTIN_DATA["dual-bind"] = {
    "description": "requests and tokens both bind: small chats beside long-context jobs",
    "duration": "6h",
    "pool": {
        "dimensions": [
            {"unit": "requests", "window": "hourly", "limit": 400},
            {"unit": "tokens", "window": "hourly", "limit": 800_000},
        ]
    },
    "keys": [
        {
            "id": "chat",
            "weight": 30,
            "demand": {"kind": "greedy", "factor": 2},
            "tokens": {"prompt": 500, "completion": 200, "max_tokens": 512},
        },
        {
            "id": "longctx",
            "weight": 30,
            "max_wait": "10m",
            "demand": {"kind": "greedy", "factor": 0.6},
            "tokens": {"prompt": 9000, "completion": 800, "max_tokens": 2048},
        },
        {
            "id": "mixed",
            "weight": 20,
            "max_wait": "5m",
            "demand": {"kind": "on_off", "rate": 120, "on": "45m", "off": "45m"},
            "tokens": {"prompt": 3000, "completion": 600, "max_tokens": 1024},
        },
        {
            "id": "small",
            "weight": 20,
            "demand": {"kind": "bursty", "rate": 50, "burst": 5},
            "tokens": {"prompt": 800, "completion": 300, "max_tokens": 512},
        },
    ],
}

#: A weekly budget beside a 5-hour one: two users spend steadily, and a batch key runs for an
#: hour once a day, patient, asking far more than an hour's share: the week must keep room for
#: it on every day, and its hour must not take the others' 5-hour windows.
_BUILTIN_DATA["daily-batch"] = {
    "description": "5-hour and weekly budgets: two steady users, a batch once a day",
    "duration": "7d",
    "tick": "5m",
    "pool": {
        "dimensions": [
            {"unit": "requests", "window": "5h", "limit": 250},
            {"unit": "requests", "window": "weekly", "limit": 5000},
        ]
    },
    "keys": [
        {"id": "user-a", "weight": 35, "max_wait": "15m", "demand": {"kind": "steady", "rate": 25}},
        {
            "id": "user-b",
            "weight": 35,
            "max_wait": "15m",
            "demand": {"kind": "diurnal", "rate": 20, "amplitude": 0.8, "period": "24h"},
        },
        {
            "id": "batch",
            "weight": 30,
            "max_wait": "60m",
            "demand": {"kind": "on_off", "rate": 300, "on": "1h", "off": "23h", "phase": "3h"},
        },
    ],
}


def _tiny_keys() -> list[dict[str, object]]:
    """Two heavy keys (greedy, weight 10 each) and 200 tiny ones (weight 0.4, a few requests
    an hour each, starting spread over the first hour) on a fresh pool."""
    keys: list[dict[str, object]] = [
        {"id": f"heavy-{i}", "weight": 10, "demand": {"kind": "greedy", "factor": 5}}
        for i in (1, 2)
    ]
    for i in range(200):
        keys.append(
            {
                "id": f"tiny-{i:03d}",
                "weight": 0.4,
                "max_wait": "5m",
                "demand": {"kind": "steady", "rate": 3 + i % 3, "start": (i * 18) % 3600},
            }
        )
    return keys


_BUILTIN_DATA["tiny-keys"] = {
    "description": "200 tiny keys beside two heavy ones on a fresh pool",
    "duration": "4h",
    "pool": {"dimensions": [{"unit": "requests", "window": "hourly", "limit": 1200}]},
    "keys": _tiny_keys(),
}


def builtin_names() -> tuple[str, ...]:
    return tuple(_BUILTIN_DATA)


def builtin(name: str) -> Scenario:
    data = _BUILTIN_DATA.get(name)
    if data is None:
        known = ", ".join(builtin_names())
        raise ScenarioError(f"unknown built-in scenario {name!r} (known: {known})")
    full: dict[str, object] = {"name": name, "tick": "30s", "pool": _BASE_POOL, **data}
    return parse_scenario(full, f"built-in {name}")


def builtins() -> tuple[Scenario, ...]:
    return tuple(builtin(n) for n in builtin_names())
