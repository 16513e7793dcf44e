"""Quota-share routing for the hidden ``qtSd/<pool>/<model>`` combos (SPEC §7).

A pool shares one plan over several member connections (accounts) of a provider. fairgate mints
one internal combo per (pool, model) with one target per member, and orders those targets for
each request in four steps, never dropping one (the request always has somewhere to go):

1. **Bucket gating.** Connections whose 5h / 7d / 7d:<family> account bucket is saturated
   (``AccountBuckets.is_saturated``) go to the tail. If *all* are saturated, all count — the
   provider may still take the request, and refusing it here would be worse.
2. **Concurrency caps.** Among the rest, connections at their ``max_concurrent`` (null or ≤ 0 =
   unlimited) go after the ones with room. If none has room, all count.
3. **Deficit round robin** over the connections with room: every selection adds each one's
   quantum ``wᵢ / Σw`` (a non-positive weight counts 1) to its deficit; the highest deficit wins
   (ties → input order). Over time each connection's share of requests is its weight's share,
   deterministically — no random streaks.
4. **Power of two choices.** The DRR winner is compared with the runner-up in DRR order; the
   one with *strictly* fewer requests in flight goes first. This steers around a connection
   that is momentarily busy (a long stream) without overriding DRR when loads are equal.

Final order: P2C winner, the rest with room (DRR order), the at-cap ones, the saturated ones.

Worked DRR example, weights H = 2, L = 1 (quanta 2/3 and 1/3), each request charged to its
winner:

=========  ============================  ======  ====================
request    deficits after adding quanta  winner  after the charge −1
=========  ============================  ======  ====================
1          H 0.667   L 0.333             H       H −0.333   L 0.333
2          H 0.333   L 0.667             L       H 0.333    L −0.333
3          H 1.000   L 0.000             H       H 0.000    L 0.000
=========  ============================  ======  ====================

After three requests the deficits are back to zero, so the pattern repeats: H L H H L H H L H …
— exactly two H for every L.

**[better]** points, and why:

- *In-flight counts are per request and always decremented.* :class:`InflightTracker` hands out
  a :class:`Lease` per dispatched request; ``release()`` is idempotent and the lease is a context
  manager, so ``with tracker.acquire(target): …`` returns the count to where it was on success,
  error, cancellation and client disconnect alike. A count that leaked would make P2C avoid a
  healthy connection forever.
- *DRR is charged to the target actually dispatched.* Ordering only *adds quanta*; the charge of
  −1 is applied by the executor through the :class:`DrrTicket` of the selection, to the target
  that served the request (the last one dispatched — after P2C or a fallthrough that may not be
  the DRR winner). Charging the winner regardless would make DRR's books disagree with the real
  traffic whenever P2C or a failure moved a request elsewhere. So that concurrent requests
  selected before the first is dispatched still spread out, a selection places a provisional
  *hold* of −1 on its winner until its ticket is closed (holds also expire after
  ``hold_ttl_ms``, so a ticket that is never closed cannot skew DRR for long).
- *DRR state is bounded.* Deficits live per combo in an LRU (``OrderedDict``, ``max_combos``);
  members that left the pool are pruned on the next selection and deficits are clamped to
  ±``DEFICIT_BOUND`` so missed or extra charges can never make them drift without limit.
- *quota-share is internal.* Only combos built with ``internal=True`` may use it; the registry
  rejects it (and the ``qtSd/`` prefix) for user combos.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, Self

from fairgate.routing.combo import Combo
from fairgate.routing.model import QTSD_PREFIX, ComboConfig, Target

__all__ = [
    "DEFICIT_BOUND",
    "BucketReader",
    "DrrState",
    "DrrTicket",
    "InflightTracker",
    "Lease",
    "PoolMember",
    "QuotaShareResult",
    "is_internal",
    "parse_qtsd",
    "qtsd_name",
    "quota_share_combo",
    "saturation_gate",
    "select_quota_share",
]

#: Deficits are clamped to ±this. DRR never needs more than a few units of credit; the clamp
#: only matters if charges and selections ever stop matching up.
DEFICIT_BOUND = 16.0
_TIE = 9  # deficits equal to 9 decimals are a tie (float noise must not break input order)


# -- names --------------------------------------------------------------------------------------


def qtsd_name(pool_id: str, model: str) -> str:
    """``qtSd/<pool>/<model>``, the hidden combo of a pool for one model."""
    if not pool_id or "/" in pool_id:
        raise ValueError(f"pool id must be non-empty and contain no '/', got {pool_id!r}")
    if not model:
        raise ValueError("model must not be empty")
    return f"{QTSD_PREFIX}{pool_id}/{model}"


def is_internal(name: str) -> bool:
    """Whether a combo name belongs to the system (not user-selectable, not editable)."""
    return name.startswith(QTSD_PREFIX)


def parse_qtsd(name: str) -> tuple[str, str] | None:
    """``(pool_id, model)`` of a ``qtSd/`` name (the model may contain ``/``), else None."""
    if not is_internal(name):
        return None
    pool, sep, model = name[len(QTSD_PREFIX) :].partition("/")
    return (pool, model) if sep and pool and model else None


class PoolMember(Protocol):
    """What minting reads of a member connection (``fairgate.domain.connections.Connection``)."""

    @property
    def id(self) -> str: ...

    @property
    def provider(self) -> str: ...

    @property
    def weight(self) -> float: ...

    @property
    def enabled(self) -> bool: ...

    def serves(self, model: str) -> bool: ...


def quota_share_combo(
    pool_id: str, model: str, members: Iterable[PoolMember], config: ComboConfig | None = None
) -> Combo | None:
    """The internal combo for (pool, model): one target per enabled member that serves the
    model, weighted by the connection's weight. None when no member qualifies. Call it again
    whenever the pool or its connections change (it is cheap and pure)."""
    targets = tuple(
        Target(provider=m.provider, model=model, connection_id=m.id, weight=m.weight)
        for m in members
        if m.enabled and m.serves(model)
    )
    if not targets:
        return None
    return Combo(
        name=qtsd_name(pool_id, model),
        strategy="quota-share",
        targets=targets,
        config=config or ComboConfig(),
        internal=True,
    )


class BucketReader(Protocol):
    def is_saturated(self, connection_id: str, model: str) -> bool: ...


def saturation_gate(buckets: BucketReader, model: str) -> Callable[[Target], bool]:
    """``saturated`` for :func:`select_quota_share` from ``AccountBuckets``."""

    def saturated(t: Target) -> bool:
        return t.connection_id is not None and buckets.is_saturated(t.connection_id, model)

    return saturated


# -- in-flight ----------------------------------------------------------------------------------


class _EndsWithBlock:
    """A hold that a ``with`` block gives back on every path, streams and failures included:
    ``__exit__`` runs the subclass's idempotent :meth:`_end` (one place for the protocol)."""

    __slots__ = ()

    def _end(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()


class Lease(_EndsWithBlock):
    """One request's slot on a connection. ``release()`` is idempotent; use it as a context
    manager (or in ``finally``) so it runs on every path, streams and failures included."""

    __slots__ = ("_key", "_released", "_tracker")

    def __init__(self, tracker: InflightTracker, key: str) -> None:
        self._tracker = tracker
        self._key = key
        self._released = False

    @property
    def key(self) -> str:
        return self._key

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._tracker._release(self._key)

    def _end(self) -> None:
        self.release()


class InflightTracker:
    """Requests in flight per connection (``Target.load_key``). Entries at zero are removed,
    so memory is bounded by the number of busy connections. Event-loop only (not thread-safe).
    """

    __slots__ = ("_counts", "on_release")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        #: called with the load key after every release (the concurrency queue's wake-up)
        self.on_release: Callable[[str], None] | None = None

    def acquire(self, target: Target) -> Lease:
        key = target.load_key
        self._counts[key] = self._counts.get(key, 0) + 1
        return Lease(self, key)

    def _release(self, key: str) -> None:
        n = self._counts.get(key, 0) - 1
        if n > 0:
            self._counts[key] = n
        else:
            self._counts.pop(key, None)
        if self.on_release is not None:
            self.on_release(key)

    def count(self, target: Target) -> int:
        return self._counts.get(target.load_key, 0)

    def snapshot(self, targets: Iterable[Target]) -> dict[str, int]:
        """``{target.key: in-flight}`` — the ``RouteInput.inflight`` mapping."""
        return {t.key: self._counts.get(t.load_key, 0) for t in targets}

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def __len__(self) -> int:
        return len(self._counts)


# -- DRR ----------------------------------------------------------------------------------------


class _ComboDrr:
    __slots__ = ("deficits", "held", "holds")

    def __init__(self) -> None:
        self.deficits: dict[str, float] = {}
        self.holds: dict[int, tuple[str, int]] = {}  # ticket id → (target key, expires at ms)
        self.held: dict[str, int] = {}  # target key → open holds

    def add_hold(self, ticket_id: int, key: str, expires_ms: int) -> None:
        self.holds[ticket_id] = (key, expires_ms)
        self.held[key] = self.held.get(key, 0) + 1

    def drop_hold(self, ticket_id: int) -> None:
        hold = self.holds.pop(ticket_id, None)
        if hold is not None:
            n = self.held.get(hold[0], 0) - 1
            if n > 0:
                self.held[hold[0]] = n
            else:
                self.held.pop(hold[0], None)


class DrrTicket(_EndsWithBlock):
    """The charge of one quota-share selection. The executor calls :meth:`dispatch` with each
    target it actually sends the request to and :meth:`close` when the request is over (or
    uses the ticket as a context manager): the *last* dispatched target — the one that served,
    or the last one tried — is charged −1 and the provisional hold is dropped. If nothing was
    dispatched, nothing is charged. ``close()`` is idempotent."""

    __slots__ = ("_closed", "_combo", "_dispatched", "_drr", "_id", "winner")

    def __init__(self, drr: DrrState, combo: str, ticket_id: int, winner: Target) -> None:
        self._drr = drr
        self._combo = combo
        self._id = ticket_id
        self.winner = winner
        self._dispatched: Target | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dispatched(self) -> Target | None:
        return self._dispatched

    def dispatch(self, target: Target) -> None:
        if not self._closed:
            self._dispatched = target

    def charge(self, target: Target) -> None:
        """Dispatch ``target`` and close: charge it now."""
        self.dispatch(target)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drr._drop_hold(self._combo, self._id)
        if self._dispatched is not None:
            self._drr.charge(self._combo, self._dispatched)

    def _end(self) -> None:
        self.close()


class DrrState:
    """Deficit round robin deficits per combo name, LRU-bounded (see the module doc)."""

    __slots__ = ("_combos", "_ids", "hold_ttl_ms", "max_combos")

    def __init__(self, *, max_combos: int = 1_024, hold_ttl_ms: int = 60_000) -> None:
        if max_combos < 1:
            raise ValueError("max_combos must be ≥ 1")
        self.max_combos = max_combos
        self.hold_ttl_ms = hold_ttl_ms
        self._combos: OrderedDict[str, _ComboDrr] = OrderedDict()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._combos)

    def __contains__(self, combo: object) -> bool:
        return combo in self._combos

    def _entry(self, combo: str) -> _ComboDrr:
        entry = self._combos.get(combo)
        if entry is None:
            entry = _ComboDrr()
            self._combos[combo] = entry
            while len(self._combos) > self.max_combos:
                self._combos.popitem(last=False)
        else:
            self._combos.move_to_end(combo)
        return entry

    def rank(
        self,
        combo: str,
        eligible: Sequence[Target],
        now_ms: int,
        *,
        members: Iterable[Target] | None = None,
    ) -> list[Target]:
        """Add one round of quanta to ``eligible`` and return them by effective deficit
        (deficit − open holds), highest first, ties in input order. ``members``: the combo's
        full target list; deficits of anything else are pruned."""
        entry = self._entry(combo)
        if members is not None:
            keep = {t.key for t in members}
            for k in [k for k in entry.deficits if k not in keep]:
                del entry.deficits[k]
        for tid in [tid for tid, (_, exp) in entry.holds.items() if exp <= now_ms]:
            entry.drop_hold(tid)
        weights = [t.weight if t.weight > 0 else 1.0 for t in eligible]
        total = sum(weights)
        for t, w in zip(eligible, weights, strict=True):
            d = entry.deficits.get(t.key, 0.0) + w / total
            entry.deficits[t.key] = min(DEFICIT_BOUND, d)
        keyed = [
            (-round(entry.deficits[t.key] - entry.held.get(t.key, 0), _TIE), i, t)
            for i, t in enumerate(eligible)
        ]
        keyed.sort(key=lambda k: (k[0], k[1]))
        return [k[2] for k in keyed]

    def hold(self, combo: str, target: Target, now_ms: int) -> DrrTicket:
        """A provisional −1 on ``target`` until the returned ticket closes (or expires)."""
        tid = next(self._ids)
        self._entry(combo).add_hold(tid, target.key, now_ms + self.hold_ttl_ms)
        return DrrTicket(self, combo, tid, target)

    def _drop_hold(self, combo: str, ticket_id: int) -> None:
        entry = self._combos.get(combo)
        if entry is not None:
            entry.drop_hold(ticket_id)

    def charge(self, combo: str, target: Target) -> None:
        """−1 on the deficit of the target that was actually dispatched."""
        entry = self._entry(combo)
        d = entry.deficits.get(target.key, 0.0) - 1.0
        entry.deficits[target.key] = max(-DEFICIT_BOUND, d)

    def deficits(self, combo: str) -> dict[str, float]:
        entry = self._combos.get(combo)
        return {} if entry is None else dict(entry.deficits)

    def holds(self, combo: str) -> int:
        entry = self._combos.get(combo)
        return 0 if entry is None else len(entry.holds)

    def hold_count(self) -> int:
        """Open holds over every combo (each selection's hold is dropped when its request ends)."""
        return sum(len(e.holds) for e in self._combos.values())

    def forget(self, combo: str) -> None:
        self._combos.pop(combo, None)

    def clear(self) -> None:
        self._combos.clear()


