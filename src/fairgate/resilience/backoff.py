"""Exponential backoff for connection cooldowns and model lockouts (SPEC §9). Pure.

A connection that keeps failing should be tried less and less often, but never forgotten for
long: the cooldown is ``base × 2^level`` capped at ``max_ms``, where ``base`` is 5 s for OAuth
connections (subscription accounts whose limits reset slowly and punish hammering) and 3 s for
API keys, and ``level`` counts the consecutive failures before this one (0 for the first).

When the upstream says how long to wait (``Retry-After``, a ``retryDelay``, a rate-limit reset)
that hint wins over the computed backoff: the provider knows its window, we only guess. A hint is
capped separately at ``max_hint_ms`` (one hour by default), longer than ``max_ms`` because a real
per-hour or per-day limit may legitimately ask for more than five minutes, but bounded so a bogus
value cannot take a connection out of service for days (an admin can always clear it).

Worked example (API key, no hints)::

    level:     0     1     2      3      4      5      6       7 …
    cooldown:  3 s   6 s   12 s   24 s   48 s   96 s   192 s   300 s (capped) …

An OAuth connection goes 5, 10, 20, 40, 80, 160, 300 s. A 429 carrying ``Retry-After: 20`` at
level 4 cools down for 20 s, not 48 s.

Cooldowns only ever grow: :func:`merge` keeps the later deadline and the higher level, so a short
cooldown computed by one request can never cut short the long one another request (or another
gateway replica) already set.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_APIKEY_BASE_MS",
    "DEFAULT_MAX_HINT_MS",
    "DEFAULT_MAX_MS",
    "DEFAULT_OAUTH_BASE_MS",
    "Cooldown",
    "merge",
    "next_cooldown_ms",
]

DEFAULT_OAUTH_BASE_MS = 5_000
DEFAULT_APIKEY_BASE_MS = 3_000
DEFAULT_MAX_MS = 300_000
DEFAULT_MAX_HINT_MS = 3_600_000
#: 2^30 × any base exceeds every sane cap; bounding the exponent keeps the arithmetic small.
_MAX_EXPONENT = 30


def next_cooldown_ms(
    level: int,
    auth_type: str,
    hint_ms: int | None,
    *,
    base_oauth: int = DEFAULT_OAUTH_BASE_MS,
    base_apikey: int = DEFAULT_APIKEY_BASE_MS,
    max_ms: int = DEFAULT_MAX_MS,
    max_hint_ms: int = DEFAULT_MAX_HINT_MS,
) -> int:
    """The cooldown for a failure at ``level`` (consecutive failures before it, from 0).

    A positive ``hint_ms`` wins, capped at ``max_hint_ms``; a missing, zero or negative hint
    ("retry now" on a 429 would invite a storm) falls back to the backoff. ``auth_type`` is
    ``"oauth"`` or anything else (API key).
    """
    if hint_ms is not None and hint_ms > 0:
        return min(hint_ms, max_hint_ms)
    base = base_oauth if auth_type == "oauth" else base_apikey
    exponent = min(max(level, 0), _MAX_EXPONENT)
    return max(0, min(base * (1 << exponent), max_ms))


@dataclass(frozen=True, slots=True)
class Cooldown:
    """A deadline (absolute epoch ms) with the backoff level that produced it and why.

    Used for connection cooldowns and model lockouts alike. The record outlives its deadline for
    a while (the stores' "level memory") so the next failure continues the backoff instead of
    starting over at the base; ``active`` tells whether it still blocks.
    """

    until_ms: int
    level: int
    reason: str

    def active(self, now_ms: int) -> bool:
        return self.until_ms > now_ms

    def remaining_ms(self, now_ms: int) -> int:
        return max(0, self.until_ms - now_ms)


def merge(existing: Cooldown | None, new: Cooldown) -> Cooldown:
    """Combine a stored cooldown with a new one without ever shortening it.

    The later deadline wins, and its reason with it; the level is the higher of the two, so a
    short hint cannot reset the backoff of a connection that has been failing for a while.
    """
    if existing is None:
        return new
    level = max(existing.level, new.level)
    if existing.until_ms >= new.until_ms:
        return Cooldown(existing.until_ms, level, existing.reason)
    return Cooldown(new.until_ms, level, new.reason)
