"""A per-provider circuit breaker (SPEC §9). Pure: the clock is injected, nothing does I/O.

Why: when a provider is failing (5xx, timeouts), sending it more traffic only adds latency for our
clients and load for a struggling upstream. The breaker watches the failure rate of the provider's
recent requests and, past a threshold, stops sending anything for a cool-down, then lets exactly
one probe request through to find out whether the provider is back.

States::

    CLOSED --(≥ threshold failures with ≥ min_requests in the window)--> OPEN
    OPEN --(cool-down elapsed; derived lazily on read)--> HALF_OPEN
    HALF_OPEN --(probe succeeds)--> CLOSED     (window cleared, cool-down back to base)
    HALF_OPEN --(probe fails)--> OPEN          (cool-down × 2, capped at max_cooldown_ms)

The window is bounded: ``buckets`` slots (60 → one per second of a 60 s window) each counting the
successes and failures that fell in it; a slot is reused once its second has left the window.
Memory is O(buckets) whatever the traffic, and the counts slide with the (injected) clock.

Only provider failures count: the caller passes ``provider_failure`` (a client that disconnected,
or sent a bad request, says nothing about the provider's health). And a failure counts but may
not *open* the breaker unless the caller says it may (``may_open``): the manager allows it only
once the window's failures are witnessed by more than one client key, or one of them cannot have
been caused by the request (issue 43, N3; see ``manager.py``). A half-open probe that fails
without that permission gives the probe token back instead of re-opening: one key's failure is
no news about the provider.

Worked example (defaults: threshold 0.5, min_requests 5, window 60 s, cool-down 30 s), t in s::

    t=0..3   4 requests: 2 ok, 2 failures          -> CLOSED (only 4 requests: below the minimum)
    t=4      a 5th request fails: 3/5 = 60 % ≥ 50 % -> OPEN until t=34
    t=10     try_acquire() -> False                 (cooling down)
    t=34     state() is HALF_OPEN; 50 callers race try_acquire(): exactly one gets True
    t=35     the probe fails                         -> OPEN until t=95 (cool-down 60 s)
    t=95     HALF_OPEN again; the probe succeeds     -> CLOSED, window empty, cool-down 30 s

``try_acquire`` never awaits, so under asyncio the check-and-take of the probe token cannot be
interleaved: concurrent callers see the token taken. A probe that never reports (its caller
crashed) frees the token after ``probe_lease_ms``.

Replicas: :meth:`CircuitBreaker.export` gives a :class:`BreakerRecord` (open/closed, deadline,
cool-down, the transition time) that the resilience store shares; :meth:`CircuitBreaker.adopt`
applies another replica's record when it is newer than this breaker's last transition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fairgate.clock import Clock
from fairgate.domain.breaker import BreakerState

__all__ = ["BreakerConfig", "BreakerRecord", "BreakerState", "CircuitBreaker"]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    threshold: float = 0.5
    min_requests: int = 5
    window_ms: int = 60_000
    cooldown_ms: int = 30_000
    max_cooldown_ms: int = 300_000
    probe_lease_ms: int = 120_000
    buckets: int = 60

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.min_requests < 1 or self.window_ms < 1 or self.buckets < 1:
            raise ValueError("min_requests, window_ms and buckets must be positive")
        if self.cooldown_ms < 0 or self.max_cooldown_ms < self.cooldown_ms:
            raise ValueError("need 0 <= cooldown_ms <= max_cooldown_ms")


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """The shareable part of a breaker: ``state`` is ``"open"`` or ``"closed"`` (half-open is
    derived from an open record whose ``until_ms`` has passed); ``updated_ms`` is when the
    transition happened, so the newest record wins between replicas."""

    state: str
    until_ms: int
    cooldown_ms: int
    updated_ms: int

    def to_dict(self) -> dict[str, Any]:
        """Every field by its name (plain values: nothing nested to convert)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BreakerRecord:
        return cls(
            state=str(data["state"]),
            until_ms=int(data["until_ms"]),
            cooldown_ms=int(data["cooldown_ms"]),
            updated_ms=int(data["updated_ms"]),
        )


