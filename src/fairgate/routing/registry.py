"""Strategies by name: the one place a configured strategy name is resolved and checked.

``STRATEGIES`` maps each of the 19 public names to its ordering function. ``quota-share`` is
internal: it is only valid on the ``qtSd/`` combos fairgate mints, and it is not an ordering
function of this shape (it needs DRR state and in-flight counts) — the pipeline calls
:func:`fairgate.routing.quota_share.select_quota_share` for it.

Names are matched case-insensitively with ``_`` read as ``-``. Two aliases exist for the sticky
variants: ``weighted-sticky`` and ``round-robin-sticky`` resolve to ``weighted`` /
``round-robin`` with the option ``sticky: true``. Anything else unknown is an error that lists
the valid names — never a silent fallback to priority.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.state import StrategyState
from fairgate.routing.strategies.affinity import cache_optimized, lkgp
from fairgate.routing.strategies.auto import auto, auto_weights
from fairgate.routing.strategies.basic import priority, round_robin
from fairgate.routing.strategies.context_fit import context_optimized, context_relay
from fairgate.routing.strategies.cost import cost_optimized
from fairgate.routing.strategies.execution import fusion, pipeline
from fairgate.routing.strategies.load import least_used, p2c
from fairgate.routing.strategies.quota_aware import fill_first, headroom, reset_aware, reset_window
from fairgate.routing.strategies.randomized import random_order, strict_random, weighted

__all__ = [
    "ALIASES",
    "INTERNAL_STRATEGIES",
    "PUBLIC_STRATEGIES",
    "QUOTA_SHARE",
    "STRATEGIES",
    "Strategy",
    "get_strategy",
    "resolve_strategy",
    "validate_options",
]

Strategy = Callable[[RouteInput, StrategyState], list[Target]]

QUOTA_SHARE = "quota-share"

STRATEGIES: dict[str, Strategy] = {
    "priority": priority,
    "weighted": weighted,
    "round-robin": round_robin,
    "context-relay": context_relay,
    "fill-first": fill_first,
    "p2c": p2c,
    "random": random_order,
    "least-used": least_used,
    "cost-optimized": cost_optimized,
    "reset-aware": reset_aware,
    "reset-window": reset_window,
    "headroom": headroom,
    "strict-random": strict_random,
    "auto": auto,
    "lkgp": lkgp,
    "context-optimized": context_optimized,
    "cache-optimized": cache_optimized,
    "fusion": fusion,
    "pipeline": pipeline,
}

PUBLIC_STRATEGIES: tuple[str, ...] = tuple(STRATEGIES)
INTERNAL_STRATEGIES: tuple[str, ...] = (QUOTA_SHARE,)

ALIASES: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "weighted-sticky": ("weighted", {"sticky": True}),
    "round-robin-sticky": ("round-robin", {"sticky": True}),
}


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _unknown(name: str) -> ValueError:
    return ValueError(
        f"unknown routing strategy {name!r}; valid strategies: {', '.join(PUBLIC_STRATEGIES)}"
    )


def resolve_strategy(name: str, *, internal: bool = False) -> tuple[str, Mapping[str, object]]:
    """(canonical name, options an alias implies). ``ValueError`` for an unknown name, or for
    ``quota-share`` on a combo that is not internal."""
    if not isinstance(name, str):
        raise _unknown(repr(name))
    canon = _canonical(name)
    if canon in ALIASES:
        return ALIASES[canon]
    if canon in STRATEGIES:
        return canon, {}
    if canon == QUOTA_SHARE:
        if internal:
            return canon, {}
        raise ValueError(
            f"routing strategy {QUOTA_SHARE!r} is internal to the qtSd/ pool combos and cannot "
            f"be configured; valid strategies: {', '.join(PUBLIC_STRATEGIES)}"
        )
    raise _unknown(name)


def get_strategy(name: str) -> Strategy:
    """The ordering function for a canonical (or alias) public strategy name."""
    canon, _ = resolve_strategy(name, internal=True)
    if canon == QUOTA_SHARE:
        raise ValueError(
            f"{QUOTA_SHARE!r} has no ordering function: use "
            "fairgate.routing.quota_share.select_quota_share"
        )
    return STRATEGIES[canon]


def validate_options(name: str, options: Mapping[str, object], *, n_targets: int) -> None:
    """Configure-time checks of a strategy's options (snake_case keys)."""
    for flag in ("sticky",):
        if flag in options and not isinstance(options[flag], bool):
            raise ValueError(f"strategy option {flag!r} must be true or false")
    for num in ("exploration", "budget_usd", "fill_reserve", "urgency_weight"):
        v = options.get(num)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            raise ValueError(f"strategy option {num!r} must be a number ≥ 0, got {v!r}")
    for frac in ("exploration", "fill_reserve", "urgency_weight"):
        v = options.get(frac)
        if isinstance(v, int | float) and v > 1:
            raise ValueError(f"strategy option {frac!r} must be in [0, 1], got {v!r}")
    for count in ("sticky_limit", "tie_band_ms"):
        v = options.get(count)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"strategy option {count!r} must be an integer ≥ 1, got {v!r}")
    if name == "auto":
        auto_weights(options)
    if name == "pipeline" and "step_prompts" in options:
        prompts = options["step_prompts"]
        if not isinstance(prompts, list | tuple) or not all(
            p is None or isinstance(p, str) for p in prompts
        ):
            raise ValueError("pipeline option 'step_prompts' must be a list of strings or nulls")
        if len(prompts) > n_targets:
            raise ValueError(
                f"pipeline option 'step_prompts' has {len(prompts)} entries for {n_targets} steps"
            )
