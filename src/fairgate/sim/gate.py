"""The gate of issue 45: fairgate's ``active`` run beside the online references' (pure).

The absolute goal stays :mod:`fairgate.sim.targets` (Jain ≥ 0.99, worst window ≥ 0.95, every
key 0.90–1.10 of its ideal, utilisation ≥ 98 %, no overshoot). Where no online rule reaches
it, the bar is the best of the reference schedulers (:mod:`fairgate.sim.reference`) run on the
same requests and seed, figure by figure. A run passes when:

- Jain ≥ min(0.99, best reference − 0.005);
- worst window ≥ min(0.95, best reference − 0.02);
- utilisation ≥ min(98 %, best reference − 0.5 points);
- every key ≥ min(0.90, the best reference's lowest key − 0.05);
- every hard key ≤ max(1.10, the best reference's highest hard key + 0.05);
- no overshoot in any dimension.

Small keys: a key within one request per window it asked in of its ideal
(:attr:`~fairgate.sim.fairness.Metrics.slack`) passes the per-key band whatever its ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from fairgate.quota.model import Policy
from fairgate.sim.fairness import Metrics
from fairgate.sim.policies import REFERENCE_NAMES
from fairgate.sim.runner import ScenarioResult
from fairgate.sim.targets import (
    EXACT,
    TARGET_JAIN,
    TARGET_RATIO,
    TARGET_UTILISATION,
    TARGET_WORST_WINDOW,
)

#: the gate's checks, in the order they are printed
GATE_NAMES = ("jain", "worst_window", "utilisation", "key_low", "key_high", "overshoot")


@dataclass(frozen=True, slots=True)
class Bar:
    """What a run must reach on each figure, and the reference that set it (``"goal"`` where
    the absolute goal is the lower bar)."""

    jain: float
    worst_window: float
    utilisation: float
    key_low: float
    key_high: float
    set_by: dict[str, str]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One run against the bar: each check, the keys outside the band, and the distance to
    the absolute goal per figure (0 where it is met)."""

    bar: Bar
    checks: dict[str, bool]
    low_keys: list[str]
    high_keys: list[str]
    distance: dict[str, float]

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


def _lowest(m: Metrics) -> float:
    return min(m.ratio.values(), default=1.0)


def _highest(m: Metrics, hard: Collection[str]) -> float:
    return max((r for k, r in m.ratio.items() if k in hard), default=1.0)


def bar(references: Mapping[str, Metrics], hard: Collection[str]) -> Bar:
    """The bar the best reference sets on each figure (the absolute goal where it is lower:
    a reference better than the goal does not raise the bar above it)."""
    if not references:
        raise ValueError("the gate needs at least one reference run")
    lo, hi = TARGET_RATIO
    figures: dict[str, tuple[float, float, Callable[[Metrics], float]]] = {
        "jain": (TARGET_JAIN, -0.005, lambda m: m.jain),
        "worst_window": (TARGET_WORST_WINDOW, -0.02, lambda m: m.jain_worst_window),
        "utilisation": (TARGET_UTILISATION, -0.005, lambda m: m.utilisation),
        "key_low": (lo, -0.05, _lowest),
    }
    values: dict[str, float] = {}
    set_by: dict[str, str] = {}
    for name, (goal, margin, read) in figures.items():
        best = max(references, key=lambda r: read(references[r]))
        ref = read(references[best]) + margin
        values[name], set_by[name] = (goal, "goal") if goal <= ref else (ref, best)
    best_high = min(references, key=lambda r: _highest(references[r], hard))
    ref_high = _highest(references[best_high], hard) + 0.05
    values["key_high"], set_by["key_high"] = (
        (hi, "goal")
        if hi >= ref_high
        else (
            ref_high,
            best_high,
        )
    )
    return Bar(set_by=set_by, **values)


