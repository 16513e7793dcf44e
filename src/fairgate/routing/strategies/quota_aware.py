"""fill-first, headroom, reset-aware and reset-window: order by the quota picture.

All four read :class:`~fairgate.routing.context.TargetQuota` (remaining fraction, reset time,
headroom vs this request's cost, time to exhaustion). Unknown quota (a provider without a plan)
counts as full and fitting.
"""

from __future__ import annotations

from fairgate.routing.context import RouteInput, opt_float, opt_int
from fairgate.routing.model import Target
from fairgate.routing.soft import soft_partition, sort_by_score
from fairgate.routing.state import StrategyState

__all__ = ["fill_first", "headroom", "reset_aware", "reset_window"]


def _room_first(inp: RouteInput, scores: list[float]) -> list[Target]:
    """Highest score first among the targets with room for this request, then the ones
    without; a penalised target's score × the soft factor. The order headroom and
    reset-aware share: they differ only in the score."""
    return sort_by_score(
        inp.targets,
        scores,
        inp.penalized,
        inp.soft_factor,
        group=lambda t: 0 if inp.quota.of(t).has_room else 1,
    )


def fill_first(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Use the first target until its quota is exhausted, then the next: configured order
    among targets with room for this request, then the exhausted ones (configured order).

    Option ``fill_reserve`` (fraction, default 0): treat a target as exhausted once its
    remaining fraction is at or below this, to leave a margin for other users of the account.
    """
    reserve = opt_float(inp.options, "fill_reserve", 0.0)

    def exhausted(t: Target) -> int:
        q = inp.quota.of(t)
        spent = not q.has_room or (q.remaining is not None and q.remaining <= reserve)
        return 1 if spent else 0

    return soft_partition(inp.targets, inp.penalized, group=exhausted)


def headroom(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Most remaining quota fraction first (unknown = full); targets without room for this
    request last. Score × soft factor when penalised."""
    scores = [inp.quota.of(t).remaining_or_full for t in inp.targets]
    return _room_first(inp, scores)


def reset_aware(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Use it or lose it: quota left in a window that resets soon is quota that will be
    wasted, and a window about to refill can be drained safely. Score =
    ``(1 - u) × remaining + u × urgency`` where urgency is 1 at the reset instant and 0 a
    full window before it (0.5 unknown) and ``u`` is option ``urgency_weight`` (0.6). So a
    target resets soonest wins even with less remaining, and among windows equally far from
    their reset the fuller one wins. Targets without room for this request go last.
    Worked example, 5 h windows: A 80 % left, resets in 4 h → 0.4×0.8 + 0.6×0.2 = 0.44;
    B 30 % left, resets in 15 min → 0.4×0.3 + 0.6×0.95 = 0.69 → B first.
    """
    u = min(1.0, max(0.0, opt_float(inp.options, "urgency_weight", 0.6)))
    scores = []
    for t in inp.targets:
        q = inp.quota.of(t)
        scores.append((1 - u) * q.remaining_or_full + u * q.reset_urgency)
    return _room_first(inp, scores)


def reset_window(inp: RouteInput, state: StrategyState) -> list[Target]:
    """Prefer targets whose window resets before traffic would exhaust it.

    Classes, in order: (0) room for this request and the window resets before the current
    burn rate exhausts it (or no burn data) — soonest reset first, since its leftover is about
    to be lost; (1) room, but at this burn rate it runs dry before the reset — the one that
    lasts longest first; (2) no room for this request — configured order. Resets within
    option ``tie_band_ms`` (60 s) of each other count as equal and keep configured order.
    Soft-penalised targets go behind the others of their class.
    """
    band = max(1, opt_int(inp.options, "tie_band_ms", 60_000))

    def klass(t: Target) -> int:
        q = inp.quota.of(t)
        if not q.has_room:
            return 2
        if q.exhausts_in_ms is None:
            return 0
        if q.reset_in_ms is not None and q.reset_in_ms <= q.exhausts_in_ms:
            return 0
        return 1

    def within(t: Target) -> float:
        q = inp.quota.of(t)
        k = klass(t)
        if k == 0:
            return float("inf") if q.reset_in_ms is None else float(max(0, q.reset_in_ms) // band)
        if k == 1:
            return -float((q.exhausts_in_ms or 0) // band)
        return 0.0

    ranked = sorted(inp.targets, key=lambda t: (klass(t), within(t)))  # stable
    return soft_partition(ranked, inp.penalized, group=klass)
