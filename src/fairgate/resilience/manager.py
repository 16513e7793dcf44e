"""The resilience facade the proxy calls: may this target take a request, and what did we learn.

Three layers, each at its own scope (SPEC §9, the rate-limiting seed):

- provider circuit breaker (all connections and models of a provider): fed by server errors and
  timeouts, opens at ≥ 50 % failures over 60 s with ≥ 5 requests — and only on failures more
  than one key saw or no request explains (below) —, half-open with one probe;
- connection cooldown (one account / key): exponential backoff after rate limits, server errors,
  auth failures; the upstream's hint wins;
- model lockout (provider, connection, model): a limit that names one model (OpenAI's per-model
  TPM, Gemini's per-model quota), a model the connection does not have, and what the rate-limit
  headers say (``remaining: 0`` until the reset) so we stop before the 429 instead of after it.

Plus permanent blocks (billing, monthly quota, deactivated account): only :meth:`clear` (the
admin API) lifts them. A permanent block is set at once only on an account-level signal
(:attr:`Classification.account_level`: a 402, or a structured billing code on a
401/402/403/429, which no request text can produce). Any other permanent class needs
corroboration: failures from :data:`PERMANENT_QUORUM` distinct client keys within
:data:`PERMANENT_WINDOW_MS`; until then it is handled as a temporary quota (a cooldown with
backoff), so one key can never switch a shared connection off for good. A shadow copy
(:data:`SHADOW_KEY_SUFFIX`) counts as its client key: one key plus a shadow is one witness.

Whose failure it is (issue 43, N3): the breaker blacks out a provider for every pool, so it
must not open on what one tenant can cause on purpose — long generations that run into the
upstream timeout, streams it stalls until the upstream cuts them, 408/5xx its content provokes.
The caller says whether the request explains a failure (``request_explained``: its output
bound or size, or how long it ran, accounts for the timeout or break; see
``path/attempt.py``). Such a failure is that request's alone: no connection cooldown. Every
provider failure still enters the breaker's window, but the breaker may open only when the
window's failures are witnessed by :data:`BREAKER_WITNESSES` distinct client keys, or when one
of them is not explained by its request (a connect failure, a 5xx on a small quick request).
One key's failures, however many, never open it; a half-open probe that fails on one key's
explained failure gives the probe back instead of re-opening.

Who caused it: :meth:`on_failure` and :meth:`on_success` take the client key id and request
id of the request whose answer they learn from. Every cooldown, lockout, permanent block and
breaker opening they set is logged with both (WARNING, logger ``fairgate.resilience``) and
shown in :meth:`snapshot` as ``caused_by`` (ids only, never a secret; permanent blocks keep
it durably, the others in this process).

How the proxy uses it, per request::

    for target in candidates:
        excl = await mgr.check(target.provider, target.conn_id, target.model, target.auth_type)
        if excl is not None:
            skipped.append(excl)            # diagnostics; try the next target
            continue
        ... send upstream ...
        if ok:   await mgr.on_success(provider, conn_id, model, response_headers)
        else:    await mgr.on_failure(provider, conn_id, model, auth_type,
                                      classify(status, body, headers, model=model, now_ms=now),
                                      key_id=key.id, request_id=request_id)
    # nothing admitted: 429 if all_rate_limited(skipped) else 503,
    # Retry-After = retry_after_seconds(skipped, now)

Rate-limit scope rule: a 429 (or temporary quota) that names the model locks that model only
(other models of the account keep working); one that does not cools the whole connection down.
Rate limits do not feed the breaker by default (``breaker_counts_rate_limits``): they are one
account's limit, and a breaker opened by them would black out the provider's healthy accounts.

Everything expires lazily on read: no background task. Store errors (Redis down) fail open:
logged, counted in the health snapshot, and the request proceeds as if no state were set.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Literal, TypeVar

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.domain.breaker import BreakerState
from fairgate.domain.readings import RateLimitSnapshot, parse_rate_limit_headers
from fairgate.resilience.backoff import Cooldown, next_cooldown_ms
from fairgate.resilience.breaker import BreakerRecord, CircuitBreaker
from fairgate.resilience.classify import Classification, FailureClass
from fairgate.resilience.persistence import SqlitePersistence
from fairgate.resilience.settings import ResilienceSettings
from fairgate.resilience.state import (
    NO_STATE,
    MemoryResilienceStore,
    ResilienceStore,
    TargetState,
    connection_scope,
    describe,
    model_scope,
)
from fairgate.resilience.writer import PersistenceWriter

__all__ = [
    "SHADOW_KEY_SUFFIX",
    "Exclusion",
    "ExclusionReason",
    "RateLimitManager",
    "RateLimitWarning",
    "ResilienceSettings",
    "all_rate_limited",
    "earliest_free",
    "retry_after_seconds",
    "witness",
]

log = logging.getLogger("fairgate.resilience")

#: After the shared store fails as unreachable, fail open without asking it for this long.
STORE_RETRY_MS: Final = 1_000

ExclusionReason = Literal["breaker_open", "cooldown", "lockout", "permanent", "rate_limited"]
ClearKind = Literal["cooldown", "lockout", "permanent", "breaker"]

#: Reason stored on a lockout learned from rate-limit headers (remaining 0 until the reset).
HEADER_REASON: Final = "rate_limited"
#: Stored reasons that mean "a rate limit": they make an exclusion count toward the 429.
RATE_LIMIT_REASONS: Final = frozenset(
    {FailureClass.RATE_LIMIT.value, FailureClass.QUOTA_TEMPORARY.value, HEADER_REASON}
)
#: While another caller holds the half-open probe, a skipped target is worth retrying this soon.
PROBE_WAIT_MS: Final = 1_000
#: A soft warning without a reset time lasts this long.
WARNING_TTL_MS: Final = 60_000
#: Distinct client keys whose failures must agree before a permanent block without an
#: account-level signal is set (one key alone never blocks a shared connection for good).
PERMANENT_QUORUM: Final = 2
#: The window those failures must fall in.
PERMANENT_WINDOW_MS: Final = 600_000
#: Distinct client keys whose request-explained failures must fall in a provider's breaker
#: window before the breaker may open on them (one tenant's long generations or stalled
#: streams never black out a provider for every pool).
BREAKER_WITNESSES: Final = 2
#: Stands for "no key known" (internal callers): counts as one key.
_NO_KEY: Final = "-"
#: Stands for a failure no request explains, among a breaker's witnesses: enough on its own.
_UNEXPLAINED: Final = "\x00unexplained"
#: The key id a shadow copy of a request is sent under is its client key's id plus this
#: (:mod:`fairgate.path.combos`): it names the copy in causes and logs, but a shadow is the
#: same client, never a second witness for :data:`PERMANENT_QUORUM` (issue 43, N9).
SHADOW_KEY_SUFFIX: Final = "~shadow"
_DIMENSIONS: Final = ("requests", "tokens", "input_tokens", "output_tokens")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Why a target must be skipped now and until when (absolute epoch ms; None = until an
    admin clears it). ``rate_limit`` is True when the cause is a rate limit or temporary quota,
    which makes the final answer a 429 instead of a 503."""

    reason: ExclusionReason
    until_ms: int | None
    rate_limit: bool
    detail: str = ""

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        """The diagnostics entry for this skipped target."""
        return {
            "reason": self.reason,
            "until_ms": self.until_ms,
            "retry_after_ms": None if self.until_ms is None else max(0, self.until_ms - now_ms),
            "rate_limit": self.rate_limit,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class RateLimitWarning:
    """A soft over-limit signal: the headers said less than ``warn_fraction`` is left."""

    provider: str
    connection_id: str
    model: str
    dimension: str
    remaining: int
    limit: int
    reset_ms: int | None
    expires_ms: int

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``expires_ms`` (when the warning is dropped: not news to a reader)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "expires_ms"}


