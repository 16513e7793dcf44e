"""auto: a weighted multi-factor score (SPEC §8) with exploration.

Each factor is a number in [0, 1], higher = better, computed relative to the other targets of
the request where that is what makes it comparable:

==============  ====================================================================
quota           remaining fraction of the tightest window (unknown = 1; no room = 0)
health          circuit-breaker health: 1 closed breaker, 0.5 half-open, 0 open / cooling /
                locked (alias ``breaker``)
cost            cheapest estimated cost ÷ this target's (unknown price = 0.5)
latency         lowest p95 ÷ this target's p95 (no data = 0.5)
task_fit        share of the request's required tags the target has (no requirement = 1,
                untagged target = 0.5); 0 when the request does not fit its context
stability       success rate over the metrics window (no data = 0.5; alias ``success_rate``)
tier            1 for the best (lowest) tier down to 0 for the worst
affinity        1 for the target this session last succeeded on, else 0
density         live connections of the target's provider in this combo ÷ the most any
                provider has: a provider with more healthy accounts absorbs bursts and
                retries better
reset_affinity  "use it or lose it": among the targets with room for this request, the
                soonest reset of the tightest window ÷ this target's (the account whose
                window resets soonest scores 1: what it has left is lost at the reset);
                0 without room, 0.5 when the reset is unknown
==============  ====================================================================

Default weights (:data:`DEFAULT_WEIGHTS`, normalised to sum to 1): quota 0.20, health 0.15,
cost 0.15, latency 0.15, task_fit 0.10, stability 0.10, reset_affinity 0.10, tier 0.05,
affinity 0.05, density 0.05. :func:`auto_breakdown` gives each candidate's factors, weights and
score, which the combo's diagnostics show.

score = Σ wᶠ × factorᶠ with the weights normalised to sum to 1 (option ``weights``: a partial
mapping merged over :data:`DEFAULT_WEIGHTS`; configure-time errors for unknown factors or
negative/all-zero weights). A soft-penalised target's score × ``soft_factor`` (0.7).

Exploration: with probability ``exploration`` (0.05) per request, one other available target
chosen uniformly at random is moved to the front, so a target that scored badly once keeps
getting the occasional request that tells us it recovered. Exactly one ``rng.random()`` is
drawn per request (plus one choice when exploring), which keeps seeded tests stable.

Budget: option ``budget_usd`` — targets whose estimated cost for this request exceeds it go
behind all within-budget ones (unknown prices count as within budget) and are never explored.
"""

from __future__ import annotations

from collections.abc import Mapping

from fairgate.routing.context import RouteInput, opt_float
from fairgate.routing.model import Target
from fairgate.routing.soft import sort_by_score
from fairgate.routing.state import StrategyState

__all__ = [
    "DEFAULT_WEIGHTS",
    "FACTORS",
    "auto",
    "auto_breakdown",
    "auto_factors",
    "auto_weights",
]

FACTORS = (
    "quota",
    "health",
    "cost",
    "latency",
    "task_fit",
    "stability",
    "tier",
    "affinity",
    "density",
    "reset_affinity",
)

DEFAULT_WEIGHTS: Mapping[str, float] = {
    "quota": 0.20,
    "health": 0.15,
    "cost": 0.15,
    "latency": 0.15,
    "task_fit": 0.10,
    "stability": 0.10,
    "tier": 0.05,
    "affinity": 0.05,
    "density": 0.05,
    "reset_affinity": 0.10,
}

#: Other spellings of a factor in ``weights``.
_FACTOR_ALIASES = {
    "taskfit": "task_fit",
    "breaker": "health",
    "breaker_health": "health",
    "p95": "latency",
    "success_rate": "stability",
    "reset_window": "reset_affinity",
}

DEFAULT_EXPLORATION = 0.05


def auto_weights(options: Mapping[str, object]) -> dict[str, float]:
    """The normalised factor weights for a combo's options. ``ValueError`` on an unknown
    factor, a non-number, a negative weight or all-zero weights — raised when the combo is
    configured, so a typo never reaches a request."""
    raw = options.get("weights")
    weights = dict(DEFAULT_WEIGHTS)
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise ValueError("auto option 'weights' must be a mapping of factor → weight")
        for name, value in raw.items():
            factor = str(name).strip().lower().replace("-", "_")
            factor = _FACTOR_ALIASES.get(factor, factor)
            if factor not in DEFAULT_WEIGHTS:
                raise ValueError(
                    f"unknown auto factor {name!r}; valid factors: {', '.join(FACTORS)}"
                )
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"auto weight for {name!r} must be a number ≥ 0, got {value!r}")
            weights[factor] = float(value)
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("auto weights must not all be zero")
    return {k: v / total for k, v in weights.items()}


