"""Fallbacks per combo and reason over the last minutes, with bounded memory.

A *fallback* is a combo moving on to another target because the previous one failed; its
*reason* is that failure's class (``rate_limit``, ``server_error``, ``timeout``…). Operators ask
"is this combo falling back, and why?" about *now*, so the counts are per-minute buckets over
the last ``window_minutes`` (15), like :class:`~fairgate.routing.metrics.TargetMetrics`.

Memory: at most ``max_combos`` combos (least recently recorded dropped first) × ``window_minutes``
buckets × the reasons seen, which are the classifier's few classes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque

__all__ = ["FallbackCounts"]

MINUTE_MS = 60_000


class FallbackCounts:
    """Windowed fallback counts by combo and reason. Lives on the event loop (not thread-safe)."""

    __slots__ = ("_combos", "_max", "_window")

    def __init__(self, *, window_minutes: int = 15, max_combos: int = 10_000) -> None:
        if window_minutes < 1 or max_combos < 1:
            raise ValueError("window_minutes and max_combos must be ≥ 1")
        self._window = window_minutes
        self._max = max_combos
        self._combos: OrderedDict[str, deque[tuple[int, Counter[str]]]] = OrderedDict()

    @property
    def window_minutes(self) -> int:
        return self._window

    def __len__(self) -> int:
        return len(self._combos)

    def record(self, combo: str, reason: str, now_ms: int) -> None:
        """One fallback of ``combo`` because a target failed with ``reason``."""
        minutes = self._combos.get(combo)
        if minutes is None:
            minutes = deque(maxlen=self._window)
            self._combos[combo] = minutes
            while len(self._combos) > self._max:
                self._combos.popitem(last=False)
        else:
            self._combos.move_to_end(combo)
        minute = now_ms // MINUTE_MS
        if minutes and minutes[-1][0] >= minute:
            minutes[-1][1][reason] += 1  # this minute (or a late record: counted in the newest)
        else:
            minutes.append((minute, Counter({reason: 1})))

    def counts(self, combo: str, now_ms: int) -> dict[str, int]:
        """Reason → fallbacks of ``combo`` in the window ending now."""
        oldest = now_ms // MINUTE_MS - self._window + 1
        out: Counter[str] = Counter()
        for minute, reasons in self._combos.get(combo, ()):
            if minute >= oldest:
                out.update(reasons)
        return dict(out)