def earliest_free(exclusions: Iterable[Exclusion | None]) -> int | None:
    """When the first excluded target frees (min deadline); None if none ever frees by itself
    (all permanent) or there is nothing."""
    deadlines = [e.until_ms for e in exclusions if e is not None and e.until_ms is not None]
    return min(deadlines) if deadlines else None


def all_rate_limited(exclusions: Iterable[Exclusion | None]) -> bool:
    """True when there is at least one exclusion and every one is a rate limit (→ 429)."""
    found = [e for e in exclusions if e is not None]
    return bool(found) and all(e.rate_limit for e in found)


def retry_after_seconds(exclusions: Iterable[Exclusion | None], now_ms: int) -> int | None:
    """The ``Retry-After`` value (whole seconds, rounded up, at least 1) for the earliest free
    target; None when no exclusion ends by itself."""
    until = earliest_free(exclusions)
    if until is None:
        return None
    return max(1, math.ceil((until - now_ms) / 1000))


@dataclass(frozen=True, slots=True)
class BlockCause:
    """The request whose failure set (or last extended) a block: ids only, never a secret."""

    key_id: str | None
    request_id: str | None
    signal: str
    at_ms: int

    def to_dict(self) -> dict[str, Any]:
        """Every field by its name (plain values: nothing nested to convert)."""
        return asdict(self)


def _lock_key(provider: str, conn_id: str, model: str) -> tuple[str, ...]:
    return ("lk", provider, conn_id, model)


def _cd_key(conn_id: str) -> tuple[str, ...]:
    return ("cd", conn_id)


def witness(key_id: str | None) -> str:
    """The client a failure is evidence from, for the permanent-block quorum and the
    breaker's witnesses: a shadow copy (``<key>~shadow``) is its client key's own request sent
    once more, so one key plus a shadow combo must count as one key, not two."""
    if key_id is None:
        return _NO_KEY
    return key_id.removesuffix(SHADOW_KEY_SUFFIX) or _NO_KEY


