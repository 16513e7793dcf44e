"""cost-optimized: the cheapest estimated cost for this request first."""

from __future__ import annotations

import math

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.soft import sort_by_cost
from fairgate.routing.state import StrategyState

__all__ = ["cost_optimized"]


def cost_optimized(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Estimated USD = prompt tokens × input price + expected output × output price. The
    estimate, not the list price, decides: a cheap-input model can lose on a request that
    asks for a long answer. Unknown prices go last in configured order; a soft-penalised
    target's cost counts ÷ factor."""
    costs = [inp.estimated_cost(t) for t in inp.targets]
    return sort_by_cost(
        inp.targets,
        [math.inf if c is None else c for c in costs],
        inp.penalized,
        inp.soft_factor,
    )
