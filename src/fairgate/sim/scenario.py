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

import functools
import math
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

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


#: A duration field: ``"90m"`` or seconds in, milliseconds kept (parsed in one place, so
#: ``Duration | None`` is a duration or nothing).
Duration = Annotated[int, BeforeValidator(parse_duration_ms), Field(gt=0)]
#: An offset from the start of the run: a duration that may be 0.
Offset = Annotated[int, BeforeValidator(_offset), Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Timed(_Strict):
    """Every pattern may start late and stop early (offsets from the start of the run)."""

    start: Offset = 0
    stop: Duration | None = None


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


class Scenario(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str = ""
    duration: Duration
    tick: Duration = 30_000
    pool: PoolSpec
    keys: list[KeySpec] = Field(min_length=1)

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


#: The built-ins whose keys are made here rather than listed in ``builtins.yaml``.
_GENERATED_KEYS: dict[str, Callable[[], list[dict[str, object]]]] = {
    "many-keys": _many_keys,
    "tiny-keys": _tiny_keys,
}


@functools.cache
def _builtin_data() -> dict[str, dict[str, object]]:
    """The built-in scenarios by name, in their listed order: data, so they are kept as data
    (``builtins.yaml``, read once), with the generated keys filled in."""
    text = resources.files(__package__).joinpath("builtins.yaml").read_text(encoding="utf-8")
    data: dict[str, dict[str, object]] = yaml.load(text, Loader=_Loader)
    for name, keys in _GENERATED_KEYS.items():
        data[name]["keys"] = keys()
    return data


def builtin_names() -> tuple[str, ...]:
    return tuple(_builtin_data())


def builtin(name: str) -> Scenario:
    data = _builtin_data().get(name)
    if data is None:
        known = ", ".join(builtin_names())
        raise ScenarioError(f"unknown built-in scenario {name!r} (known: {known})")
    full: dict[str, object] = {"name": name, "tick": "30s", "pool": _BASE_POOL, **data}
    return parse_scenario(full, f"built-in {name}")


def builtins() -> tuple[Scenario, ...]:
    return tuple(builtin(n) for n in builtin_names())
