"""priority and round-robin: configured order, and configured order rotated per request."""

from __future__ import annotations

from fairgate.routing.context import RouteInput, opt_bool, opt_int
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition
from fairgate.routing.state import StrategyState
from fairgate.routing.sticky import stable_index

__all__ = ["priority", "round_robin"]


def priority(inp: RouteInput, state: StrategyState) -> list[Target]:
    """The configured order; soft-penalised targets after the others."""
    return soft_partition(inp.targets, inp.penalized)


def round_robin(inp: RouteInput, state: StrategyState) -> list[Target]:
    """The configured order rotated by one position per request (per combo).

    Options: ``sticky_limit`` N — keep the same first target for N consecutive requests before
    rotating (default 1); ``sticky`` — a request with a session key always starts at the
    position its session hashes to, so a conversation stays on one target while sessionless
    traffic still rotates.
    """
    targets = inp.targets
    n = len(targets)
    if n == 0:
        return []
    if opt_bool(inp.options, "sticky") and inp.session_key is not None:
        start = stable_index(n, inp.combo, inp.session_key)
    else:
        limit = max(1, opt_int(inp.options, "sticky_limit", 1))
        start = (state.next_turn(inp.combo) // limit) % n
    rotated = targets[start:] + targets[:start]
    return soft_partition(rotated, inp.penalized)
