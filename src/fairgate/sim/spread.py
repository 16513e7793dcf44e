"""Many seeds of one scenario: which seeds to run, and the spread of their figures.

One seed is one draw of the workload (bursts, token sizes, the interleaving of requests); a
policy that meets its targets on seed 1 may miss them on seed 7. ``fairgate simulate --seeds
1-10`` runs every seed and reports, per scenario and policy, the worst and the median of each
figure (the worst is what a target must hold for), the lowest and highest per-key ratio
over all the seeds, and how many of the runs meet every target.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from fairgate.sim.gate import run_verdict
from fairgate.sim.policies import HELD_ENGINE
from fairgate.sim.runner import ScenarioResult
from fairgate.sim.targets import meets

#: Most seeds one command runs (each is a full run of every policy).
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """``"1-10"`` → 1..10, ``"1,4,9"`` → those, ``"3"`` → [3]; a clear ValueError otherwise."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            msg = f"--seeds: not a seed or a range: {part!r} (use e.g. 1-10 or 1,4,9)"
            raise ValueError(msg) from None
        if lo < 0 or hi < lo:
            raise ValueError(f"--seeds: bad range {part!r} (seeds are 0 or more, low-high)")
        seeds.extend(range(lo, hi + 1))
        if len(seeds) > MAX_SEEDS:
            raise ValueError(f"--seeds: at most {MAX_SEEDS} seeds")
    return list(dict.fromkeys(seeds))


@dataclass(frozen=True, slots=True)
class Spread:
    """One scenario and policy over several seeds."""

    scenario: str
    policy: str
    seeds: int
    jain_min: float
    jain_median: float
    worst_window_min: float
    worst_window_median: float
    utilisation_min: float
    utilisation_median: float
    ratio_min: float
    ratio_max: float
    overshoot_max: float
    #: how many of the runs meet every target (:func:`fairgate.sim.targets.meets`)
    meeting: int
    #: the active row: how many of the runs pass the gate against the references run beside
    #: them (:func:`fairgate.sim.gate.run_verdict`); None for other rows or without references
    gate: int | None = None


#: the rows gated against the references: fairgate's active mode, refusing and holding
GATED = ("active", HELD_ENGINE)


def spreads(results: Sequence[ScenarioResult]) -> list[Spread]:
    """Group the results by scenario (in order of appearance) and policy."""
    groups: dict[tuple[str, str], list[ScenarioResult]] = {}
    for r in results:
        for policy in r.runs:
            groups.setdefault((r.scenario.name, policy), []).append(r)
    out: list[Spread] = []
    for (name, policy), rs in groups.items():
        ms = [r.runs[policy].metrics for r in rs]
        ratios = [v for m in ms for v in m.ratio.values()]
        out.append(
            Spread(
                scenario=name,
                policy=policy,
                seeds=len(rs),
                jain_min=min(m.jain for m in ms),
                jain_median=statistics.median(m.jain for m in ms),
                worst_window_min=min(m.jain_worst_window for m in ms),
                worst_window_median=statistics.median(m.jain_worst_window for m in ms),
                utilisation_min=min(m.utilisation for m in ms),
                utilisation_median=statistics.median(m.utilisation for m in ms),
                ratio_min=min(ratios, default=1.0),
                ratio_max=max(ratios, default=1.0),
                overshoot_max=max((v for m in ms for v in m.overshoot.values()), default=0.0),
                meeting=sum(all(meets(m).values()) for m in ms),
                gate=_gate_count(rs, policy) if policy in GATED else None,
            )
        )
    return out


def _gate_count(results: Sequence[ScenarioResult], policy: str) -> int | None:
    """How many runs of ``policy`` pass the gate; None when none had references run beside
    them."""
    verdicts = [v for r in results if (v := run_verdict(r, policy)) is not None]
    return sum(v.passed for v in verdicts) if verdicts else None
