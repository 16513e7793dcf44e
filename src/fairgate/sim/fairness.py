"""Fairness and efficiency figures of one policy's run, against the exact ideal (pure).

Measured on the scenario's primary dimension, window by window (the dimension's own buckets,
aligned to the epoch like the counters): in each window the ideal is the weighted max-min fair
allocation of the window's capacity over what each key asked in it (bounded by its cap), see
:mod:`fairgate.sim.ideal`. Per-window ideals follow demand that changes over time (a key that
arrives late is owed nothing before it arrives); summed over the run they give each key's ideal.

- **Jain's index** ``(Σx)² / (n Σx²)`` over the keys that had demand (the backlogged ones: a key
  that asked nothing is owed nothing and has no ratio), with ``x = admitted / ideal`` summed
  over the run. 1 means every key got the same fraction of what it was owed; one key getting
  everything out of n gives 1/n. The worst single window is reported too.
- **Utilisation**: admitted ÷ the most that demand allowed, i.e. per window
  ``min(capacity, Σ capped demand)`` (which is what the ideal hands out), summed over the run.
  A work-conserving policy reaches 1; one that refuses requests while the pool has room does not.
- **Overshoot**: how far the pool's sliding-window count went above its limit, per dimension,
  as a fraction of the limit (0 is the promise).
- **Blocked**: refusals per key; **time to first block** of each well-behaved key (one whose
  demand never exceeded its weighted share in any window), None when it was never refused;
  and how long admitted requests waited (refused, then retried), 95th percentile per key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairgate.sim.ideal import max_min_fair


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index; 1.0 for an empty or all-zero input (nothing to be unfair about)."""
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    if sq <= 0:
        return 1.0
    return s * s / (len(xs) * sq)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    index: int
    capacity: float
    demand: dict[str, float]
    ideal: dict[str, float]
    admitted: dict[str, float]

    @property
    def allowed(self) -> float:
        """The most demand allowed in this window (what the ideal hands out)."""
        return sum(self.ideal.values())

    def jain(self) -> float | None:
        """Jain's index of this window alone, None when fewer than two keys had demand."""
        xs = [self.admitted.get(k, 0.0) / v for k, v in self.ideal.items() if v > 0]
        return jain(xs) if len(xs) >= 2 else None


def window_figures(
    capacity: float,
    weights: Mapping[str, float],
    caps: Mapping[str, float | None],
    demand: Sequence[Mapping[str, float]],
    admitted: Sequence[Mapping[str, float]],
) -> list[WindowFigures]:
    """The ideal of every window, beside what was asked and admitted in it."""
    keys = list(weights)
    out: list[WindowFigures] = []
    for i, (want, got) in enumerate(zip(demand, admitted, strict=True)):
        bounded = [_bounded(want.get(k, 0.0), caps.get(k)) for k in keys]
        ideal = max_min_fair(capacity, [weights[k] for k in keys], bounded)
        out.append(
            WindowFigures(
                index=i,
                capacity=capacity,
                demand={k: want.get(k, 0.0) for k in keys},
                ideal=dict(zip(keys, ideal, strict=True)),
                admitted={k: got.get(k, 0.0) for k in keys},
            )
        )
    return out


def _bounded(demand: float, cap: float | None) -> float:
    return demand if cap is None else min(demand, cap)


@dataclass(frozen=True, slots=True)
class Metrics:
    jain: float
    jain_worst_window: float
    jain_window_mean: float
    utilisation: float
    overshoot: dict[str, float]
    blocked: dict[str, int]
    dropped: dict[str, int]
    admitted: dict[str, float]
    ideal: dict[str, float]
    demand: dict[str, float]
    ratio: dict[str, float]
    well_behaved: list[str]
    first_block_ms: dict[str, int | None] = field(default_factory=dict)
    #: 95th percentile of the time admitted requests waited (refused, retried), per key
    wait_p95_ms: dict[str, int] = field(default_factory=dict)

    @property
    def blocked_total(self) -> int:
        return sum(self.blocked.values())

    @property
    def first_block_well_behaved_ms(self) -> int | None:
        """The earliest refusal of any well-behaved key (None: none was ever refused)."""
        times = [t for k in self.well_behaved if (t := self.first_block_ms.get(k)) is not None]
        return min(times) if times else None


def well_behaved_keys(windows: Sequence[WindowFigures], shares: Mapping[str, float]) -> list[str]:
    """Keys that asked something but never more than their weighted share in any window."""
    out = []
    for k, share in shares.items():
        asked = [w.demand.get(k, 0.0) for w in windows]
        if any(a > 0 for a in asked) and all(a <= share + 1e-9 for a in asked):
            out.append(k)
    return out


def summarize(
    windows: Sequence[WindowFigures],
    *,
    shares: Mapping[str, float],
    overshoot: Mapping[str, float],
    blocked: Mapping[str, int],
    dropped: Mapping[str, int],
    first_block_ms: Mapping[str, int | None],
    waits_ms: Mapping[str, Sequence[int]] | None = None,
) -> Metrics:
    keys = list(shares)
    admitted = {k: sum(w.admitted.get(k, 0.0) for w in windows) for k in keys}
    ideal = {k: sum(w.ideal.get(k, 0.0) for w in windows) for k in keys}
    demand = {k: sum(w.demand.get(k, 0.0) for w in windows) for k in keys}
    ratio = {k: admitted[k] / ideal[k] for k in keys if ideal[k] > 0}
    per_window = [j for w in windows if (j := w.jain()) is not None]
    allowed = sum(w.allowed for w in windows)
    total = sum(admitted.values())
    well = well_behaved_keys(windows, shares)
    return Metrics(
        jain=jain(list(ratio.values())),
        jain_worst_window=min(per_window) if per_window else 1.0,
        jain_window_mean=sum(per_window) / len(per_window) if per_window else 1.0,
        utilisation=total / allowed if allowed > 0 else 1.0,
        overshoot=dict(overshoot),
        blocked={k: int(blocked.get(k, 0)) for k in keys},
        dropped={k: int(dropped.get(k, 0)) for k in keys},
        admitted=admitted,
        ideal=ideal,
        demand=demand,
        ratio=ratio,
        well_behaved=well,
        first_block_ms={k: first_block_ms.get(k) for k in well},
        wait_p95_ms={k: _p95(v) for k, v in (waits_ms or {}).items()},
    )


def _p95(xs: Sequence[int]) -> int:
    if not xs:
        return 0
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * 0.95))]