def _ratio_to_best(values: list[float | None], *, unknown: float = 0.5) -> list[float]:
    """Lower-is-better values → min/value in (0, 1]; None → ``unknown``."""
    known = [v for v in values if v is not None]
    if not known:
        return [unknown] * len(values)
    best = min(known)
    out = []
    for v in values:
        if v is None:
            out.append(unknown)
        elif v <= 0:
            out.append(1.0)
        else:
            out.append(best / v if best > 0 else 0.0)
    return out


def auto_factors(inp: RouteInput, state: StrategyState) -> list[dict[str, float]]:
    """The factor values per target (in ``inp.targets`` order) — also for diagnostics."""
    targets = inp.targets
    quotas = [inp.quota.of(t) for t in targets]
    healths = [inp.health.of(t) for t in targets]
    costs = _ratio_to_best([inp.estimated_cost(t) for t in targets])
    latencies = _ratio_to_best([inp.metrics.p95_ms(t.key) for t in targets])
    tiers = [t.tier for t in targets]
    lo, hi = min(tiers, default=0), max(tiers, default=0)
    last = state.session_target(inp.combo, inp.session_key)
    live: dict[str, set[str]] = {}
    for t, h in zip(targets, healths, strict=True):
        if h.available:
            live.setdefault(t.provider, set()).add(t.load_key)
    densest = max((len(v) for v in live.values()), default=0)
    required = inp.task.required_tags
    resets = _ratio_to_best([q.reset_in_ms if q.has_room else None for q in quotas])

    out = []
    for i, t in enumerate(targets):
        q = quotas[i]
        if not inp.fits(t):
            fit = 0.0
        elif not required:
            fit = 1.0
        elif not t.tags:
            fit = 0.5
        else:
            fit = len(required & t.tags) / len(required)
        stability = inp.metrics.success_rate(t.key, inp.now_ms)
        out.append(
            {
                "quota": q.remaining_or_full if q.has_room else 0.0,
                "health": healths[i].score,
                "cost": costs[i],
                "latency": latencies[i],
                "task_fit": fit,
                "stability": 0.5 if stability is None else stability,
                "tier": 1.0 if hi == lo else 1.0 - (t.tier - lo) / (hi - lo),
                "affinity": 1.0 if last is not None and t.key == last else 0.0,
                "density": (len(live.get(t.provider, ())) / densest) if densest else 0.0,
                "reset_affinity": resets[i] if q.has_room else 0.0,
            }
        )
    return out


def auto_breakdown(inp: RouteInput, state: StrategyState) -> list[dict[str, object]]:
    """Per candidate (in ``inp.targets`` order): its key, score, and each factor's value, for
    the diagnostics of a combo request (the weights are the combo's, normalised)."""
    weights = auto_weights(inp.options)
    out: list[dict[str, object]] = []
    for t, factors in zip(inp.targets, auto_factors(inp, state), strict=True):
        score = sum(weights[f] * v for f, v in factors.items())
        out.append(
            {
                "target": t.key,
                "score": round(score, 4),
                "factors": {f: round(v, 4) for f, v in factors.items()},
            }
        )
    return out


def auto(inp: RouteInput, state: StrategyState) -> list[Target]:
    targets = inp.targets
    if not targets:
        return []
    weights = auto_weights(inp.options)
    scores = [
        sum(weights[f] * v for f, v in factors.items()) for factors in auto_factors(inp, state)
    ]
    cap = opt_float(inp.options, "budget_usd", -1.0)

    def over_budget(t: Target) -> int:
        if cap < 0:
            return 0
        cost = inp.estimated_cost(t)
        return 1 if cost is not None and cost > cap else 0

    ranked = sort_by_score(targets, scores, inp.penalized, inp.soft_factor, group=over_budget)
    rate = min(1.0, max(0.0, opt_float(inp.options, "exploration", DEFAULT_EXPLORATION)))
    if inp.rng.random() < rate and len(ranked) > 1:
        pool = [t for t in ranked[1:] if inp.health.of(t).available and not over_budget(t)]
        if pool:
            pick = inp.rng.choice(pool)
            ranked.remove(pick)
            ranked.insert(0, pick)
    return ranked
