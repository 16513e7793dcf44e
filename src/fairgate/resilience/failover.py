"""The one failover rule: after a failed attempt, retry the target, try the next, or stop.

Every attempt's failure is classified once (:func:`fairgate.resilience.classify.classify`);
this module turns the class into what the request path does next, so there is exactly one
notion of "fail over" (no status sets elsewhere):

- **retry** the same target (up to the combo's ``maxRetries``), then move on: a server error
  or a timeout (a connect error is a server error without a status) may well pass a moment
  later on the same account.
- **next** candidate: a rate limit, a temporary or permanent quota block (billing, credit
  balance), our credentials refused, a model the account does not serve, a context the target
  cannot hold, an unusable 200. Resilience has already set the cooldown, lockout, permanent
  block or breaker that keeps the next requests away from it; another account or model may
  well answer, and a client must never see another account's billing error while a candidate
  remains.
- **end** the request: the client's own error (a malformed request, a content policy refusal,
  a bare 403/404 with no provider structure such as a WAF page — all ``bad_request``) fails
  the same way everywhere, and a client that went away wants nothing more.

A context overflow is the client's too when the next candidate is the *same* model (another
account has the same window): :func:`same_model_is_futile` lets the executor skip those.
"""

from __future__ import annotations

from enum import StrEnum

from fairgate.resilience.classify import FailureClass

__all__ = ["Step", "same_model_is_futile", "step_after"]


class Step(StrEnum):
    RETRY = "retry"
    NEXT = "next"
    END = "end"


_RETRY = frozenset({FailureClass.SERVER_ERROR, FailureClass.TIMEOUT})
_END = frozenset({FailureClass.BAD_REQUEST, FailureClass.CLIENT_DISCONNECT})


def step_after(cls: FailureClass | None) -> Step:
    """What to do after an attempt failed with ``cls`` (None: the answer was a 200 that did
    not pass quality validation, which another target may well do better)."""
    if cls is None or cls is FailureClass.OK:
        return Step.NEXT
    if cls in _RETRY:
        return Step.RETRY
    if cls in _END:
        return Step.END
    return Step.NEXT


def same_model_is_futile(cls: FailureClass | None) -> bool:
    """Whether the same upstream model on another connection would fail the same way."""
    return cls is FailureClass.CONTEXT_OVERFLOW
