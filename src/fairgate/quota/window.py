"""Two-bucket sliding-window arithmetic (SPEC §2), and windows anchored to a provider's reset.

A counter keeps two fixed buckets: ``curr = floor(now / W)`` and ``prev = curr - 1``. Its value is
``prev × (1 - elapsed / W) + curr``. Worked example, W = 1 h, at 10:15 (elapsed 0.25 W) with 40
requests in the 09:00 bucket and 10 in the 10:00 bucket: 40 × 0.75 + 10 = 40.

**Provider-anchored windows** (issue 12). A subscription's percent window is not a sliding
window: the provider counts from the window's start (the account's first use) and resets to 0
at a time it states. When a reading states that reset ``R`` and the length ``W``, the pool's
window for that dimension is anchored there: an :class:`Anchor` names the window ``[R - W, R)``
and the bucket index it is counted in, later windows follow at the same phase (``R + k·W``), and
a counter's value is its current bucket only (the window rolls over to 0 at the reset, as the
provider's quota does). Worked example, W = 5 h, a reading at 10:20 says "resets at 14:00":
the window is 09:00–14:00, so at 13:59 a key's count is everything since 09:00 and at 14:00 it
is 0; the next window runs 14:00–19:00 whether or not a reading says so. Without a reading the
window stays epoch-aligned (and sliding).

Bucket indices of anchored windows stay in the epoch-aligned index space (``floor(R / W) - 1``
for the window ending at ``R``), so retention and reservation arithmetic that compares an index
with ``floor(now / W)`` stays right to within a window. :func:`reanchor` is the one rule for
moving an anchor; it never gives the current window an index below the one in use, and gives a
window that replaces a still-running one (an early reset) a fresh index, so counts of the old
window never carry over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairgate.records import record

#: Two stated resets this close (modulo the window) are the same window: providers state resets
#: in seconds or as "resets in N s", so one window's reset moves by a second or two between
#: readings.
ANCHOR_TOLERANCE_MS = 60_000


@dataclass(frozen=True, slots=True)
class Anchor:
    """A provider-anchored window: the window ending at ``reset_ms`` is counted in bucket
    ``index``; every window is ``W`` long, so the one containing ``now`` ends at
    ``reset_ms + k·W``. ``source``: the connection whose reading set it (a pool of several
    accounts follows one of them, see :func:`reanchor`)."""

    reset_ms: int
    index: int
    source: str = ""


def bucket_index(now_ms: int, window_ms: int, anchor: Anchor | None = None) -> int:
    if anchor is None:
        return now_ms // window_ms
    return anchor.index + (now_ms - anchor.reset_ms) // window_ms + 1


def window_end_ms(now_ms: int, window_ms: int, anchor: Anchor | None = None) -> int:
    """When the window containing ``now`` ends: its bucket turns (epoch-aligned), or the
    provider's quota resets (anchored)."""
    if anchor is None:
        return (now_ms // window_ms + 1) * window_ms
    return anchor.reset_ms + ((now_ms - anchor.reset_ms) // window_ms + 1) * window_ms


def natural_index(reset_ms: int, window_ms: int) -> int:
    """The epoch-like bucket index of the window ``[reset - W, reset)``."""
    return reset_ms // window_ms - 1


def reanchor(
    current: Anchor | None,
    reset_ms: int,
    window_ms: int,
    now_ms: int,
    source: str = "",
    tolerance_ms: int = ANCHOR_TOLERANCE_MS,
) -> Anchor | None:
    """The anchor after a reading that says "this window (``window_ms`` long) resets at
    ``reset_ms``", or None when the stored one stands (nothing to write).

    - A reset that cannot be this window's (in the past, or more than a window away) is ignored.
    - The same window, or a later one at the same phase, from the same source: the stored one
      stands within ``tolerance_ms``; a later window just moves ``reset_ms`` (same phase, the
      index follows), so a source that keeps reporting keeps its anchor fresh.
    - Another member connection of the pool moves the anchor only once the stored window's last
      stated reset has passed unrenewed (the pool follows one account, not whichever answered
      last, or its windows would restart at every reading).
    - A new phase (the account's first use after an idle spell started a new window, or the
      provider reset early): after the stored window's stated reset, the current bucket holds
      only use since then, which belongs to the new window, so it is kept; before it (an early
      reset), the new window gets the next index, so the old window's counts do not carry over.
      Either way the index never goes back: the current window's index is at least the one in
      use now.
    """
    if reset_ms <= now_ms or reset_ms - window_ms > now_ms + tolerance_ms:
        return None
    # a window stated to start a moment from now (a reset rounded up to the second) starts now
    reset_ms = min(reset_ms, now_ms + window_ms)
    natural = natural_index(reset_ms, window_ms)
    if current is None:
        # epoch-aligned until now: carry what the current epoch bucket holds
        return Anchor(reset_ms, max(natural, bucket_index(now_ms, window_ms)), source)
    steps = round((reset_ms - current.reset_ms) / window_ms)
    drift = reset_ms - (current.reset_ms + steps * window_ms)
    if abs(drift) <= tolerance_ms:  # the same phase
        if current.source != source and now_ms < current.reset_ms:
            return None
        moved = Anchor(reset_ms, current.index + steps, source)
        if steps <= 0 or bucket_index(now_ms, window_ms, moved) < bucket_index(
            now_ms, window_ms, current
        ):
            # the window stored, an older one (a late reading), or a boundary the provider
            # states a moment later than the stored one: the stored one stands
            return None
        return moved
    if current.source != source and now_ms < current.reset_ms:
        return None
    in_use = bucket_index(now_ms, window_ms, current)
    floor_index = in_use if now_ms >= current.reset_ms else in_use + 1
    return Anchor(reset_ms, max(natural, floor_index), source)


@record
class Count:
    """The two raw buckets of one counter, as read at ``now``. ``anchor``: the counter's window
    is anchored to a provider's reset (its value is then the current bucket alone)."""

    prev: float = 0.0
    curr: float = 0.0
    anchor: Anchor | None = None

    def value(self, now_ms: int, window_ms: int) -> float:
        if self.anchor is not None:
            return self.curr
        return sliding_value(self.prev, self.curr, now_ms, window_ms)


def ms_until_under_line(
    count: Count,
    target: float,
    rise_per_ms: float,
    now_ms: int,
    window_ms: int,
    line_until_ms: int | None = None,
) -> int | None:
    """Milliseconds until the counter's value (no new use) is at or under a line that starts
    at ``target`` and rises ``rise_per_ms`` until ``line_until_ms``; None if not before the
    line stops or the bucket ends (then the caller knows only a longer bound). The
    ``retry_after`` of a block by room a pacing line holds (``fairgate.quota.decision.Fall``):
    the room and the previous bucket's fade both move linearly until then."""
    v = count.value(now_ms, window_ms)
    if v <= target:
        return 0
    decay = 0.0 if count.anchor is not None else max(0.0, count.prev) / window_ms
    speed = decay + max(0.0, rise_per_ms)
    if speed <= 0:
        return None
    t = math.ceil((v - target) / speed)
    left = window_end_ms(now_ms, window_ms, count.anchor) - now_ms
    if line_until_ms is not None:
        left = min(left, line_until_ms - now_ms)
    return max(1, t) if t < left else None


def fade(now_ms: int, window_ms: int) -> float:
    """How much of the previous bucket still counts at ``now``: 1 as the current bucket
    starts, 0 as it ends (epoch-aligned windows). Computed once per counter pair on the hot
    path, where a pool total and a key's count share it."""
    return 1.0 - (now_ms - now_ms // window_ms * window_ms) / window_ms


def sliding_value(prev: float, curr: float, now_ms: int, window_ms: int) -> float:
    return prev * fade(now_ms, window_ms) + curr


def ms_until_at_most(count: Count, target: float, now_ms: int, window_ms: int) -> int | None:
    """Milliseconds until the counter's value decays to ``target`` or below, assuming no new use.

    0 if it already is; None if it never will (a negative target). This is the ``retry_after`` of a
    block: the previous bucket fades linearly over the current bucket, then the current bucket
    becomes the previous one and fades over the next. An anchored counter drops to 0 at once
    when the provider's window resets.
    """
    if target < 0:
        return None
    if count.value(now_ms, window_ms) <= target:
        return 0
    if count.anchor is not None:
        return max(1, window_end_ms(now_ms, window_ms, count.anchor) - now_ms)
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
