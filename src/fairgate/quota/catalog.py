"""Known plans by provider and the plan resolver (SPEC §1).

Resolution for a connection: a manual override stored for it (at least one dimension) wins, then
the catalog entry of its provider, then the empty plan ("configure me").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Dimension, Plan, PlanSource

_P, _R, _T, _U = Unit.PERCENT, Unit.REQUESTS, Unit.TOKENS, Unit.USD
_H, _5H, _D, _W, _M = (
    Window.HOURLY,
    Window.FIVE_HOURS,
    Window.DAILY,
    Window.WEEKLY,
    Window.MONTHLY,
)


def _d(unit: Unit, window: Window, limit: float = 0.0) -> Dimension:
    return Dimension(unit, window, limit)


_SUBSCRIPTION = (_d(_P, _5H, 100), _d(_P, _W, 100))
_TOKENS_UNKNOWN = (_d(_T, _5H), _d(_T, _W))

CATALOG: Mapping[str, tuple[Dimension, ...]] = {
    "codex": _SUBSCRIPTION,
    "claude": _SUBSCRIPTION,
    "bailian": (*_SUBSCRIPTION, _d(_P, _M, 100)),
    "kimi": (_d(_R, _H, 1500),),
    "alibaba": (_d(_R, _M, 90_000),),
    "glm": _TOKENS_UNKNOWN,
    "minimax": _TOKENS_UNKNOWN,
    "kimi-coding": _TOKENS_UNKNOWN,
    "deepseek": (_d(_U, _M),),
    "xiaomi-mimo": (_d(_T, _M, 4_100_000_000),),
    "grok-cli": (
        _d(_R, _D, 864),
        _d(_T, _D, 18_000_000),
        _d(_R, _W, 6048),
        _d(_T, _W, 126_000_000),
    ),
    # openai and anthropic have no default: their limits differ per account tier.
}


def resolve_plan(provider: str, override: Sequence[Dimension] | None = None) -> Plan:
    if override:
        return Plan(tuple(override), PlanSource.OVERRIDE)
    dims = CATALOG.get(provider.strip().lower())
    if dims:
        return Plan(dims, PlanSource.CATALOG)
    return Plan((), PlanSource.EMPTY)
