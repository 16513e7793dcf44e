"""Windowed per-target metrics with bounded memory.

Routing needs *recent* behaviour — a provider that was slow last week and is fast now should be
chosen — so nothing here is a lifetime counter:

- latency: an EWMA (α 0.2) and the p95 of the last ``samples`` successful attempts, kept in a
  ring buffer (``deque(maxlen=…)``; 256 by default);
- outcomes, uses and tokens: per-minute buckets over the last ``window_minutes`` (15), so a
  success rate is "over the last 15 minutes" and old minutes fall off as time moves;
- the last success and last failure instants (for lkgp and the dashboard).

Latency is recorded for successes only: a 429 that comes back in 30 ms is not a fast answer.

Memory is bounded twice: per target by the ring buffer and the minute window, and in the number
of targets by an LRU (``OrderedDict``; a record moves the target to the recent end; past
``max_targets`` the least recently recorded target is dropped). So the worst case is
``max_targets × (samples + window_minutes)`` small entries whatever the traffic.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["TargetMetrics", "TargetStats"]

MINUTE_MS = 60_000


class _Minute:
    __slots__ = ("errors", "minute", "ok", "tokens")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.ok = 0
        self.errors = 0
        self.tokens = 0


class _Series:
    __slots__ = ("ewma", "last_err_ms", "last_ok_ms", "latencies", "minutes", "p95")

    def __init__(self, samples: int, window_minutes: int) -> None:
        self.ewma: float | None = None
        self.latencies: deque[float] = deque(maxlen=samples)
        self.minutes: deque[_Minute] = deque(maxlen=window_minutes)
        self.p95: float | None = None  # cached; None = stale or no samples
        self.last_ok_ms: int | None = None
        self.last_err_ms: int | None = None


@dataclass(frozen=True, slots=True)
class TargetStats:
    """A snapshot for dashboards and diagnostics."""

    key: str
    ewma_ms: float | None
    p95_ms: float | None
    requests: int
    errors: int
    success_rate: float | None
    tokens: int
    last_ok_ms: int | None
    last_error_ms: int | None
    p50_ms: float | None = None


class TargetMetrics:
    """Per-target metrics keyed by ``Target.key``; satisfies ``MetricsView``.

    Not thread-safe: it lives on the event loop like the rest of the hot path.
    """

    __slots__ = ("_alpha", "_max", "_samples", "_series", "_window")

    def __init__(
        self,
        *,
        max_targets: int = 10_000,
        samples: int = 256,
        window_minutes: int = 15,
        ewma_alpha: float = 0.2,
    ) -> None:
        if max_targets < 1 or samples < 1 or window_minutes < 1:
            raise ValueError("max_targets, samples and window_minutes must be ≥ 1")
        if not 0.0 < ewma_alpha <= 1.0:
            raise ValueError("ewma_alpha must be in (0, 1]")
        self._max = max_targets
        self._samples = samples
        self._window = window_minutes
        self._alpha = ewma_alpha
        self._series: OrderedDict[str, _Series] = OrderedDict()

    def __len__(self) -> int:
        return len(self._series)

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def record(
        self, target_key: str, latency_ms: float, ok: bool, now_ms: int, tokens: int = 0
    ) -> None:
        """One finished attempt on ``target_key``."""
        s = self._series.get(target_key)
        if s is None:
            s = _Series(self._samples, self._window)
            self._series[target_key] = s
            while len(self._series) > self._max:
                self._series.popitem(last=False)
        else:
            self._series.move_to_end(target_key)
        if ok:
            lat = max(0.0, float(latency_ms)) if math.isfinite(latency_ms) else 0.0
            s.latencies.append(lat)
            s.p95 = None
            s.ewma = lat if s.ewma is None else self._alpha * lat + (1 - self._alpha) * s.ewma
            s.last_ok_ms = now_ms if s.last_ok_ms is None else max(s.last_ok_ms, now_ms)
        else:
            s.last_err_ms = now_ms if s.last_err_ms is None else max(s.last_err_ms, now_ms)
        bucket = self._bucket(s, now_ms // MINUTE_MS)
        if bucket is not None:
            if ok:
                bucket.ok += 1
            else:
                bucket.errors += 1
            bucket.tokens += max(0, tokens)

    @staticmethod
    def _bucket(s: _Series, minute: int) -> _Minute | None:
        if not s.minutes or s.minutes[-1].minute < minute:
            s.minutes.append(_Minute(minute))  # maxlen drops the oldest minute
            return s.minutes[-1]
        # a late record (attempts finish out of order): find or insert its minute
        for i in range(len(s.minutes) - 1, -1, -1):
            b = s.minutes[i]
            if b.minute == minute:
                return b
            if b.minute < minute:
                if len(s.minutes) == s.minutes.maxlen:
                    s.minutes.popleft()  # make room by dropping the oldest minute
                    i -= 1  # noqa: PLW2901 - the index shifted with popleft
                s.minutes.insert(i + 1, _Minute(minute))
                return s.minutes[i + 1]
        if len(s.minutes) < (s.minutes.maxlen or 0):
            s.minutes.appendleft(_Minute(minute))
            return s.minutes[0]
        return None  # older than every minute kept in a full window: dropped

    def _window_sums(self, key: str, now_ms: int) -> tuple[int, int, int]:
        s = self._series.get(key)
        if s is None:
            return 0, 0, 0
        oldest = now_ms // MINUTE_MS - self._window + 1
        ok = err = tokens = 0
        for b in s.minutes:
            if b.minute >= oldest:
                ok += b.ok
                err += b.errors
                tokens += b.tokens
        return ok, err, tokens

    # -- MetricsView ----------------------------------------------------------------------------

    def ewma_ms(self, key: str) -> float | None:
        s = self._series.get(key)
        return None if s is None else s.ewma

    def p95_ms(self, key: str) -> float | None:
        """Nearest-rank p95 of the last ``samples`` successful latencies."""
        s = self._series.get(key)
        if s is None or not s.latencies:
            return None
        if s.p95 is None:
            ordered = sorted(s.latencies)
            s.p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
        return s.p95

    def quantile_ms(self, key: str, q: float) -> float | None:
        """Nearest-rank ``q`` quantile of the kept latencies; sorts them (dashboard reads only,
        never the routing hot path, which uses the cached :meth:`p95_ms`)."""
        s = self._series.get(key)
        if s is None or not s.latencies:
            return None
        ordered = sorted(s.latencies)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    def success_rate(self, key: str, now_ms: int) -> float | None:
        ok, err, _ = self._window_sums(key, now_ms)
        total = ok + err
        return None if total == 0 else ok / total

    def error_rate(self, key: str, now_ms: int) -> float | None:
        rate = self.success_rate(key, now_ms)
        return None if rate is None else 1.0 - rate

    def uses(self, key: str, now_ms: int) -> int:
        ok, err, _ = self._window_sums(key, now_ms)
        return ok + err

    def tokens(self, key: str, now_ms: int) -> int:
        return self._window_sums(key, now_ms)[2]

    def last_ok_ms(self, key: str) -> int | None:
        s = self._series.get(key)
        return None if s is None else s.last_ok_ms

    def last_error_ms(self, key: str) -> int | None:
        s = self._series.get(key)
        return None if s is None else s.last_err_ms

    # -- housekeeping ---------------------------------------------------------------------------

    def stats(self, key: str, now_ms: int) -> TargetStats:
        ok, err, tokens = self._window_sums(key, now_ms)
        return TargetStats(
            key=key,
            ewma_ms=self.ewma_ms(key),
            p95_ms=self.p95_ms(key),
            requests=ok + err,
            errors=err,
            success_rate=None if ok + err == 0 else ok / (ok + err),
            tokens=tokens,
            last_ok_ms=self.last_ok_ms(key),
            last_error_ms=self.last_error_ms(key),
            p50_ms=self.quantile_ms(key, 0.5),
        )

    @property
    def window_minutes(self) -> int:
        """How many minutes the outcome counts cover."""
        return self._window

    def keys(self) -> list[str]:
        return list(self._series)

    def forget(self, key: str) -> None:
        self._series.pop(key, None)

    def sample_count(self, key: str) -> int:
        """Latency samples kept for ``key`` (≤ ``samples``)."""
        s = self._series.get(key)
        return 0 if s is None else len(s.latencies)

    def minute_count(self, key: str) -> int:
        """Minute buckets kept for ``key`` (≤ ``window_minutes``)."""
        s = self._series.get(key)
        return 0 if s is None else len(s.minutes)