class CircuitBreaker:
    """One provider's breaker; see the module docstring."""

    def __init__(self, clock: Clock, config: BreakerConfig | None = None) -> None:
        self._clock = clock
        self._config = config or BreakerConfig()
        self._open = False
        self._open_until = 0
        self._cooldown = self._config.cooldown_ms
        self._transition_ms = 0
        self._probe_until = 0  # > now while the probe token is out
        self._init_window()

    def _init_window(self) -> None:
        n = self._config.buckets
        self._bucket_ms = max(1, self._config.window_ms // n)
        self._slot_index = [-1] * n
        self._ok = [0] * n
        self._fail = [0] * n

    @property
    def config(self) -> BreakerConfig:
        return self._config

    def reconfigure(self, config: BreakerConfig) -> None:
        """New thresholds apply from now; the state is kept, the window restarts when its
        bucket layout changes."""
        layout_changed = (config.window_ms, config.buckets) != (
            self._config.window_ms,
            self._config.buckets,
        )
        self._config = config
        if layout_changed:
            self._init_window()
        if not self._open:
            self._cooldown = config.cooldown_ms
        self._cooldown = min(max(self._cooldown, config.cooldown_ms), config.max_cooldown_ms)

    # -- window ---------------------------------------------------------------------------------

    def _add(self, now_ms: int, ok: bool) -> None:
        idx = now_ms // self._bucket_ms
        slot = idx % self._config.buckets
        if self._slot_index[slot] != idx:
            self._slot_index[slot] = idx
            self._ok[slot] = 0
            self._fail[slot] = 0
        if ok:
            self._ok[slot] += 1
        else:
            self._fail[slot] += 1

    def counts(self, now_ms: int | None = None) -> tuple[int, int]:
        """(requests, failures) within the sliding window ending at ``now_ms``."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        current = now // self._bucket_ms
        oldest = current - self._config.buckets + 1
        total = failures = 0
        for i, idx in enumerate(self._slot_index):
            if oldest <= idx <= current:
                total += self._ok[i] + self._fail[i]
                failures += self._fail[i]
        return total, failures

    def _clear_window(self) -> None:
        n = self._config.buckets
        self._slot_index = [-1] * n
        self._ok = [0] * n
        self._fail = [0] * n

    # -- state ----------------------------------------------------------------------------------

    def state(self, now_ms: int | None = None) -> BreakerState:
        if not self._open:
            return BreakerState.CLOSED
        now = self._clock.now_ms() if now_ms is None else now_ms
        return BreakerState.OPEN if now < self._open_until else BreakerState.HALF_OPEN

    @property
    def open_until_ms(self) -> int | None:
        return self._open_until if self._open else None

    @property
    def cooldown_ms(self) -> int:
        return self._cooldown

    @property
    def transition_ms(self) -> int:
        return self._transition_ms

    def probe_in_flight(self, now_ms: int | None = None) -> bool:
        now = self._clock.now_ms() if now_ms is None else now_ms
        return self._probe_until > now

    def try_acquire(self) -> bool:
        """May a request go to this provider now? CLOSED: yes. OPEN: no. HALF_OPEN: only the
        first caller, who takes the one probe token (held until its outcome is recorded, the
        token is released, or ``probe_lease_ms`` passes)."""
        now = self._clock.now_ms()
        st = self.state(now)
        if st is BreakerState.CLOSED:
            return True
        if st is BreakerState.OPEN or self._probe_until > now:
            return False
        self._probe_until = now + self._config.probe_lease_ms
        return True

    def release_probe(self) -> None:
        """Give the probe token back unused (the probe ended without telling anything about the
        provider, e.g. the client disconnected)."""
        self._probe_until = 0

    def record(
        self, success: bool, *, provider_failure: bool = True, may_open: bool = True
    ) -> BreakerState | None:
        """Count one outcome; returns the new state when this outcome changed it, else None.

        A failure that is not the provider's (``provider_failure=False``) is ignored. A failure
        with ``may_open=False`` is counted in the window but neither opens a closed breaker nor
        re-opens a half-open one (its probe token is given back).
        """
        if not success and not provider_failure:
            return None
        now = self._clock.now_ms()
        st = self.state(now)
        if st is BreakerState.HALF_OPEN:
            if success:
                self._close(now)
                return BreakerState.CLOSED
            if not may_open:
                self._probe_until = 0
                return None
            self._cooldown = min(self._cooldown * 2, self._config.max_cooldown_ms)
            self._trip(now)
            return BreakerState.OPEN
        self._add(now, success)
        if st is BreakerState.OPEN or success or not may_open:
            return None
        total, failures = self.counts(now)
        if total >= self._config.min_requests and failures >= self._config.threshold * total:
            self._cooldown = self._config.cooldown_ms
            self._trip(now)
            return BreakerState.OPEN
        return None

    def record_success(self) -> BreakerState | None:
        return self.record(True)

    def record_failure(
        self, *, provider_failure: bool = True, may_open: bool = True
    ) -> BreakerState | None:
        return self.record(False, provider_failure=provider_failure, may_open=may_open)

    def _trip(self, now_ms: int) -> None:
        self._open = True
        self._open_until = now_ms + self._cooldown
        self._probe_until = 0
        self._transition_ms = now_ms

    def _close(self, now_ms: int) -> None:
        self._open = False
        self._open_until = 0
        self._cooldown = self._config.cooldown_ms
        self._probe_until = 0
        self._transition_ms = now_ms
        self._clear_window()

    def reset(self) -> None:
        """Close now (admin action)."""
        self._close(self._clock.now_ms())

    # -- sharing --------------------------------------------------------------------------------

    def export(self) -> BreakerRecord:
        return BreakerRecord(
            state=BreakerState.OPEN.value if self._open else BreakerState.CLOSED.value,
            until_ms=self._open_until if self._open else 0,
            cooldown_ms=self._cooldown,
            updated_ms=self._transition_ms,
        )

    def adopt(self, record: BreakerRecord) -> bool:
        """Apply another replica's transition if it is newer than ours; True if applied."""
        if record.updated_ms <= self._transition_ms:
            return False
        if record.state == BreakerState.OPEN.value:
            self._open = True
            self._open_until = record.until_ms
            self._cooldown = min(
                max(record.cooldown_ms, self._config.cooldown_ms), self._config.max_cooldown_ms
            )
            self._probe_until = 0
        else:
            if self._open:  # a close elsewhere: start over, as our own close would
                self._clear_window()
            self._open = False
            self._open_until = 0
            self._cooldown = self._config.cooldown_ms
            self._probe_until = 0
        self._transition_ms = record.updated_ms
        return True

    def snapshot(self, now_ms: int | None = None) -> dict[str, Any]:
        """What the health API shows for this provider."""
        now = self._clock.now_ms() if now_ms is None else now_ms
        total, failures = self.counts(now)
        st = self.state(now)
        return {
            "state": st.value,
            "remaining_ms": max(0, self._open_until - now) if st is BreakerState.OPEN else 0,
            "open_until_ms": self._open_until if self._open else None,
            "cooldown_ms": self._cooldown,
            "requests": total,
            "failures": failures,
            "failure_rate": failures / total if total else 0.0,
            "probe_in_flight": self._probe_until > now,
        }