# -- selection ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class QuotaShareResult:
    """``order``: every target, best first. ``winner`` = ``order[0]``. ``ticket``: close it
    (``with result.ticket:``) after calling ``ticket.dispatch(t)`` for each target sent to.
    ``saturated`` / ``at_cap``: target keys moved back, for diagnostics."""

    order: list[Target]
    winner: Target
    ticket: DrrTicket
    model: str
    saturated: tuple[str, ...] = field(default=())
    at_cap: tuple[str, ...] = field(default=())


def _at_cap(t: Target, max_concurrent: Mapping[str, int | None], inflight: InflightTracker) -> bool:
    if t.connection_id is None:
        return False
    cap = max_concurrent.get(t.connection_id)
    return cap is not None and cap > 0 and inflight.count(t) >= cap


def select_quota_share(
    targets: Sequence[Target],
    combo_name: str,
    model: str,
    now_ms: int,
    *,
    saturated: Callable[[Target], bool],
    max_concurrent: Mapping[str, int | None],
    inflight: InflightTracker,
    drr: DrrState,
) -> QuotaShareResult:
    """Order a quota-share combo's targets for one request (see the module doc).

    ``targets``: the combo's full member list — pass every member, also the ones cooling
    down (the executor skips those); a member left out has its DRR history pruned.
    ``saturated(target)``: its account bucket for ``model`` is exhausted (see
    :func:`saturation_gate`). ``max_concurrent``: per connection id. The only state this
    changes is one round of DRR quanta and a provisional hold on the winner; close
    ``result.ticket`` when the request is over.
    """
    if not targets:
        raise ValueError(f"quota-share combo {combo_name!r} has no targets")
    sat_flags = [saturated(t) for t in targets]
    if all(sat_flags):  # every bucket exhausted: gating would leave nothing, so all count
        gated, tail = list(targets), []
    else:
        gated = [t for t, s in zip(targets, sat_flags, strict=True) if not s]
        tail = [t for t, s in zip(targets, sat_flags, strict=True) if s]
    cap_flags = [_at_cap(t, max_concurrent, inflight) for t in gated]
    if all(cap_flags):  # nobody has room: all count
        room, capped = gated, []
    else:
        room = [t for t, c in zip(gated, cap_flags, strict=True) if not c]
        capped = [t for t, c in zip(gated, cap_flags, strict=True) if c]
    ranked = drr.rank(combo_name, room, now_ms, members=targets)
    if len(ranked) > 1 and inflight.count(ranked[1]) < inflight.count(ranked[0]):
        ranked[0], ranked[1] = ranked[1], ranked[0]
    winner = ranked[0]
    return QuotaShareResult(
        order=[*ranked, *capped, *tail],
        winner=winner,
        ticket=drr.hold(combo_name, winner, now_ms),
        model=model,
        saturated=tuple(t.key for t in tail),
        at_cap=tuple(t.key for t in capped),
    )
