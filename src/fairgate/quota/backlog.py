"""Which keys are *backlogged*: refused without a break since before the current window began.

Active mode judges a key's share on its use of the current window (issue 17,
:func:`fairgate.quota.decision.standing`): what a key borrowed in an earlier window while others
were away is not held against it in this one, and a key coming back after a quiet spell stands
first in line. A key that asks for more than it gets all the time is the exception: judged on
the window alone it would start every window owed its whole share and race the returning keys
for the first slots the window frees, so it keeps its sliding count (the seeds' rule), which
paces it. This module tells the two apart from the refusals alone, O(1) per refusal.

A *run* of refusals is broken when no refusal follows within ``max(MIN_GAP_MS, the key's
Retry-After, GAP_FACTOR × its usual time between refusals)``: a client that retries every few
seconds, one that honours a Retry-After of minutes, and one that polls every five minutes are
all still asking. The Retry-After counts only for a client that waits for it: one that comes
back in under ``1/FAST_FACTOR`` of it is asking at its own pace, so a pause in that pace (its
queue ran dry) ends its run after at most ``FAST_HOLD_MS`` whatever it was told. A share's
Retry-After can be the rest of a 5-hour window; held by it, the run of a key that had stopped
asking outlived the window's turn, and its next requests were judged on a sliding count that
still held what it borrowed before (``subscription`` seed 7: 38 of the 51 it asked in a window,
docs/fairness.md's sixth pass). A key is backlogged in a dimension while its run is alive and
began before that dimension's current window did. A refusal by a budget of a longer window than
the pool's shortest (a paced week beside a 5-hour window) is not part of a run: the week's line
refuses every key that asks while it binds, and says nothing about who asks beyond its 5-hour
share (:func:`fairgate.quota.decision.longer_budgets`).

Worked example (hourly window): a batch key refused every 30 s since 09:40 is backlogged from
10:00 on; a light key refused from 10:02 to 10:05 while its burst waited, and again at 10:20,
is not (its run broke at 10:06, and neither run began before 10:00).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fairgate.records import record

__all__ = [
    "FAST_FACTOR",
    "FAST_HOLD_MS",
    "GAP_FACTOR",
    "MIN_GAP_MS",
    "SAME_ATTEMPT_MS",
    "Streak",
    "backlogged",
    "refused",
]

#: A run of refusals survives at least this long without a refusal (one minute).
MIN_GAP_MS = 60_000
#: ... and this many times the key's usual time between refusals.
GAP_FACTOR = 2.5
#: A client that retries in under 1/FAST_FACTOR of the Retry-After it was told does not wait
#: for it: its run is held past a refusal by its own pace, for at most FAST_HOLD_MS, not by the
#: Retry-After (which can be the rest of a window).
FAST_FACTOR = 4
FAST_HOLD_MS = 150_000
#: Refusals closer together than this are one attempt's (a burst of concurrent requests, a
#: client's own quick retry): they say nothing about how often the key comes back, so they do
#: not enter its usual gap (which they would drag to nothing).
SAME_ATTEMPT_MS = 1_000


@record
class Streak:
    """A key's current run of refusals."""

    first_ms: int  #: when the run began
    last_ms: int  #: the latest refusal
    until_ms: int  #: the run is broken if no refusal comes before this
    gap_ms: float  #: the key's usual time between two refusals (a running mean)


def refused(run: Streak | None, now_ms: int, hold_ms: int, idle_ms: int) -> Streak:
    """The run after a refusal at ``now_ms``. ``hold_ms``: how long the refusal keeps the key
    counted as wanting more (at least its Retry-After); ``idle_ms``: a pause longer than this
    between two refusals is not the key's rhythm but a key that had stopped asking (the pool's
    active window), so it does not enter the usual gap."""
    gap = MIN_GAP_MS / GAP_FACTOR if run is None else run.gap_ms
    if run is not None and SAME_ATTEMPT_MS <= now_ms - run.last_ms <= idle_ms:
        gap = (gap + (now_ms - run.last_ms)) / 2
    if run is not None and FAST_FACTOR * gap < hold_ms:
        # it comes back long before it was told to: it is still asking only while it keeps
        # coming back, so a pause in its retries ends the run whatever the Retry-After said
        hold_ms = min(hold_ms, FAST_HOLD_MS)
    alive = run is not None and now_ms <= run.until_ms
    first = run.first_ms if alive and run is not None else now_ms
    until = now_ms + max(hold_ms, MIN_GAP_MS, round(GAP_FACTOR * gap))
    return Streak(first, now_ms, until, gap)


def backlogged(
    runs: Mapping[str, Streak], now_ms: int, windows: Sequence[tuple[str, int]]
) -> dict[str, frozenset[str]]:
    """Per key with a live run, the dimensions it is backlogged in: those of ``windows``
    (``(dimension key, when its current window began)``) whose window began after its run."""
    out: dict[str, frozenset[str]] = {}
    for key, run in runs.items():
        if now_ms > run.until_ms:
            continue
        dims = frozenset(d for d, start in windows if run.first_ms <= start)
        if dims:
            out[key] = dims
    return out
