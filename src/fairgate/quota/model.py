"""Plain, immutable domain data of the quota engine: dimensions, plans, allocations, pools.

Nothing here does I/O or reads the time; the engine and the stores pass these values around.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fairgate.domain.units import UNKNOWN_LIMIT, Unit, Window, WindowAnchor
from fairgate.quota.hold import NO_HOLD, HoldSettings


class Policy(StrEnum):
    HARD = "hard"
    SOFT = "soft"
    BURST = "burst"

    @classmethod
    def parse(cls, value: object) -> Policy:
        """Any stored value that is not a known policy is enforced as hard (the safe reading)."""
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                return cls.HARD
        return cls.HARD


class ShareMode(StrEnum):
    STATIC = "static"
    ACTIVE = "active"


@dataclass(frozen=True, slots=True)
class Dimension:
    unit: Unit
    window: Window
    limit: float
    anchor: WindowAnchor = WindowAnchor.PROVIDER
    #: stable name used by the counters, e.g. ``requests/hourly`` (formatted once, not per
    #: request: every admission, settle and signal lookup reads it)
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.unit.value}/{self.window.value}")

    @property
    def known(self) -> bool:
        return self.limit > UNKNOWN_LIMIT

    @property
    def window_ms(self) -> int:
        return self.window.ms

    @property
    def provider_anchored(self) -> bool:
        """Whether the window follows the provider's stated reset once a reading gives one
        (``fairgate.quota.window``): percent windows are a subscription's, counted from the
        account's first use; requests, tokens and usd stay epoch-aligned, and so does a percent
        window configured with ``window_anchor: epoch``."""
        return self.unit is Unit.PERCENT and self.anchor is WindowAnchor.PROVIDER


def unenforced_message(dims: tuple[Dimension, ...]) -> str | None:
    """The warning for dimensions that are all unknown (≤ ``UNKNOWN_LIMIT``), or None."""
    if not dims or any(d.known for d in dims):
        return None
    return (
        f"every limit is 0 or below {UNKNOWN_LIMIT:g} (unknown): nothing is enforced; "
        "set the real limits to share this quota"
    )


class LimitBasis(StrEnum):
    """What a pool's dimension was written as (issue 48, item 3).

    ``pool``: the pool's whole limit, enforced as written however many connections it has (a
    pool's own ``dimensions`` in requests, tokens or usd). ``per-connection``: one account's
    limit, which the pool has once per member connection: a plan's (catalogue or a connection's
    override: a plan is an account's), and any percent dimension (a percent is of one account's
    window: ``100`` is each account's whole window). The pool enforces ``limit × members`` of
    those; every surface shows that enforced number."""

    POOL = "pool"
    PER_CONNECTION = "per-connection"


def limit_basis(dim: Dimension, *, from_plan: bool) -> LimitBasis:
    """The basis of ``dim`` written in a plan (``from_plan``) or as a pool's own (see
    :class:`LimitBasis`)."""
    if from_plan or dim.unit is Unit.PERCENT:
        return LimitBasis.PER_CONNECTION
    return LimitBasis.POOL


def pool_limits(
    written: Iterable[Dimension], *, from_plan: bool, members: int
) -> tuple[tuple[Dimension, ...], frozenset[str]]:
    """The dimensions a pool of ``members`` connections enforces, from those written for it
    (its own, or its first connection's plan: ``from_plan``), and the keys of those whose
    written limit is per connection (multiplied by ``members`` here, once: nothing downstream
    multiplies again)."""
    out: list[Dimension] = []
    per_connection: set[str] = set()
    n = max(1, members)
    for d in written:
        if limit_basis(d, from_plan=from_plan) is LimitBasis.PER_CONNECTION:
            per_connection.add(d.key)
            out.append(Dimension(d.unit, d.window, d.limit * n, d.anchor))
        else:
            out.append(d)
    return tuple(out), frozenset(per_connection)


class PlanSource(StrEnum):
    """Where a connection's plan came from: an admin override, the built-in catalog, or
    nowhere (no known limits)."""

    OVERRIDE = "override"
    CATALOG = "catalog"
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class Plan:
    dimensions: tuple[Dimension, ...]
    source: PlanSource


@dataclass(frozen=True, slots=True)
class ModelCap:
    """A per-(key, model) cap over an hourly window; blocks only that model for that key."""

    model: str
    unit: Unit
    limit: float

    @property
    def key(self) -> str:
        return f"model:{self.model}:{self.unit.value}/hourly"

    @property
    def known(self) -> bool:
        return self.limit > UNKNOWN_LIMIT


@dataclass(frozen=True, slots=True)
class Allocation:
    key_id: str
    weight: float = 0.0
    cap_value: float | None = None
    cap_unit: Unit | None = None
    policy: Policy = Policy.HARD
    model_caps: tuple[ModelCap, ...] = ()

    def cap_for(self, unit: Unit) -> float | None:
        """The absolute cap applies only to dimensions of its own unit. A cap at or below
        ``UNKNOWN_LIMIT`` is unknown, as a dimension's limit is: no cap, never "block all"."""
        cap = self.cap_value
        if cap is not None and cap > UNKNOWN_LIMIT and self.cap_unit == unit:
            return cap
        return None

    def model_cap(self, model: str | None) -> tuple[ModelCap, ...]:
        """This model's caps that are known (a limit ≤ ``UNKNOWN_LIMIT`` caps nothing)."""
        if model is None:
            return ()
        return tuple(c for c in self.model_caps if c.model == model and c.known)


@dataclass(frozen=True, slots=True)
class Pool:
    id: str
    name: str
    provider: str
    connections: tuple[str, ...]
    dimensions: tuple[Dimension, ...]
    allocations: tuple[Allocation, ...] = ()
    share_mode: ShareMode = ShareMode.STATIC
    active_window_ms: int = 15 * 60_000
    #: keys of the dimensions written per connection (:class:`LimitBasis`): their ``limit``
    #: above is already the pool's (× members, :func:`pool_limits`); kept to say so
    per_connection: frozenset[str] = frozenset()
    #: what a request that does not fit gets: refused at once, or held (quota/hold.py)
    hold: HoldSettings = NO_HOLD
    _by_key: Mapping[str, Allocation] = field(default_factory=dict, compare=False, repr=False)
    _equal_weight: float | None = field(default=None, compare=False, repr=False)
    _enforced: tuple[Dimension, ...] = field(default=(), compare=False, repr=False)
    _cost_units: frozenset[Unit] = field(default=frozenset(), compare=False, repr=False)
    _keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        # derived once so per-request lookups stay O(1) however many keys share the pool
        object.__setattr__(self, "_by_key", {a.key_id: a for a in self.allocations})
        object.__setattr__(self, "_enforced", tuple(d for d in self.dimensions if d.known))
        object.__setattr__(self, "_keys", tuple(d.key for d in self.dimensions))
        units = {d.unit for d in self._enforced}
        units.update(c.unit for a in self.allocations for c in a.model_caps if c.known)
        object.__setattr__(self, "_cost_units", frozenset(units))
        if self.allocations and all(a.weight <= 0 for a in self.allocations):
            object.__setattr__(self, "_equal_weight", 100.0 / len(self.allocations))

    @property
    def members(self) -> int:
        return max(1, len(self.connections))

    def basis(self, dim: Dimension) -> LimitBasis:
        """Whether ``dim``'s limit was written per connection or for the whole pool."""
        return LimitBasis.PER_CONNECTION if dim.key in self.per_connection else LimitBasis.POOL

    def written_limit(self, dim: Dimension) -> float:
        """``dim``'s limit as written: one connection's for a per-connection dimension (the
        pool enforces ``dim.limit``, that times its members), else the pool's."""
        if dim.key in self.per_connection:
            return dim.limit / self.members
        return dim.limit

    def allocation(self, key_id: str) -> Allocation | None:
        return self._by_key.get(key_id)

    def weight_of(self, key_id: str) -> float:
        """Weight in percent; if every allocation is 0, each counts as 100/n."""
        alloc = self._by_key.get(key_id)
        if alloc is None:
            return 0.0
        if self._equal_weight is not None:
            return self._equal_weight
        return max(0.0, alloc.weight)

    def enforced_dimensions(self) -> tuple[Dimension, ...]:
        return self._enforced

    @property
    def dimension_keys(self) -> tuple[str, ...]:
        """Every dimension's key (``<unit>/<window>``), in order."""
        return self._keys

    @property
    def cost_units(self) -> frozenset[Unit]:
        """The units an admission to this pool reads a cost in (its enforced dimensions' and
        its known model caps'): a request's cost in any other unit is never looked at, so the
        request path need not work it out (a price lookup, a percent estimate)."""
        return self._cost_units

    @property
    def unenforced_warning(self) -> str | None:
        """Why this pool enforces nothing, for ``/health``, the start log and ``fairgate config
        check``; else None. Either it has no dimensions at all (its provider has no plan in
        the catalogue, e.g. ``openai``, and neither the pool nor its first connection's plan
        sets any: a newcomer's pool that silently shares nothing), or every limit is unknown
        (say a manual plan of zeros)."""
        if not self.dimensions:
            return (
                f"no limits: provider '{self.provider}' has no plan in the catalogue and "
                "neither the pool's dimensions nor its first connection's plan set any, so "
                "nothing is enforced; set the pool's dimensions (or the connection's plan)"
            )
        if not self._enforced:
            return unenforced_message(self.dimensions)
        return None


def unenforced_pools(pools: Iterable[Pool]) -> list[str]:
    """``pool <id>: <why>`` for each pool that enforces nothing (see
    :attr:`Pool.unenforced_warning`): the one wording of every place that reports them."""
    return [f"pool {p.id}: {p.unenforced_warning}" for p in pools if p.unenforced_warning]
