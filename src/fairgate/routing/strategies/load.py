"""p2c and least-used: spread load by what is in flight and what was used recently."""

from __future__ import annotations

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_score, sort_by_score
from fairgate.routing.state import StrategyState

__all__ = ["least_used", "p2c"]

_DEFAULT_LATENCY_MS = 1_000.0


def _load_scores(inp: RouteInput) -> list[float]:
    """Higher = lighter: ``1 / ((1 + in-flight) × (1 + EWMA latency in s))``. A target with no
    latency data gets the mean of the known ones (1 s if none), so it is neither favoured nor
    starved for being new."""
    lats = [inp.metrics.ewma_ms(t.key) for t in inp.targets]
    known = [x for x in lats if x is not None]
    default = sum(known) / len(known) if known else _DEFAULT_LATENCY_MS
    return [
        1.0 / ((1 + inp.inflight_of(t)) * (1 + (default if lat is None else lat) / 1000.0))
        for t, lat in zip(inp.targets, lats, strict=True)
    ]


def p2c(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Power of two choices: pick two distinct targets at random, lead with the lighter one
    (fewer in flight, then lower latency; soft score × factor; exact tie → the first pick),
    then the other, then the rest lightest first. Two random probes avoid both the herd that
    "always the least loaded" causes with stale counts and the imbalance of one random pick."""
    targets = inp.targets
    if len(targets) <= 1:
        return list(targets)
    scores = [
        soft_score(s, inp.penalized(t), inp.soft_factor)
        for t, s in zip(targets, _load_scores(inp), strict=True)
    ]
    i, j = inp.rng.sample(range(len(targets)), 2)
    first, second = (j, i) if scores[j] > scores[i] else (i, j)
    rest_idx = [k for k in range(len(targets)) if k not in (first, second)]
    rest = sort_by_score(
        [targets[k] for k in rest_idx],
        [scores[k] for k in rest_idx],
        inp.penalized,
        1.0,  # the penalty is already in ``scores``
    )
    return [targets[first], targets[second], *rest]


def least_used(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Fewest uses in the metrics window (plus what is in flight now, so a burst does not all
    land on the target that was idle a minute ago) first; score ``1 / (1 + uses)``."""
    scores = [
        1.0 / (1 + inp.metrics.uses(t.key, inp.now_ms) + inp.inflight_of(t)) for t in inp.targets
    ]
    return sort_by_score(inp.targets, scores, inp.penalized, inp.soft_factor)
