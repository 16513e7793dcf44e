"""fusion and pipeline: execution modes, not preference orders.

The executor runs these differently (see :mod:`fairgate.routing.modes`): fusion asks the whole
panel in parallel and has a judge merge the answers; pipeline runs the steps in sequence, each
output feeding the next. Their ``order`` only lists the participants.
"""

from __future__ import annotations

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition
from fairgate.routing.state import StrategyState

__all__ = ["fusion", "pipeline"]


def fusion(inp: RouteInput, state: StrategyState) -> list[Target]:
    """The panel in configured order, soft-penalised members last (the panel runs in
    parallel, so this only matters when the executor trims the panel)."""
    return soft_partition(inp.targets, inp.penalized)


def pipeline(inp: RouteInput, state: StrategyState) -> list[Target]:
    """The steps exactly as configured: the order is the program, so nothing — not even the
    soft penalty — reorders it."""
    return list(inp.targets)
