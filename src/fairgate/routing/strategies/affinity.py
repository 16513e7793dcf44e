"""lkgp and cache-optimized: go back to what worked."""

from __future__ import annotations

from fairgate.routing.context import RouteInput
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition
from fairgate.routing.state import StrategyState

__all__ = ["cache_optimized", "lkgp"]


def lkgp(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Last known good provider: the target with the most recent success leads, then the
    other targets of its provider, then the rest — each part in configured order. With no
    success on record this is priority. Reads ``metrics.last_ok_ms``, so it recovers on its
    own: once another target succeeds more recently, that one leads."""
    best: Target | None = None
    best_ms = -1
    for t in inp.targets:
        ok = inp.metrics.last_ok_ms(t.key)
        if ok is not None and ok > best_ms:
            best, best_ms = t, ok
    if best is None:
        return soft_partition(inp.targets, inp.penalized)
    same = [t for t in inp.targets if t.provider == best.provider and t.key != best.key]
    other = [t for t in inp.targets if t.provider != best.provider]
    return soft_partition([best, *same, *other], inp.penalized)


def cache_optimized(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Prompt-cache affinity: the target this session last succeeded on leads (its upstream
    holds the cached prefix, which is cheaper and faster), then configured order. Needs the
    executor to call ``state.note_success(combo, session_key, target)``. Without a session
    or a remembered target this is priority."""
    last = state.session_target(inp.combo, inp.session_key)
    lead = [t for t in inp.targets if t.key == last]
    rest = [t for t in inp.targets if t.key != last]
    return soft_partition([*lead, *rest], inp.penalized)