class RateLimitManager:
    """The facade; see the module docstring. One per gateway process.

    ``store`` defaults to a :class:`MemoryResilienceStore`; pass a ``RedisResilienceStore``
    to share state between replicas (give it the same ``level_memory_ms`` as the settings).
    ``persistence`` (a :class:`PersistenceWriter`) keeps active entries across restarts: call
    :meth:`load` once at start and :meth:`close` at the end (it waits for the queued writes).
    """

    def __init__(
        self,
        store: ResilienceStore | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        settings: ResilienceSettings | None = None,
        persistence: PersistenceWriter | None = None,
        max_tracked: int = 100_000,
    ) -> None:
        self._settings = settings or ResilienceSettings()
        self._clock = clock
        self._store: ResilienceStore = store or MemoryResilienceStore(
            clock=clock, level_memory_ms=self._settings.level_memory_ms
        )
        self._persistence = persistence
        # the memory store's read, called without a coroutine (not when a subclass reads in
        # its own way, as the tests' failing stores do)
        self._read_now = (
            self._store.read_target_now
            if isinstance(self._store, MemoryResilienceStore)
            and type(self._store).read_target is MemoryResilienceStore.read_target
            else None
        )
        self._breakers: dict[str, CircuitBreaker] = {}
        # entries this process knows exist, with their deadline: a success only pays a store
        # round trip to reset the level when there is something to reset
        self._tracked: dict[tuple[str, ...], int] = {}
        self._max_tracked = max_tracked
        self._warnings: dict[str, dict[tuple[str, str, str], RateLimitWarning]] = {}
        self._store_errors = 0
        self._store_down_until = 0  # epoch ms: skip the store until then (it just failed)
        # who set each block this process set: ("cd", conn) / ("lk", p, c, m) / ("br", p)
        self._causes: dict[tuple[str, ...], BlockCause] = {}
        # permanent scope -> {client key id: last failure ms}: evidence awaiting a quorum
        self._evidence: dict[str, dict[str, int]] = {}
        # provider -> {client key id or _UNEXPLAINED: last failure ms}: the breaker's witnesses
        self._witnesses: dict[str, dict[str, int]] = {}

    # -- configuration --------------------------------------------------------------------------

    @property
    def settings(self) -> ResilienceSettings:
        return self._settings

    @property
    def store(self) -> ResilienceStore:
        return self._store

    def update_settings(self, settings: ResilienceSettings) -> None:
        """Apply new settings (admin API) from now on; breakers keep their state."""
        self._settings = settings
        for provider, br in self._breakers.items():
            br.reconfigure(settings.for_provider(provider).breaker_config())

    def breaker(self, provider: str) -> CircuitBreaker:
        """This process's breaker for ``provider`` (created closed on first use)."""
        br = self._breakers.get(provider)
        if br is None:
            br = CircuitBreaker(self._clock, self._settings.for_provider(provider).breaker_config())
            self._breakers[provider] = br
        return br

    async def load(self) -> int:
        """Restore persisted active entries into the store (once, at start); returns how many."""
        if self._persistence is None:
            return 0
        state = await self._persistence.restore(self._store)
        for provider, record in state.breakers.items():
            self.breaker(provider).adopt(record)
        for conn_id, cd in state.cooldowns.items():
            self._track(_cd_key(conn_id), cd.until_ms)
        for key, cd in state.lockouts.items():
            self._track(_lock_key(*key), cd.until_ms)
        return len(state)

    # -- plumbing -------------------------------------------------------------------------------

    async def _safe(self, op: str, call: Callable[[], Awaitable[T]], default: T) -> T:
        """Run a store call; on error fail open (log, count, return ``default``).

        After a failure the store declares as "unreachable" (its ``unavailable_errors``; the
        Redis store has them, the in-memory one cannot be unreachable), the store is left alone
        for :data:`STORE_RETRY_MS`: those calls fail open at once (counted, not logged). A hung
        Redis would otherwise cost every request a socket timeout, several times over."""
        if self._store_down_until:
            now = self._clock.now_ms()
            if now < self._store_down_until:
                self._store_errors += 1
                return default
            # the wait is over: this call is the one probe, the others keep skipping meanwhile
            self._store_down_until = now + STORE_RETRY_MS
        try:
            result = await call()
        except Exception as exc:  # a store outage must not fail the request
            self._store_errors += 1
            if isinstance(exc, tuple(getattr(self._store, "unavailable_errors", ()))):
                self._store_down_until = self._clock.now_ms() + STORE_RETRY_MS
            else:
                self._store_down_until = 0  # it answered, if with an error
            log.warning("resilience store %s failed (failing open): %s", op, exc)
            return default
        self._store_down_until = 0
        return result

    def _persist(
        self, row: tuple[str, ...], op: str, call: Callable[[SqlitePersistence], object]
    ) -> None:
        """Queue a write of the row ``row`` (never waits for the database: see writer.py)."""
        if self._persistence is not None:
            self._persistence.submit(row, op, call)

    async def flush(self) -> None:
        """Wait until the persistence writes queued so far are done (tests, admin reads)."""
        if self._persistence is not None:
            await self._persistence.flush()

    def known_blocks(self, provider: str, conn_id: str, model: str) -> tuple[bool, bool]:
        """(cooling down, model locked out) as this process last learned them: no store
        read and no probe taken, for the routing views (:meth:`check` is the authority)."""
        now = self._clock.now_ms()
        cooling = self._tracked.get(_cd_key(conn_id), 0) > now
        locked = self._tracked.get(_lock_key(provider, conn_id, model), 0) > now
        return cooling, locked

    def breaker_state(self, provider: str) -> BreakerState:
        """The provider's breaker as this process sees it (no probe taken)."""
        return self.breaker(provider).state(self._clock.now_ms())

    def _track(self, key: tuple[str, ...], until_ms: int) -> None:
        if key not in self._tracked and len(self._tracked) >= self._max_tracked:
            self._tracked.clear()  # losing the hints only costs a missed level reset
        self._tracked[key] = until_ms

    async def _share_breaker(self, provider: str, br: CircuitBreaker) -> None:
        """Publish a transition: other replicas adopt it, the probe token is freed."""
        record = br.export()
        await self._safe("put_breaker", lambda: self._store.put_breaker(provider, record), False)
        await self._safe("release_probe", lambda: self._store.release_probe(provider), None)
        self._persist(("br", provider), "save_breaker", lambda p: p.save_breaker(provider, record))

    async def _release_probe(self, provider: str) -> None:
        """The outcome said nothing about the provider's health: give the probe back."""
        br = self._breakers.get(provider)
        if br is not None and br.probe_in_flight():
            br.release_probe()
            await self._safe("release_probe", lambda: self._store.release_probe(provider), None)

    # -- admission ------------------------------------------------------------------------------

    async def check(
        self, provider: str, conn_id: str, model: str, auth_type: str = "apikey"
    ) -> Exclusion | None:
        """None when the target may take a request now, else why not and until when.

        Permanent blocks win; otherwise the exclusion that ends last is returned (the target is
        free only when every block is over). A half-open provider admits exactly one caller, the
        probe, across every replica sharing the store. ``auth_type`` is accepted for symmetry
        with :meth:`on_failure`; admission does not depend on it.
        """
        del auth_type
        read_now = self._read_now
        ts: TargetState | None = None
        if read_now is not None:
            try:
                ts = read_now(provider, conn_id, model)
            except Exception:  # as any store failure: through _safe below (logged, fail open)
                ts = None
            if ts is NO_STATE and self.breaker(provider).state() is BreakerState.CLOSED:
                return None  # nothing remembered, the breaker closed: the usual answer, at once
        now = self._clock.now_ms()
        if ts is None:
            ts = await self._safe(
                "read_target",
                lambda: self._store.read_target(provider, conn_id, model),
                NO_STATE,
            )
        br = self.breaker(provider)
        if ts.breaker is not None:
            br.adopt(ts.breaker)
        if ts.permanent is not None:
            return Exclusion("permanent", None, False, ts.permanent.reason)
        found: list[Exclusion] = []
        if ts.cooldown is not None:
            self._track(_cd_key(conn_id), ts.cooldown.until_ms)
            if ts.cooldown.active(now):
                found.append(self._exclusion("cooldown", ts.cooldown))
        if ts.lockout is not None:
            self._track(_lock_key(provider, conn_id, model), ts.lockout.until_ms)
            if ts.lockout.active(now):
                kind: ExclusionReason = (
                    "rate_limited" if ts.lockout.reason == HEADER_REASON else "lockout"
                )
                found.append(self._exclusion(kind, ts.lockout))
        state = br.state(now)
        if state is BreakerState.OPEN:
            found.append(Exclusion("breaker_open", br.open_until_ms, False, "circuit open"))
        if found:
            return max(found, key=lambda e: e.until_ms or 0)
        if state is BreakerState.HALF_OPEN:
            return await self._probe(provider, br, now)
        return None

    @staticmethod
    def _exclusion(kind: ExclusionReason, cd: Cooldown) -> Exclusion:
        return Exclusion(kind, cd.until_ms, cd.reason in RATE_LIMIT_REASONS, cd.reason)

    async def _probe(self, provider: str, br: CircuitBreaker, now: int) -> Exclusion | None:
        busy = Exclusion("breaker_open", now + PROBE_WAIT_MS, False, "half-open: probe in flight")
        if not br.try_acquire():  # synchronous: no other coroutine can interleave
            return busy
        lease = br.config.probe_lease_ms
        granted = await self._safe(
            "try_probe", lambda: self._store.try_probe(provider, lease), True
        )
        if not granted:  # another replica is probing
            br.release_probe()
            return busy
        return None

    # -- outcomes -------------------------------------------------------------------------------

    async def on_success(
        self,
        provider: str,
        conn_id: str,
        model: str,
        headers: Mapping[str, str] | None = None,
        *,
        snapshot: RateLimitSnapshot | None = None,
        key_id: str | None = None,
        request_id: str | None = None,
    ) -> None:
        """A request succeeded: close a half-open breaker, reset backoff levels of entries that
        are over, and learn from the rate-limit headers. A caller that already parsed them
        passes ``snapshot`` instead (parsing is the dearest part of a success on the hot path).
        ``key_id``/``request_id`` name the request (a lockout learned from its headers records
        them as its cause)."""
        now = self._clock.now_ms()
        br = self.breaker(provider)
        if br.record(True) is not None:  # closed: its window, and so its witnesses, start over
            self._witnesses.pop(provider, None)
            await self._share_breaker(provider, br)
        if self._tracked:  # a level to reset only where this process knows of an entry
            await self._reset_level(_cd_key(conn_id), now)
            await self._reset_level(_lock_key(provider, conn_id, model), now)
        if snapshot is None and headers:
            snapshot = parse_rate_limit_headers(headers, now)
        if snapshot is not None:
            cause = BlockCause(key_id, request_id, "headers", now)
            await self._learn(provider, conn_id, model, snapshot, now, cause)

    async def _reset_level(self, key: tuple[str, ...], now: int) -> None:
        until = self._tracked.get(key)
        if until is None or until > now:
            return  # nothing known, or still running: a late success must not cut it short
        del self._tracked[key]
        self._causes.pop(key, None)
        if key[0] == "cd":
            conn_id = key[1]
            cleared = await self._safe(
                "clear_cooldown",
                lambda: self._store.clear_cooldown(conn_id, unless_active_at=now),
                False,
            )
            if cleared:
                self._persist(
                    _cd_key(conn_id), "delete_cooldown", lambda p: p.delete_cooldown(conn_id)
                )
        else:
            _, provider, conn_id, model = key
            cleared = await self._safe(
                "clear_lockout",
                lambda: self._store.clear_lockout(provider, conn_id, model, unless_active_at=now),
                False,
            )
            if cleared:
                self._persist(
                    _lock_key(provider, conn_id, model),
                    "delete_lockout",
                    lambda p: p.delete_lockout(provider, conn_id, model),
                )

    async def _learn(
        self,
        provider: str,
        conn_id: str,
        model: str,
        snap: RateLimitSnapshot,
        now: int,
        cause: BlockCause,
    ) -> None:
        """Remaining 0 with a reset → lock the model until the reset; below ``warn_fraction``
        → a soft warning; otherwise drop the warning for that dimension."""
        fraction = self._settings.for_provider(provider).warn_fraction
        warnings = self._warnings.setdefault(conn_id, {})
        for dim in _DIMENSIONS:
            remaining: int | None = getattr(snap, f"{dim}_remaining")
            limit: int | None = getattr(snap, f"{dim}_limit")
            reset: int | None = getattr(snap, f"{dim}_reset_ms")
            key = (provider, model, dim)
            if remaining is None:
                continue
            if remaining == 0 and reset is not None and reset > now:
                await self._set_lockout(provider, conn_id, model, reset, 0, HEADER_REASON, cause)
            if limit and remaining < fraction * limit:
                warnings[key] = RateLimitWarning(
                    provider,
                    conn_id,
                    model,
                    dim,
                    remaining,
                    limit,
                    reset,
                    reset if reset is not None and reset > now else now + WARNING_TTL_MS,
                )
            else:
                warnings.pop(key, None)
        if not warnings:
            del self._warnings[conn_id]
        elif len(self._warnings) > self._max_tracked:
            self._warnings.pop(next(iter(self._warnings)))

    def warnings(self, conn_id: str) -> list[RateLimitWarning]:
        """Soft over-limit warnings for a connection (expired ones dropped lazily)."""
        table = self._warnings.get(conn_id)
        if not table:
            return []
        now = self._clock.now_ms()
        for key in [k for k, w in table.items() if w.expires_ms <= now]:
            del table[key]
        if not table:
            del self._warnings[conn_id]
            return []
        return sorted(table.values(), key=lambda w: (w.model, w.dimension))

    async def on_failure(
        self,
        provider: str,
        conn_id: str,
        model: str,
        auth_type: str,
        classification: Classification,
        *,
        key_id: str | None = None,
        request_id: str | None = None,
        request_explained: bool = False,
    ) -> None:
        """Apply the rules for one classified failure (see the module docstring).

        ``key_id``/``request_id``: the client key and request whose answer this was; every
        block set here is logged with them and shown as its cause in :meth:`snapshot`; a
        permanent block without an account-level signal needs a quorum of distinct keys.
        ``request_explained``: the request's own size or duration accounts for this server
        error or timeout, so it sets no cooldown and counts toward the breaker only with
        another key's witness."""
        c = classification
        s = self._settings.for_provider(provider)
        cls = c.cls
        cause = BlockCause(key_id, request_id, c.signal or cls.value, self._clock.now_ms())
        if cls is FailureClass.QUOTA_PERMANENT:
            scoped = self._model_scoped(c, model)
            scope = model_scope(provider, conn_id, model) if scoped else connection_scope(conn_id)
            if c.account_level or self._corroborated(scope, key_id, cause.at_ms):
                await self._set_permanent(scope, c, cause)
                await self._release_probe(provider)
                return
            # one key's word: a temporary quota until another key confirms it
            cls = FailureClass.QUOTA_TEMPORARY
        if cls in (FailureClass.RATE_LIMIT, FailureClass.QUOTA_TEMPORARY):
            hint = c.retry_after_ms
            if self._model_scoped(c, model):
                await self._back_off(provider, conn_id, model, auth_type, hint, cls, s, cause)
            else:
                await self._back_off(provider, conn_id, None, auth_type, hint, cls, s, cause)
            if s.breaker_counts_rate_limits:
                await self._breaker_failure(provider, cause, explained=False)
            else:
                await self._release_probe(provider)
        elif cls is FailureClass.AUTH:
            await self._back_off(
                provider,
                conn_id,
                None,
                auth_type,
                c.retry_after_ms,
                cls,
                s,
                cause,
                floor_ms=s.auth_cooldown_ms,
            )
            await self._release_probe(provider)
        elif cls is FailureClass.MODEL_NOT_FOUND:
            floor = s.model_not_found_lockout_ms
            await self._back_off(
                provider, conn_id, model, auth_type, None, cls, s, cause, floor_ms=floor
            )
            await self._release_probe(provider)
        elif cls in (FailureClass.SERVER_ERROR, FailureClass.TIMEOUT) and c.provider_failure:
            await self._breaker_failure(provider, cause, explained=request_explained)
            if not request_explained:  # else the request's own failure: the account is fine
                await self._back_off(
                    provider, conn_id, None, auth_type, c.retry_after_ms, cls, s, cause
                )
        else:  # client disconnect, bad request, context overflow, our own bug: nothing
            await self._release_probe(provider)

    def _corroborated(self, scope: str, key_id: str | None, now: int) -> bool:
        """Record this key's evidence against ``scope``; True once :data:`PERMANENT_QUORUM`
        distinct keys reported it within :data:`PERMANENT_WINDOW_MS`."""
        seen = self._evidence.get(scope)
        if seen is None:
            if len(self._evidence) >= self._max_tracked:
                self._evidence.clear()  # losing evidence only delays a block
            seen = self._evidence[scope] = {}
        for old in [k for k, at in seen.items() if at <= now - PERMANENT_WINDOW_MS]:
            del seen[old]
        seen[witness(key_id)] = now
        if len(seen) < PERMANENT_QUORUM:
            log.warning(
                "permanent-block evidence from one key, awaiting a second",
                extra={"scope": scope, "key_id": key_id, "keys_seen": len(seen)},
            )
            return False
        del self._evidence[scope]
        return True

    async def _set_permanent(self, scope: str, c: Classification, cause: BlockCause) -> None:
        reason = f"{c.cls.value}: {c.message}"[:300]
        block = await self._safe(
            "set_permanent",
            lambda: self._store.set_permanent(
                scope, reason, key_id=cause.key_id, request_id=cause.request_id
            ),
            None,
        )
        if block is not None:
            self._persist(
                ("perm", block.scope), "save_permanent", lambda p: p.save_permanent(block)
            )
        self._log_block("permanent", scope, None, cause, c.cls.value)

    @staticmethod
    def _log_block(
        kind: str, target: str, until_ms: int | None, cause: BlockCause, reason: str
    ) -> None:
        """One WARNING per block set: what, until when, and which key and request caused it."""
        log.warning(
            "resilience %s set on %s",
            kind,
            target,
            extra={
                "block": kind,
                "target": target,
                "until_ms": until_ms,
                "reason": reason,
                "signal": cause.signal,
                "key_id": cause.key_id,
                "request_id": cause.request_id,
            },
        )

    @staticmethod
    def _model_scoped(c: Classification, model: str) -> bool:
        return c.model_scoped or (bool(model) and model.lower() in c.message.lower())

    def _witnessed(self, provider: str, cause: BlockCause, explained: bool, window: int) -> bool:
        """Record this failure as a witness against ``provider``'s health; True when the
        breaker may open on the window's failures: an unexplained failure in the window, or
        explained ones from :data:`BREAKER_WITNESSES` distinct client keys."""
        seen = self._witnesses.get(provider)
        if seen is None:
            seen = self._witnesses[provider] = {}
        now = cause.at_ms
        for old in [k for k, at in seen.items() if at <= now - window]:
            del seen[old]
        seen[_UNEXPLAINED if not explained else witness(cause.key_id)] = now  # no shadow twice
        if len(seen) > self._max_tracked:  # one key per entry: bounded like the other maps
            seen.pop(next(iter(seen)))
        return _UNEXPLAINED in seen or len(seen) >= BREAKER_WITNESSES

    async def _breaker_failure(self, provider: str, cause: BlockCause, *, explained: bool) -> None:
        br = self.breaker(provider)
        may_open = self._witnessed(provider, cause, explained, br.config.window_ms)
        if not may_open:  # a probe that failed on one key's word: no news, let another probe
            await self._release_probe(provider)
        if br.record(False, may_open=may_open) is not None:
            await self._share_breaker(provider, br)
            if br.state() is BreakerState.OPEN:
                self._remember(("br", provider), cause, None, 0)
                self._log_block("breaker", provider, br.open_until_ms, cause, "open")

    def _remember(
        self, key: tuple[str, ...], cause: BlockCause, stored: Cooldown | None, asked_ms: int
    ) -> None:
        """Name ``cause`` as the block's cause, unless the block stored ends later than this
        failure asked for (an earlier failure's longer block stands: its cause stays)."""
        if key in self._causes and stored is not None and stored.until_ms > asked_ms:
            return
        if key not in self._causes and len(self._causes) >= self._max_tracked:
            self._causes.clear()  # losing a cause only blanks a health field
        self._causes[key] = cause

    def _duration(
        self,
        existing: Cooldown | None,
        now: int,
        auth_type: str,
        hint_ms: int | None,
        s: ResilienceSettings,
        floor_ms: int,
    ) -> tuple[int, int]:
        """(level, duration) of the next block. Failures that arrive while a block is still
        running (requests sent before it began) keep its level: only a failure after the
        deadline climbs the backoff, so a burst of in-flight 429s cannot jump to the cap."""
        if existing is None:
            level = 0
        elif existing.active(now):
            level = existing.level
        else:
            level = existing.level + 1
        duration = next_cooldown_ms(
            level,
            auth_type,
            hint_ms,
            base_oauth=s.oauth_base_cooldown_ms,
            base_apikey=s.apikey_base_cooldown_ms,
            max_ms=s.max_cooldown_ms,
            max_hint_ms=s.max_hint_ms,
        )
        return level, max(duration, floor_ms)

    async def _back_off(
        self,
        provider: str,
        conn_id: str,
        model: str | None,
        auth_type: str,
        hint_ms: int | None,
        cls: FailureClass,
        s: ResilienceSettings,
        cause: BlockCause,
        *,
        floor_ms: int = 0,
    ) -> None:
        """Cool the connection down (``model`` None) or lock ``model`` out on it, for the
        next level of the block it has (:meth:`_duration`): one rule for both."""
        now = self._clock.now_ms()
        if model is None:
            existing = await self._safe(
                "get_cooldown", lambda: self._store.get_cooldown(conn_id), None
            )
        else:
            locked = model
            existing = await self._safe(
                "get_lockout", lambda: self._store.get_lockout(provider, conn_id, locked), None
            )
        level, duration = self._duration(existing, now, auth_type, hint_ms, s, floor_ms)
        until = now + duration
        if model is None:
            await self._set_cooldown(conn_id, until, level, cls.value, cause)
        else:
            await self._set_lockout(provider, conn_id, model, until, level, cls.value, cause)

    async def _set_cooldown(
        self, conn_id: str, until_ms: int, level: int, reason: str, cause: BlockCause
    ) -> None:
        merged = await self._safe(
            "set_cooldown",
            lambda: self._store.set_cooldown(conn_id, until_ms, level, reason),
            None,
        )
        if merged is not None:
            self._track(_cd_key(conn_id), merged.until_ms)
            self._persist(
                _cd_key(conn_id), "save_cooldown", lambda p: p.save_cooldown(conn_id, merged)
            )
        self._remember(_cd_key(conn_id), cause, merged, until_ms)
        self._log_block("cooldown", conn_id, until_ms, cause, reason)

    async def _set_lockout(
        self,
        provider: str,
        conn_id: str,
        model: str,
        until_ms: int,
        level: int,
        reason: str,
        cause: BlockCause,
    ) -> None:
        merged = await self._safe(
            "set_lockout",
            lambda: self._store.set_lockout(provider, conn_id, model, until_ms, level, reason),
            None,
        )
        if merged is not None:
            self._track(_lock_key(provider, conn_id, model), merged.until_ms)
            self._persist(
                _lock_key(provider, conn_id, model),
                "save_lockout",
                lambda p: p.save_lockout(provider, conn_id, model, merged),
            )
        self._remember(_lock_key(provider, conn_id, model), cause, merged, until_ms)
        self._log_block("lockout", f"{provider}/{model}@{conn_id}", until_ms, cause, reason)

    # -- admin and health -----------------------------------------------------------------------

    async def clear(
        self,
        kind: ClearKind,
        *,
        provider: str | None = None,
        connection_id: str | None = None,
        model: str | None = None,
        scope: str | None = None,
    ) -> bool:
        """Admin delete. ``cooldown`` needs ``connection_id``; ``lockout`` needs provider,
        connection and model; ``permanent`` takes a ``scope`` or builds it from the connection
        (and provider + model for a model-scoped block); ``breaker`` needs ``provider`` and
        closes it for every replica. True if something was removed."""
        if kind == "cooldown":
            conn_id = _need(connection_id, "connection_id")
            self._tracked.pop(_cd_key(conn_id), None)
            self._causes.pop(_cd_key(conn_id), None)
            self._persist(_cd_key(conn_id), "delete_cooldown", lambda p: p.delete_cooldown(conn_id))
            return await self._store.clear_cooldown(conn_id)
        if kind == "lockout":
            prov, conn_id = _need(provider, "provider"), _need(connection_id, "connection_id")
            mdl = _need(model, "model")
            self._tracked.pop(_lock_key(prov, conn_id, mdl), None)
            self._causes.pop(_lock_key(prov, conn_id, mdl), None)
            self._persist(
                _lock_key(prov, conn_id, mdl),
                "delete_lockout",
                lambda p: p.delete_lockout(prov, conn_id, mdl),
            )
            return await self._store.clear_lockout(prov, conn_id, mdl)
        if kind == "permanent":
            if scope is None:
                conn_id = _need(connection_id, "connection_id")
                scope = (
                    model_scope(_need(provider, "provider"), conn_id, model)
                    if model
                    else connection_scope(conn_id)
                )
            target = scope
            self._evidence.pop(target, None)
            self._persist(
                ("perm", target), "delete_permanent", lambda p: p.delete_permanent(target)
            )
            return await self._store.clear_permanent(target)
        if kind == "breaker":
            prov = _need(provider, "provider")
            br = self.breaker(prov)
            was_open = br.state() is not BreakerState.CLOSED
            br.reset()
            self._witnesses.pop(prov, None)
            await self._share_breaker(prov, br)
            return was_open
        raise ValueError(f"unknown kind {kind!r}")

    async def snapshot(self) -> dict[str, Any]:
        """The resilience part of ``GET /api/monitoring/health``: breakers per provider with
        their state and remaining cool-down, active cooldowns and lockouts with remaining ms,
        permanent blocks, soft warnings and the store's status."""
        now = self._clock.now_ms()
        ok = await self._safe("ping", self._store.ping, False)
        snap = await self._safe("snapshot", self._store.snapshot, None)
        shared: dict[str, BreakerRecord] = {} if snap is None else snap.breakers
        breakers: dict[str, Any] = {}
        for provider, record in shared.items():
            self.breaker(provider).adopt(record)
        for provider in sorted(self._breakers):
            breakers[provider] = self._breakers[provider].snapshot(now)
        body: dict[str, Any] = {
            "now_ms": now,
            "store": {"driver": self._store.name, "ok": ok, "errors": self._store_errors},
            "breakers": breakers,
        }
        if snap is not None:
            body.update(describe(snap, now))
        else:
            body.update({"cooldowns": [], "lockouts": [], "permanent": []})
        self._attach_causes(body)
        body["warnings"] = [
            w.to_dict() for conn_id in sorted(self._warnings) for w in self.warnings(conn_id)
        ]
        return body

    def _attach_causes(self, body: dict[str, Any]) -> None:
        """``caused_by`` on every cooldown, lockout and breaker this process set (None when
        another replica or a previous run set it; permanent blocks carry theirs durably)."""

        def cause(key: tuple[str, ...]) -> dict[str, Any] | None:
            found = self._causes.get(key)
            return None if found is None else found.to_dict()

        for cd in body["cooldowns"]:
            cd["caused_by"] = cause(_cd_key(cd["connection_id"]))
        for lk in body["lockouts"]:
            lk["caused_by"] = cause(_lock_key(lk["provider"], lk["connection_id"], lk["model"]))
        for provider, br in body["breakers"].items():
            br["caused_by"] = cause(("br", provider)) if br.get("state") != "closed" else None

    async def close(self) -> None:
        """Save what is queued (bounded wait), then close the store."""
        if self._persistence is not None:
            await self._persistence.close()
        await self._store.close()


def _need(value: str | None, name: str) -> str:
    if not value:
        raise ValueError(f"{name} is required")
    return value
