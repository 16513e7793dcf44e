"""weighted, random and strict-random.

Weighted order is drawn with the Efraimidis–Spirakis method: each target gets the key
``log(u) / w`` for a uniform ``u`` in (0, 1], and targets are sorted by key, highest first. The
first target is then target *i* with probability exactly ``wᵢ / Σw``, and the fallback order
below it is itself a weighted draw without replacement — so a failing first choice falls
through in proportion to the weights too. Targets with weight ≤ 0 only come after every
positive one (in configured order); if no weight is positive they all count 1.

Sticky: with the ``sticky`` option (or the ``weighted-sticky`` alias) and a session key, ``u``
is not random but a stable hash of (combo, session, target) — weighted rendezvous hashing. The
same session always gets the same order, sessions still spread in proportion to the weights,
and adding or removing a target only moves the sessions that pick or picked it.
"""

from __future__ import annotations

import math

from fairgate.routing.context import RouteInput, opt_bool
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition, soft_score
from fairgate.routing.state import StrategyState
from fairgate.routing.sticky import stable_unit

__all__ = ["random_order", "strict_random", "weighted", "weighted_order"]


def weighted_order(inp: RouteInput, weights: list[float], *, sticky: bool = False) -> list[Target]:
    """Targets in a weighted random order (soft penalty: weight × factor)."""
    targets = inp.targets
    if not any(w > 0 for w in weights):
        weights = [1.0] * len(targets)
    use_hash = sticky and inp.session_key is not None
    keyed: list[tuple[float, bool, int, Target]] = []
    for i, (t, w) in enumerate(zip(targets, weights, strict=True)):
        pen = inp.penalized(t)
        eff = soft_score(w, pen, inp.soft_factor)
        if use_hash:
            u = stable_unit(inp.combo, inp.session_key or "", t.key)
        else:
            u = 1.0 - inp.rng.random()  # (0, 1]
        key = math.log(u) / eff if eff > 0 else -math.inf
        keyed.append((key, pen, i, t))
    keyed.sort(key=lambda k: (-k[0], k[1], k[2]))
    return [k[3] for k in keyed]


def weighted(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Random by weight; ``sticky`` option: by session hash (see module doc)."""
    return weighted_order(
        inp, [t.weight for t in inp.targets], sticky=opt_bool(inp.options, "sticky")
    )


def random_order(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Uniformly random first choice (equal weights); the soft penalty lowers a target's
    chance (weight 1 × factor), it does not exclude it."""
    return weighted_order(inp, [1.0] * len(inp.targets))


def strict_random(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Shuffle-deck random: per combo, every target leads exactly once per cycle of n
    requests, in a fresh random order each cycle — random, but without the streaks and
    droughts of independent draws. The rest of the order is a uniform shuffle. Weights are
    ignored. Soft-penalised targets go behind the others (its turn passes to the next)."""
    targets = inp.targets
    if not targets:
        return []
    lead_key = state.draw(inp.combo, [t.key for t in targets], inp.rng)
    lead = next(t for t in targets if t.key == lead_key)
    rest = [t for t in targets if t.key != lead_key]
    inp.rng.shuffle(rest)
    return soft_partition([lead, *rest], inp.penalized)
