"""The targets ``active`` mode is held to (issues 17 and 18), in one place: the report and the
integration tests read the thresholds from here, so they cannot drift apart."""

from __future__ import annotations

from fairgate.sim.fairness import Metrics

TARGET_JAIN = 0.99
#: ≥ 98 % of what demand allowed (holding room for waiting keys costs a little)
TARGET_UTILISATION = 0.98


def request_overshoot(metrics: Metrics) -> float:
    """Worst overshoot over the request-unit dimensions."""
    vals = [v for k, v in metrics.overshoot.items() if k.startswith("requests/")]
    return max(vals, default=0.0)
