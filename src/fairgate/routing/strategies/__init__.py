"""The public ordering strategies, one small module per family.

Every strategy is ``order(inp: RouteInput, state: StrategyState) -> list[Target]``: a pure
function (apart from the bounded ``state`` and the injected ``inp.rng``) that returns *all* of
``inp.targets``, best first. It never drops a target: the executor skips the ones it cannot use
right now (breaker open, cooling down, locked, quota blocked, concurrency full) and records why,
so a strategy's job is only the preference order. The soft quota penalty is applied through
:mod:`fairgate.routing.soft` in every strategy. Look strategies up by name in
:mod:`fairgate.routing.registry`.
"""
