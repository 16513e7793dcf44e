"""The public ordering strategies, one small module per family.

Every strategy is ``order(inp: RouteInput, state: StrategyState) -> list[Target]``: a pure
function (apart from the bounded ``state`` and the injected ``inp.rng``) that returns *all* of
``inp.targets``, best first. It never drops a target: the executor skips the ones it cannot use
right now (breaker open, cooling down, locked, quota blocked, concurrency full) and records why,
so a strategy's job is only the preference order. The soft quota penalty is applied through
:mod:`fairgate.routing.soft` in every strategy. Look strategies up by name in
:mod:`fairgate.routing.registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.routing.strategies.affinity import cache_optimized, lkgp
    from fairgate.routing.strategies.auto import auto_breakdown, auto_weights
    from fairgate.routing.strategies.basic import priority, round_robin
    from fairgate.routing.strategies.context_fit import context_optimized, context_relay
    from fairgate.routing.strategies.cost import cost_optimized
    from fairgate.routing.strategies.execution import fusion, pipeline
    from fairgate.routing.strategies.load import least_used, p2c
    from fairgate.routing.strategies.quota_aware import (
        fill_first,
        headroom,
        reset_aware,
        reset_window,
    )
    from fairgate.routing.strategies.randomized import random_order, strict_random, weighted
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "auto_breakdown",
    "auto_weights",
    "cache_optimized",
    "context_optimized",
    "context_relay",
    "cost_optimized",
    "fill_first",
    "fusion",
    "headroom",
    "least_used",
    "lkgp",
    "p2c",
    "pipeline",
    "priority",
    "random_order",
    "reset_aware",
    "reset_window",
    "round_robin",
    "strict_random",
    "weighted",
]
