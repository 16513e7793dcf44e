"""Provider saturation signals and account buckets (SPEC §5). Pure apart from the injected clock.

Our counters only see traffic that went through this gateway; the provider sees everything
(other tools on the same account, other replicas before they synced). Its rate-limit headers are
therefore the better judge of how full an account is:

- ``SaturationSignals`` keeps the latest used fraction per connection and limit until a newer
  reading replaces it or the provider's own reset time for that limit passes (a Codex 5-hour
  reading holds until its ``reset-at``, an OpenAI request limit until its ``reset-requests``;
  a limit stated without a reset holds ``ttl_ms``, 30 s), and hands the fair-share engine, per
  pool dimension, the fullest member's fraction; the engine takes the max of that and its own
  total/limit, so a pool goes strict when the provider says it is filling, and stays so after
  an idle spell until the provider's window really resets (issue 44, item 6).
- ``AccountBuckets`` remembers, per connection, whether the 5-hour, 7-day or per-model-family
  7-day subscription window is exhausted, or the request or token limit of the model's family
  (OpenAI's ``x-ratelimit-*``, Anthropic's ``anthropic-ratelimit-*``: remaining 0), so
  quota-share routing moves that connection to the tail until the window resets.
- ``SingleFlight`` lets concurrent requests that miss a signal share one fetch of it.

Memory is bounded: both stores are plain dicts keyed by connection id, capped at
``max_connections`` entries; past the cap the least recently updated connection is dropped (a
dict keeps insertion order and an update re-inserts). Buckets per connection are capped at
``MAX_BUCKETS_PER_CONNECTION`` by dropping the least recently observed ``7d:<family>`` bucket;
``5h`` and ``7d`` are never dropped.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, cast

from fairgate.clock import Clock
from fairgate.domain.readings import RateLimitSnapshot, count_limits

__all__ = [
    "LIMIT_BUCKET",
    "AccountBuckets",
    "BucketState",
    "SaturationSignals",
    "SingleFlight",
    "family_of",
]

T = TypeVar("T")

DEFAULT_TTL_MS = 30_000
DEFAULT_MAX_CONNECTIONS = 10_000
MAX_BUCKETS_PER_CONNECTION = 32
#: The provider refused with its account's usage limit (Codex ``usage_limit_reached``, a
#: structured temporary-quota code on a 429), until the reset it stated.
LIMIT_BUCKET = "limit"
_CORE_BUCKETS = frozenset({"5h", "7d", LIMIT_BUCKET})


def _touch(store: dict[str, Any], key: str, value: Any, cap: int) -> None:
    """Insert ``key`` as the most recent entry, evicting the least recent past ``cap``."""
    store.pop(key, None)
    store[key] = value
    while len(store) > cap:
        del store[next(iter(store))]


@dataclass(frozen=True, slots=True)
class _Reading:
    """A connection's latest fraction per limit and until when each holds (the provider's
    reset, else the reading's time + ttl)."""

    fractions: dict[str, float]
    until: dict[str, int]

    @property
    def expires_ms(self) -> int:
        return max(self.until.values())

    @property
    def first_expiry_ms(self) -> int:
        return min(self.until.values())


def _fractions_until(
    snap: RateLimitSnapshot, now_ms: int, ttl_ms: int
) -> dict[str, tuple[float, int]]:
    """``{"requests" | "tokens" | "percent/<window>": (used fraction, holds until)}``: until the
    limit's stated reset when it is ahead, else ``ttl_ms`` from now."""

    def until(reset_ms: int | None) -> int:
        return reset_ms if reset_ms is not None and reset_ms > now_ms else now_ms + ttl_ms

    out = {unit: (used, until(reset)) for unit, (used, reset) in count_limits(snap).items()}
    for reading in snap.percent_windows:
        key = reading.counter
        prev = out.get(key)
        used = reading.used if prev is None else max(prev[0], reading.used)
        out[key] = (used, until(reading.reset_ms))
    return out


class _PoolAnswer(NamedTuple):
    """What :meth:`SaturationSignals.for_pool` answered, and for how long it holds."""

    version: int
    until_ms: int
    fractions: Mapping[str, float]


