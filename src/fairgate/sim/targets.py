"""The targets ``active`` mode is held to (issues 17 and 18), in one place.

A run *meets every target* when all five hold: Jain's index against the ideal, the worst single
window's, utilisation of what demand allowed, every key with demand within a band of its ideal,
and no overshoot in any dimension. ``fairgate simulate`` prints which hold for each run, and
with ``--seeds`` how many runs of each policy meet them all; the report, the spread and the
integration tests read the thresholds from here, so they cannot drift apart.
"""

from __future__ import annotations

from fairgate.sim.fairness import Metrics

TARGET_JAIN = 0.99
#: the lowest Jain's index of a single window (a policy fair over the run can still starve a
#: key for an hour)
TARGET_WORST_WINDOW = 0.95
#: ≥ 98 % of what demand allowed (holding room for waiting keys costs a little)
TARGET_UTILISATION = 0.98
#: every key with demand gets this much of its ideal, at least and at most
TARGET_RATIO = (0.90, 1.10)
#: tolerance for float residue when an overshoot is compared with 0
EXACT = 1e-9

#: the targets' names, in the order they are printed
TARGET_NAMES = ("jain", "worst_window", "utilisation", "key_ratio", "overshoot")


def request_overshoot(metrics: Metrics) -> float:
    """Worst overshoot over the request-unit dimensions."""
    vals = [v for k, v in metrics.overshoot.items() if k.startswith("requests/")]
    return max(vals, default=0.0)


def judge(
    jain: float,
    worst_window: float,
    utilisation: float,
    ratio_min: float,
    ratio_max: float,
    overshoot: float,
) -> dict[str, bool]:
    """Which targets these figures meet, by name (:data:`TARGET_NAMES`): one run's, or the
    worst of several (the spread over seeds); ``ratio_min``/``ratio_max``: the lowest and the
    highest admitted ÷ ideal of a key with demand; ``overshoot``: the worst dimension's."""
    lo, hi = TARGET_RATIO
    return {
        "jain": jain >= TARGET_JAIN,
        "worst_window": worst_window >= TARGET_WORST_WINDOW,
        "utilisation": utilisation >= TARGET_UTILISATION,
        "key_ratio": lo <= ratio_min and ratio_max <= hi,
        "overshoot": overshoot <= EXACT,
    }


def meets(metrics: Metrics) -> dict[str, bool]:
    """Which targets one run meets (:func:`judge`): ``key_ratio`` over every key with demand
    (the keys ``metrics.ratio`` holds), ``overshoot`` in every dimension."""
    ratios = metrics.ratio.values()
    return judge(
        metrics.jain,
        metrics.jain_worst_window,
        metrics.utilisation,
        min(ratios, default=1.0),
        max(ratios, default=1.0),
        max(metrics.overshoot.values(), default=0.0),
    )


def describe() -> str:
    """The targets in words, for a report's legend."""
    lo, hi = TARGET_RATIO
    return (
        f"Jain ≥ {TARGET_JAIN}, worst window ≥ {TARGET_WORST_WINDOW}, utilisation ≥ "
        f"{TARGET_UTILISATION:.0%}, every key {lo:.2f}–{hi:.2f} of its ideal, no overshoot"
    )