def judge_run(
    metrics: Metrics, references: Mapping[str, Metrics], hard: Collection[str]
) -> Verdict:
    """``metrics`` (fairgate's active run) against the bar of ``references`` (the reference
    runs on the same requests, by name); ``hard``: the ids of the hard-policy keys (only
    they are held to the upper band)."""
    b = bar(references, hard)
    low: list[str] = []
    high: list[str] = []
    for k, r in sorted(metrics.ratio.items()):
        slack = metrics.slack.get(k, 0.0)
        if r < b.key_low and 1.0 - r > slack:
            low.append(k)
        if k in hard and r > b.key_high and r - 1.0 > slack:
            high.append(k)
    overshoot = max(metrics.overshoot.values(), default=0.0)
    checks = {
        "jain": metrics.jain >= b.jain,
        "worst_window": metrics.jain_worst_window >= b.worst_window,
        "utilisation": metrics.utilisation >= b.utilisation,
        "key_low": not low,
        "key_high": not high,
        "overshoot": overshoot <= EXACT,
    }
    return Verdict(b, checks, low, high, distance_to_goal(metrics))


def distance_to_goal(metrics: Metrics) -> dict[str, float]:
    """How far each figure is from the absolute goal (0 where it is met): Jain, worst window
    and utilisation below their targets; the lowest key below 0.90 and the highest above
    1.10 (each key's small-key allowance counted); overshoot above 0."""
    lo, hi = TARGET_RATIO
    outside = [(k, r) for k, r in metrics.ratio.items() if abs(r - 1.0) > metrics.slack.get(k, 0.0)]
    return {
        "jain": max(0.0, TARGET_JAIN - metrics.jain),
        "worst_window": max(0.0, TARGET_WORST_WINDOW - metrics.jain_worst_window),
        "utilisation": max(0.0, TARGET_UTILISATION - metrics.utilisation),
        "key_low": max([0.0, *(lo - r for _k, r in outside)]),
        "key_high": max([0.0, *(r - hi for _k, r in outside)]),
        "overshoot": max(metrics.overshoot.values(), default=0.0),
    }


def run_verdict(result: ScenarioResult, policy: str = "active") -> Verdict | None:
    """The gate of one scenario's run: its ``active`` run (or ``policy``'s, e.g.
    ``hold``) against the references run beside it (None when either is missing, e.g.
    ``--policies active``)."""
    refs = {n: r.metrics for n, r in result.runs.items() if n in REFERENCE_NAMES}
    active = result.runs.get(policy)
    if active is None or not refs:
        return None
    hard = [k.id for k in result.scenario.keys if k.policy is Policy.HARD]
    return judge_run(active.metrics, refs, hard)


def describe_verdict(v: Verdict) -> str:
    """One line per figure: the run's, the bar (and who set it), ✓ or ✗; then the distance
    to the absolute goal."""
    b = v.bar

    def who(name: str) -> str:
        return b.set_by[name]

    parts = [
        f"Jain ≥ {b.jain:.4f} ({who('jain')}) {'✓' if v.checks['jain'] else '✗'}",
        f"worst window ≥ {b.worst_window:.3f} ({who('worst_window')}) "
        f"{'✓' if v.checks['worst_window'] else '✗'}",
        f"utilisation ≥ {b.utilisation:.1%} ({who('utilisation')}) "
        f"{'✓' if v.checks['utilisation'] else '✗'}",
        f"every key ≥ {b.key_low:.2f} ({who('key_low')}) "
        + ("✓" if v.checks["key_low"] else "✗ " + ", ".join(v.low_keys)),
        f"hard keys ≤ {b.key_high:.2f} ({who('key_high')}) "
        + ("✓" if v.checks["key_high"] else "✗ " + ", ".join(v.high_keys)),
        f"no overshoot {'✓' if v.checks['overshoot'] else '✗'}",
    ]
    far = ", ".join(f"{k.replace('_', ' ')} {d:.3f}" for k, d in v.distance.items() if d > 0)
    return (
        f"gate {'PASS' if v.passed else 'FAIL'}: "
        + "; ".join(parts)
        + f"\n  distance to the goal: {far or 'none, every target met'}"
    )
