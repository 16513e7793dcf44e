"""The queue's part of an admission in the decision's terms (``admission: hold``).

:func:`fairgate.quota.hold.hold_step` says what to do with the queue; this applies it to an
admission as a store sees it: the checks, the counts it read, the fair-share verdict. One
function for the SQLite driver; ``admit.lua`` mirrors it (the contract suite runs both).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fairgate.quota.decision import DimensionCheck, Outcome, Reason, Scope, Verdict
from fairgate.quota.hold import HoldStep, HoldTicket, Waiter, dominant_share, hold_step

__all__ = ["HOLDABLE", "queued_admission"]

#: refusals that a held request waits out: the pool's room (owed) or its own fair share (the
#: window sliding may let it in; owed nothing). A cap refuses at once.
HOLDABLE = frozenset({Reason.GLOBAL_SATURATED, Reason.FAIR_SHARE})


def queued_admission(
    checks: Sequence[DimensionCheck],
    mine: Sequence[float],
    verdict: Verdict,
    hold: HoldTicket,
    waiters: Iterable[Waiter],
    key_id: str,
    now_ms: int,
) -> tuple[Verdict, HoldStep, float]:
    """The verdict once the queue is looked at, what to do with this request's waiter, and
    the key's dominant share per weight now (``mine``: the key's sliding count per check). A
    refused jump is a ``global-saturated`` refusal of the first pool check: the pool has no
    room for this key, as what frees is held for a key before it."""
    share = dominant_share(
        ((m, c.limit) for c, m in zip(checks, mine, strict=True) if c.scope is Scope.POOL),
        hold.weight,
    )
    allowed = verdict.outcome is not Outcome.BLOCK
    step = hold_step(
        waiters,
        key_id,
        share,
        hold,
        now_ms,
        allowed=allowed,
        owed=verdict.reason is Reason.GLOBAL_SATURATED,
        holdable=verdict.reason in HOLDABLE,
    )
    if allowed and step.blocked:
        first = next((i for i, c in enumerate(checks) if c.scope is Scope.POOL), 0)
        verdict = Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, first)
    return verdict, step, share