class SaturationSignals:
    """The provider's used fraction per connection and dimension, held until the limit's
    stated reset (``ttl_ms`` when none is stated)."""

    __slots__ = ("_clock", "_max", "_memo", "_readings", "_version", "ttl_ms")

    def __init__(
        self,
        clock: Clock,
        ttl_ms: int = DEFAULT_TTL_MS,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self._clock = clock
        self.ttl_ms = ttl_ms
        self._max = max_connections
        self._readings: dict[str, _Reading] = {}
        #: bumped whenever a reading is added, replaced or dropped: what :meth:`for_pool`
        #: answered stays true until then or until its oldest reading expires
        self._version = 0
        #: (connections, dimension keys) → (version, valid until, answer)
        self._memo: dict[tuple[tuple[str, ...], tuple[str, ...]], _PoolAnswer] = {}

    @property
    def empty(self) -> bool:
        """No connection's reading is held (every fraction is 0)."""
        return not self._readings

    def update(self, connection_id: str, snap: RateLimitSnapshot) -> None:
        """Record a response's snapshot: each limit it reports replaces that limit's previous
        reading; the limits it does not report keep theirs (until their own reset)."""
        now = self._clock.now_ms()
        found = _fractions_until(snap, now, self.ttl_ms)
        if not found:
            return
        old = self._fresh(connection_id, now)
        fractions = (
            {} if old is None else {k: v for k, v in old.fractions.items() if old.until[k] >= now}
        )
        until = {} if old is None else {k: old.until[k] for k in fractions}
        for key, (used, holds) in found.items():
            fractions[key], until[key] = used, holds
        _touch(self._readings, connection_id, _Reading(fractions, until), self._max)
        self._version += 1

    def _fresh(self, connection_id: str, now_ms: int) -> _Reading | None:
        reading = self._readings.get(connection_id)
        if reading is None:
            return None
        if now_ms > reading.expires_ms:
            del self._readings[connection_id]  # every limit reset: drop lazily
            self._version += 1
            return None
        return reading

    @staticmethod
    def _pick(reading: _Reading, unit: str, window: str, now_ms: int) -> float:
        if unit == "percent":
            key = f"percent/{window}"
        elif unit in ("requests", "tokens"):
            key = unit
        else:
            return 0.0
        held = reading.until.get(key)
        return reading.fractions[key] if held is not None and now_ms <= held else 0.0

    def fraction(self, connection_id: str, unit: str, window: str) -> float:
        """Used fraction the provider reported for ``unit``/``window`` on this connection.

        ``percent/<window>`` ← the provider's reading of that window (Anthropic unified 5h/7d,
        Codex primary/secondary named by their length); ``requests/*``
        and ``tokens/*`` ← 1 - remaining/limit (the provider's own window, whatever ours is).
        0.0 when unknown, or past the limit's reset (or, without one, older than the ttl).
        """
        now = self._clock.now_ms()
        reading = self._fresh(connection_id, now)
        return 0.0 if reading is None else self._pick(reading, unit, window, now)

    def for_pool(
        self, connection_ids: tuple[str, ...], dimension_keys: tuple[str, ...]
    ) -> Mapping[str, float]:
        """``{"<unit>/<window>": fraction}`` for every key: the fullest member connection wins,
        because a pool's members share one plan and the first to fill limits the pool.

        Every governed admission asks, and a connection's reading changes at most once a
        second (:class:`~fairgate.path.provider_signals.ProviderSignals` parses no more
        often), so the answer is kept per pool shape and given again until a reading changes
        or the oldest one it was built from expires: a version check and a clock read instead
        of a walk of the readings. The answer is shared: callers only read it."""
        if not self._readings:  # no provider reported anything: no clock read, no walk
            return dict.fromkeys(dimension_keys, 0.0)
        now = self._clock.now_ms()
        memo_key = (connection_ids, dimension_keys)
        hit = self._memo.get(memo_key)
        if hit is not None and hit.version == self._version and now <= hit.until_ms:
            return hit.fractions
        found = [r for c in connection_ids if (r := self._fresh(c, now)) is not None]
        out: dict[str, float] = {}
        for key in dimension_keys:
            unit, _, window = key.partition("/")
            out[key] = max((self._pick(r, unit, window, now) for r in found), default=0.0)
        # the answer holds until the first limit it was built from resets
        until = min((r.first_expiry_ms for r in found), default=now)
        if len(self._memo) >= self._max:
            self._memo.clear()  # bounded: one entry per pool shape in use
        self._memo[memo_key] = _PoolAnswer(self._version, until, out)
        return out

    def forget(self, connection_id: str) -> None:
        if self._readings.pop(connection_id, None) is not None:
            self._version += 1


class SingleFlight:
    """Concurrent calls for the same key share one execution of ``fn``.

    The fetch runs in its own task, so a caller that is cancelled (its client went away) does
    not cancel the fetch the other callers are waiting for. The key is free again as soon as the
    fetch ends, so later calls fetch afresh (caching the result is the caller's business).
    """

    __slots__ = ("_inflight",)

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def do(self, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(fn())
            self._inflight[key] = fut
            fut.add_done_callback(functools.partial(self._done, key))
        return cast(T, await asyncio.shield(fut))

    def _done(self, key: str, fut: asyncio.Future[Any]) -> None:
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if not fut.cancelled():
            fut.exception()  # mark retrieved: every waiter may have gone away


# -- account buckets ----------------------------------------------------------------------------

_DATE_SUFFIX = re.compile(r"(?:[-@_](?:\d{8}|\d{4}-\d{2}-\d{2}|\d{4})|-latest)$")
_CLAUDE_FAMILY = re.compile(r"(?:^|[-_.])(opus|sonnet|haiku)(?:$|[-_.])")


def family_of(model: str) -> str | None:
    """The model's family codename, for the per-family weekly bucket ``7d:<family>``.

    Claude models → ``opus`` / ``sonnet`` / ``haiku`` whatever the version and naming order
    (``claude-3-5-sonnet-20241022``, ``claude-opus-4-1``). Other models → the id without its
    ``provider/`` prefix, date or ``-latest`` suffix, lower-cased (``gpt-4o-2024-08-06`` →
    ``gpt-4o``, ``o3-2025-04-16`` → ``o3``, ``gpt-4o-mini`` stays ``gpt-4o-mini``: it has its own
    limits). None for an empty id.
    """
    name = model.strip().lower().rpartition("/")[2]
    name = name.partition(":")[0]  # Bedrock-style "...-v1:0" or Ollama-style ":8b" tags
    m = _CLAUDE_FAMILY.search(name)
    if m is not None:
        return m.group(1)
    prev = None
    while prev != name:
        prev = name
        name = _DATE_SUFFIX.sub("", name)
    return name or None


@dataclass(frozen=True, slots=True)
class BucketState:
    """One window's last reading: used fraction, and when it resets (None = unknown)."""

    used: float
    reset_ms: int | None
    at_ms: int

    @property
    def saturated(self) -> bool:
        return self.used >= 1.0


class AccountBuckets:
    """Per-connection 5h / 7d / 7d:<family> / requests:<family> / tokens:<family> saturation
    (SPEC §5). Request and token limits are per model at OpenAI and Anthropic, hence per
    family: a full ``gpt-4o`` limit does not push the connection back for ``gpt-4o-mini``.

    A bucket is saturated when its last reading is ≥ 1.0. It clears lazily: when its reset time
    has passed (checked on read), or when a reading < 1.0 arrives. A saturated bucket with an
    unknown reset stays saturated until a lower reading comes.
    """

    __slots__ = ("_buckets", "_clock", "_max")

    def __init__(self, clock: Clock, *, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self._clock = clock
        self._max = max_connections
        self._buckets: dict[str, dict[str, BucketState]] = {}

    def observe(
        self, connection_id: str, bucket: str, used_fraction: float, reset_ms: int | None
    ) -> None:
        buckets = self._buckets.get(connection_id)
        if buckets is None:
            buckets = {}
        state = BucketState(float(used_fraction), reset_ms, self._clock.now_ms())
        buckets.pop(bucket, None)
        buckets[bucket] = state
        if len(buckets) > MAX_BUCKETS_PER_CONNECTION:
            # drop the least recently observed family bucket; 5h and 7d always stay
            oldest = next(k for k in buckets if k not in _CORE_BUCKETS)
            del buckets[oldest]
        _touch(self._buckets, connection_id, buckets, self._max)

    def observe_snapshot(self, connection_id: str, model: str, snap: RateLimitSnapshot) -> None:
        """The 5h reading (Anthropic unified or Codex) → ``5h``; the weekly one → ``7d`` and,
        when the model has a family, ``7d:<family>``; the request and token limits (OpenAI's
        ``x-ratelimit-*``, with their ``6m0s``-style resets) → ``requests:<family>`` and
        ``tokens:<family>``."""
        family = family_of(model)
        for unit, (used, reset_ms) in count_limits(snap).items():
            self.observe(connection_id, f"{unit}:{family or '*'}", used, reset_ms)
        five = snap.window("5h")
        if five is not None:
            self.observe(connection_id, "5h", five.used, five.reset_ms)
        week = snap.window("weekly")
        if week is not None:
            self.observe(connection_id, "7d", week.used, week.reset_ms)
            if family is not None:
                self.observe(connection_id, f"7d:{family}", week.used, week.reset_ms)

    def limit_reached(
        self, connection_id: str, model: str, reset_ms: int, *, model_scoped: bool
    ) -> None:
        """The provider refused: the account's usage limit is reached until ``reset_ms``
        (``limit``, or ``limit:<family>`` when the provider named one model's limit). Unlike
        a resilience cooldown (capped at an hour, see docs/security.md) it lasts until the
        stated reset, which for a weekly window is days: the connection stays at the tail."""
        family = family_of(model) if model_scoped else None
        name = LIMIT_BUCKET if family is None else f"{LIMIT_BUCKET}:{family}"
        self.observe(connection_id, name, 1.0, reset_ms)

    def _saturated(self, buckets: dict[str, BucketState], name: str, now_ms: int) -> bool:
        state = buckets.get(name)
        if state is None or not state.saturated:
            return False
        if state.reset_ms is not None and now_ms >= state.reset_ms:
            del buckets[name]  # the window reset: clear lazily
            return False
        return True

    def is_saturated(self, connection_id: str, model: str) -> bool:
        """Whether any of ``5h``, ``7d``, ``limit``, ``7d:<family(model)>``,
        ``limit:<family>``, ``requests:<family>`` or ``tokens:<family>`` is exhausted now."""
        buckets = self._buckets.get(connection_id)
        if not buckets:
            return False
        now = self._clock.now_ms()
        for name in ("5h", "7d", LIMIT_BUCKET):
            if self._saturated(buckets, name, now):
                return True
        family = family_of(model)
        limits = family or "*"
        if self._saturated(buckets, f"requests:{limits}", now) or self._saturated(
            buckets, f"tokens:{limits}", now
        ):
            return True
        return family is not None and (
            self._saturated(buckets, f"7d:{family}", now)
            or self._saturated(buckets, f"{LIMIT_BUCKET}:{family}", now)
        )

    def saturated_until(self, connection_id: str, model: str) -> int | None:
        """When the connection can serve ``model`` again by its account's own windows: the
        latest stated reset among its saturated buckets (the ones :meth:`is_saturated` reads);
        None when none is saturated or none stated its reset. A resilience cooldown is capped
        at an hour; this is what the provider said (issue 44, item 4)."""
        buckets = self._buckets.get(connection_id)
        if not buckets:
            return None
        now = self._clock.now_ms()
        family = family_of(model)
        names = ["5h", "7d", LIMIT_BUCKET, f"requests:{family or '*'}", f"tokens:{family or '*'}"]
        if family is not None:
            names += [f"7d:{family}", f"{LIMIT_BUCKET}:{family}"]
        resets = [
            state.reset_ms
            for name in names
            if self._saturated(buckets, name, now)
            and (state := buckets.get(name)) is not None
            and state.reset_ms is not None
        ]
        return max(resets, default=None)

    def buckets(self, connection_id: str) -> dict[str, BucketState]:
        """A copy of the connection's buckets (for the dashboard and health API)."""
        return dict(self._buckets.get(connection_id, {}))

    def forget(self, connection_id: str) -> None:
        self._buckets.pop(connection_id, None)
