"""Two-bucket sliding-window arithmetic (SPEC §2).

A counter keeps two fixed buckets: ``curr = floor(now / W)`` and ``prev = curr - 1``. Its value is
``prev × (1 - elapsed / W) + curr``. Worked example, W = 1 h, at 10:15 (elapsed 0.25 W) with 40
requests in the 09:00 bucket and 10 in the 10:00 bucket: 40 × 0.75 + 10 = 40.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def bucket_index(now_ms: int, window_ms: int) -> int:
    return now_ms // window_ms


@dataclass(frozen=True, slots=True)
class Count:
    """The two raw buckets of one counter, as read at ``now``."""

    prev: float = 0.0
    curr: float = 0.0

    def value(self, now_ms: int, window_ms: int) -> float:
        return sliding_value(self.prev, self.curr, now_ms, window_ms)


def sliding_value(prev: float, curr: float, now_ms: int, window_ms: int) -> float:
    elapsed = now_ms - bucket_index(now_ms, window_ms) * window_ms
    return prev * (1.0 - elapsed / window_ms) + curr


def ms_until_at_most(count: Count, target: float, now_ms: int, window_ms: int) -> int | None:
    """Milliseconds until the counter's value decays to ``target`` or below, assuming no new use.

    0 if it already is; None if it never will (a negative target). This is the ``retry_after`` of a
    block: the previous bucket fades linearly over the current bucket, then the current bucket
    becomes the previous one and fades over the next.
    """
    if target < 0:
        return None
    if count.value(now_ms, window_ms) <= target:
        return 0
    start = bucket_index(now_ms, window_ms) * window_ms
    elapsed = now_ms - start
    # Still in this bucket: prev × (1 - e/W) + curr <= target.
    if count.prev > 0 and count.curr <= target:
        e = window_ms * (1.0 - (target - count.curr) / count.prev)
        return max(1, math.ceil(e - elapsed))
    # Next bucket: curr fades, nothing new: curr × (1 - e'/W) <= target.
    if count.curr <= 0:
        return max(1, window_ms - elapsed)
    e_next = window_ms * (1.0 - target / count.curr)
    return max(1, math.ceil(window_ms - elapsed + e_next))
