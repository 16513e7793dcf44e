"""Burn rate and time to exhaustion (SPEC §6).

An exponential moving average (α 0.3) of the consumption rate between timestamped samples of a
monotonic cumulative counter. Fewer than two usable samples → rate 0 and no time to exhaustion,
so a new pool shows "no data" rather than a made-up forecast.

The same holds until the samples span :data:`MIN_SPAN_MS` (one minute): three requests in the
first second are a burst, not a rate, and extrapolating them said "exhausted in 17 s" for a
pool that would last hours. A minute holds at least a dozen samples at the 5 s sampling
interval, enough for the moving average to mean something.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

ALPHA = 0.3
#: No rate is reported before the samples span this long.
MIN_SPAN_MS = 60_000
#: :meth:`BurnSeries.next_due_ms` of a series without samples: before any instant.
_NEVER_SAMPLED = -(2**63)


@dataclass(frozen=True, slots=True)
class Sample:
    t_ms: int
    value: float


def ema_rate(samples: list[Sample] | tuple[Sample, ...], alpha: float = ALPHA) -> float:
    """Units per second. Samples with Δt = 0 are skipped; a decrease (counter reset) counts 0."""
    rate: float | None = None
    prev: Sample | None = None
    for s in samples:
        if prev is not None:
            dt = s.t_ms - prev.t_ms
            if dt <= 0:
                continue
            r = max(0.0, s.value - prev.value) / (dt / 1000.0)
            rate = r if rate is None else alpha * r + (1 - alpha) * rate
        prev = s
    return rate or 0.0


def time_to_exhaustion_ms(remaining: float, rate_per_s: float) -> int | None:
    if rate_per_s <= 0:
        return None
    return int(max(0.0, remaining) / rate_per_s * 1000)


class BurnSeries:
    """A bounded series of samples for one pool counter; old samples fall off the front."""

    def __init__(self, maxlen: int = 120, min_interval_ms: int = 5_000) -> None:
        self._samples: deque[Sample] = deque(maxlen=maxlen)
        self._min_interval = min_interval_ms

    def due(self, now_ms: int) -> bool:
        return not self._samples or now_ms - self._samples[-1].t_ms >= self._min_interval

    def next_due_ms(self) -> int:
        """The first instant at which :meth:`due` holds (the smallest int when it holds now
        whatever the time: no sample yet)."""
        if not self._samples:
            return _NEVER_SAMPLED
        return self._samples[-1].t_ms + self._min_interval

    def add(self, t_ms: int, value: float) -> None:
        if self._samples and t_ms <= self._samples[-1].t_ms:
            return
        self._samples.append(Sample(t_ms, value))

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(self._samples)

    def span_ms(self) -> int:
        return self._samples[-1].t_ms - self._samples[0].t_ms if self._samples else 0

    def rate(self) -> float:
        """Units per second, 0 ("no data") until the samples span :data:`MIN_SPAN_MS`."""
        if self.span_ms() < MIN_SPAN_MS:
            return 0.0
        return ema_rate(self.samples)
