"""What a request went through, for the error body when nothing could serve it (SPEC §8).

Two views. The client's (:meth:`Diagnostics.client_body`, in the error body): the attempt order
as ``provider/model``, each attempt ``ok`` or ``failed``, skipped targets with a coarse reason
code (``cooling_down``, ``unavailable``, ``busy``, ``quota:<reason>`` for the key's own quota…),
a terminal reason from a fixed set and a recovery hint: never a connection or pool id, an
upstream status or an exclusion reason such as ``permanent``, which would map the gateway's
accounts and their state for a tenant. The admin's (:meth:`Diagnostics.body`): everything, in
the log line of the failed request (``request failed``, with its request id). The counts go
into ``x-fairgate-combo-*`` headers. Never a stack trace or a secret in either.

Only failed attempts and exclusions are recorded: diagnostics are shown for a request that got
no answer, and an attempt that answered ends the request, so a success never builds an entry
(nor its label) on the hot path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fairgate.process.errors import ApiError


class Terminal(StrEnum):
    """Why a request ended without an answer (an enumerated code clients can switch on)."""

    NO_TARGETS = "no_targets"
    QUOTA_BLOCKED = "quota_blocked"
    ALL_RATE_LIMITED = "all_rate_limited"
    ALL_UNAVAILABLE = "all_unavailable"
    UPSTREAM_FAILED = "upstream_failed"
    CLIENT_ERROR = "client_error"
    TIMEOUT = "timeout"
    CONCURRENCY_FULL = "concurrency_full"


@dataclass
class Diagnostics:
    pool_size: int = 0
    combo: str | None = None
    strategy: str | None = None
    attempted: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[dict[str, Any]] = field(default_factory=list)
    terminal: Terminal | None = None
    retry_after_ms: int | None = None
    #: time spent waiting for a cooling target or a concurrency slot (ms, on the clock)
    waited_ms: int = 0
    #: an ``auto`` combo's candidates as scored (target, score, factors) and its weights
    candidates: list[dict[str, Any]] | None = None
    weights: dict[str, float] | None = None

    def exclude(
        self, target: str, reason: str, until_ms: int | None = None, now_ms: int | None = None
    ) -> None:
        entry: dict[str, Any] = {"target": target, "reason": reason}
        if until_ms is not None and now_ms is not None:
            entry["retryAfterMs"] = max(0, until_ms - now_ms)
        self.excluded.append(entry)

    def attempt(
        self,
        target: str,
        outcome: str,
        *,
        status: int | None = None,
        latency_ms: float | None = None,
        error: str | None = None,
    ) -> None:
        entry: dict[str, Any] = {"target": target, "outcome": outcome}
        if status is not None:
            entry["status"] = status
        if latency_ms is not None:
            entry["latencyMs"] = round(latency_ms, 3)
        if error:
            entry["error"] = error
        self.attempted.append(entry)

    def hint(self) -> dict[str, Any]:
        retry_s = (
            None if self.retry_after_ms is None else max(1, math.ceil(self.retry_after_ms / 1000))
        )
        action = {
            Terminal.NO_TARGETS: "check the model name and that a connection serves it",
            Terminal.QUOTA_BLOCKED: "wait for your share to free up, or ask for a larger weight",
            Terminal.ALL_RATE_LIMITED: "retry after the indicated time",
            Terminal.ALL_UNAVAILABLE: "retry after the indicated time; upstreams are recovering",
            Terminal.UPSTREAM_FAILED: "retry later; every upstream attempt failed",
            Terminal.CLIENT_ERROR: "fix the request; no upstream would accept it",
            Terminal.TIMEOUT: "retry, or raise the combo timeout",
            Terminal.CONCURRENCY_FULL: "retry after the indicated time; every upstream is busy",
            None: "retry later",
        }[self.terminal]
        if self.terminal is Terminal.UPSTREAM_FAILED and any(
            a["outcome"] == "validation" for a in self.attempted
        ):
            action = (
                "answers failed the combo's response validation (responseValidation: "
                "disallowed patterns or the requested JSON schema); retry, or relax the schema"
            )
        return {"action": action, "retry_after_seconds": retry_s}

    def body(self) -> dict[str, Any]:
        return {
            "poolSize": self.pool_size,
            "combo": self.combo,
            "strategy": self.strategy,
            "attemptOrder": [a["target"] for a in self.attempted],
            "attempted": self.attempted,
            "excluded": self.excluded,
            "waitedMs": self.waited_ms,
            "terminalReason": self.terminal.value if self.terminal else None,
            "recoveryHint": self.hint(),
            **self._scores(),
        }

    def _scores(self) -> dict[str, Any]:
        if self.candidates is None:
            return {}
        return {"candidates": self.candidates, "weights": self.weights}

    def client_body(self) -> dict[str, Any]:
        """The view a client gets (see the module doc)."""
        return {
            "combo": self.combo,
            "strategy": self.strategy,
            "attemptOrder": [public_label(a["target"]) for a in self.attempted],
            "attempted": [
                {
                    "target": public_label(a["target"]),
                    "outcome": "ok" if a["outcome"] == "ok" else "failed",
                }
                for a in self.attempted
            ],
            "excluded": [
                {
                    "target": public_label(e["target"]),
                    "reason": public_reason(e["reason"]),
                    **({"retryAfterMs": e["retryAfterMs"]} if "retryAfterMs" in e else {}),
                }
                for e in self.excluded
            ],
            "waitedMs": self.waited_ms,
            "terminalReason": self.terminal.value if self.terminal else None,
            "recoveryHint": self.hint(),
        }

    def error(
        self, status: int, message: str, *, code: str, terminal: Terminal, **kw: Any
    ) -> ApiError:
        """An error that carries these diagnostics (body and headers) and its terminal reason."""
        self.terminal = terminal
        return self.attach(ApiError(status, message, code=code, **kw))

    def attach(self, err: ApiError) -> ApiError:
        """Give ``err`` these diagnostics (both views) and their headers (its own headers win)."""
        err.diagnostics = self.body()
        err.client_diagnostics = self.client_body()
        err.headers = {**self.headers(), **err.headers}
        return err

    def headers(self) -> dict[str, str]:
        out = {
            "x-fairgate-combo-attempts": str(len(self.attempted)),
            "x-fairgate-combo-excluded": str(len(self.excluded)),
        }
        if self.combo:
            out["x-fairgate-combo"] = self.combo
        if self.terminal:
            out["x-fairgate-combo-terminal"] = self.terminal.value
        return out


#: Exclusion reasons as a client sees them: whether waiting helps, not what is wrong upstream.
_PUBLIC_REASONS = {
    "cooldown": "cooling_down",
    "rate_limited": "cooling_down",
    "lockout": "cooling_down",
    "breaker_open": "unavailable",
    "permanent": "unavailable",
    "concurrency-full": "busy",
    "attempt-cap": "attempt_cap",
    "context-window": "context_window",  # the request's size: no secret of the gateway's
}


def public_label(label: str) -> str:
    """``provider/model@connection`` → ``provider/model`` (a target without a connection is
    already in that form)."""
    head, at, _ = label.rpartition("@")
    return head if at else label


def public_reason(reason: str) -> str:
    """A coarse reason code; the key's own quota reasons (``quota:fair-share``…) stay as they
    are: the 429 of a quota block names them anyway."""
    if reason.startswith("quota:"):
        return reason
    return _PUBLIC_REASONS.get(reason, "unavailable")
