"""Charging a provider-reported global percent to keys (SPEC §4, [better]; issue 44).

Subscription providers report only "the account is at 37 % of its 5-hour window", in the
headers of each answer, and that reading already counts the request it answers. So a reading is
attributed when the request that carried it settles, with that request's own tokens counted:
its rise is split over the keys that used tokens since the previous reading *including the
request itself*, in proportion to those tokens (the old order — the rise charged before the
request's own tokens were counted — billed each rise to the previous caller). A drop means the
window rolled over: it starts a new baseline and charges nothing. A reading older than the one
already applied (a long stream settling after a shorter, later one) only adds its tokens.

**Unexplained rises go to the pool only.** Once a percent-per-token rate is known, a rise
larger than :data:`EXPLAINED_FACTOR` × rate × the tokens since the previous reading is use
from outside the gateway (the account owner's own Codex session, another tool): the keys are
charged what their tokens explain at most, and the rest is charged to nobody. The pool still
sees it: the provider's reading is the pool's fill (saturation signal), so every key's fair
share shrinks with it, but no key is refused for use it did not make.

**The percent estimate** that admission prices the next request with is a robust ratio:
each attributed rise gives one sample (explained percent ÷ tokens, the request's own
included); the rate is their exponential moving average (weight :data:`SMOOTHING`), a sample
more than :data:`MAX_STEP` × the current rate counting as that much, so one odd reading cannot
wedge the pool; and the estimate is bounded by the plan: no subscription window holds fewer
than :data:`PLAN_MIN_TOKENS` tokens, so a token is never priced above 100 % / that. The settlement
charges the real rise, whatever the estimate was.

Worked example: reading 10 % → 14 %; since then key A used 3,000 tokens and key B 1,000 → A is
charged 3 %, B 1 %, and the rate is 0.001 % a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "EXPLAINED_FACTOR",
    "MAX_STEP",
    "PLAN_MIN_TOKENS",
    "SMOOTHING",
    "PercentAttributor",
]

#: weight of a new sample in the moving average of the percent-per-token rate
SMOOTHING = 0.25
#: a sample counts at most this many times the current rate (and at least 1/this)
MAX_STEP = 4.0
#: a rise up to this many times what the rate explains is the keys'; beyond it, outside use
EXPLAINED_FACTOR = 3.0
#: the plan bound: a subscription window holds at least this many tokens (so the estimate
#: prices a token at most 100 % / PLAN_MIN_TOKENS = 0.01 % of it)
PLAN_MIN_TOKENS = 10_000.0
MAX_RATE = 100.0 / PLAN_MIN_TOKENS


@dataclass
class PercentAttributor:
    last_reading: float | None = None
    last_at_ms: int = -1
    tokens_since: dict[str, float] = field(default_factory=dict)
    #: the smoothed percent-per-token rate (0: none observed yet)
    percent_per_token: float = 0.0
    #: percent of the rises charged to nobody (use from outside the gateway), for the record
    unexplained: float = 0.0

    def add_tokens(self, key_id: str, tokens: float) -> None:
        if tokens > 0:
            self.tokens_since[key_id] = self.tokens_since.get(key_id, 0.0) + tokens

    def observe(self, reading: float, at_ms: int | None = None) -> dict[str, float]:
        """Feed a percent reading taken at ``at_ms`` (None: now, in order); returns the percent
        to charge each key. Call it after :meth:`add_tokens` of the request it answered."""
        if at_ms is not None:
            if at_ms < self.last_at_ms:
                return {}  # older than what was applied: its tokens wait for the next rise
            self.last_at_ms = at_ms
        prev = self.last_reading
        self.last_reading = reading
        if prev is None or reading < prev:
            self.tokens_since.clear()
            return {}
        delta = reading - prev
        total = sum(self.tokens_since.values())
        if delta <= 0 or total <= 0:
            return {}
        explained = delta
        if self.percent_per_token > 0:
            explained = min(delta, EXPLAINED_FACTOR * self.percent_per_token * total)
        self.unexplained += delta - explained
        charges = {k: explained * t / total for k, t in self.tokens_since.items()}
        self._learn(explained / total)
        self.tokens_since.clear()
        return charges

    def _learn(self, sample: float) -> None:
        rate = self.percent_per_token
        if rate <= 0:
            self.percent_per_token = sample
            return
        sample = min(max(sample, rate / MAX_STEP), rate * MAX_STEP)
        self.percent_per_token = (1 - SMOOTHING) * rate + SMOOTHING * sample

    def estimate(self, tokens: float) -> float:
        """The percent a request of ``tokens`` is expected to cost: the smoothed rate, bounded
        by the plan (:data:`MAX_RATE`)."""
        return tokens * min(self.percent_per_token, MAX_RATE)
